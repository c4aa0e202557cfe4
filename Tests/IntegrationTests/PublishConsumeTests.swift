import AMQP
import Foundation
import Synchronization
import Testing

extension BrokerIntegration {
@Suite("Publish and consume on a real broker", .timeLimit(.minutes(1)))
struct PublishConsumeTests {
    @Test func roundTripWithConfirmsKeepsBodyAndProperties() async throws {
        let connection = try await TestBroker.connect("roundtrip")
        let channel = try await connection.openChannel()
        let queue = TestBroker.uniqueName("roundtrip")
        try await channel.queueDeclare(queue, durable: false, autoDelete: false)
        try await channel.confirmSelect()

        let headers: FieldTable = [
            "x-string": "zoë", "x-int": 42, "x-bool": true,
            "x-nested": .table(["inner": .int32(-7), "list": .array(["a", .int64(2)])]),
        ]
        let properties = AMQPProperties(
            contentType: "application/json", contentEncoding: "utf-8", headers: headers, deliveryMode: 2,
            priority: 3, correlationID: "corr-1", replyTo: "frontdesk.replies", expiration: "60000",
            messageID: "msg-1", timestamp: 1_778_665_260, type: "frontdesk.test.v1", appID: "tests")
        let bodies = (0..<100).map { Data("{\"n\":\($0),\"text\":\"Zoë — ✓\"}".utf8) }
        let results = try await channel.publish(bodies.map {
            OutboundMessage(exchange: "", routingKey: queue, body: $0, properties: properties, mandatory: true)
        })
        #expect(results.allSatisfy { if case .success = $0 { true } else { false } })

        let consumer = try await channel.consume(queue: queue)
        let deliveries = try await consumer.first(100, timeout: .seconds(10))
        #expect(deliveries.map(\.body) == bodies)
        let first = try #require(deliveries.first)
        #expect(first.properties == properties)
        #expect(first.routingKey == queue)
        #expect(first.exchange == "")
        #expect(first.redelivered == false)
        try deliveries.last!.ack(multiple: true)

        #expect(try await channel.queueDelete(queue) == 0)
        await connection.close()
    }

    /// What any producer may send and rabbitmq-c's `amqp_read_message` could
    /// not read (an empty key), or reading would follow down the stack (a table
    /// nested as deep as a frame allows): delivered, and returned, whole or cut
    /// at `FieldTable.maxDepth`, with the connection still up.
    @Test func headersWithEmptyKeysAndDeepNestingArriveAndReturn() async throws {
        let connection = try await TestBroker.connect("odd-headers")
        let channel = try await connection.openChannel()
        let queue = TestBroker.uniqueName("odd-headers")
        try await channel.queueDeclare(queue, durable: false, autoDelete: false)
        try await channel.confirmSelect()
        var deep = FieldValue.string("leaf")
        for _ in 0..<40 { deep = .table(["": deep]) }
        let headers: FieldTable = ["": "empty key", "x-deep": deep, "x-after": 1]
        let message = OutboundMessage(
            exchange: "", routingKey: queue, body: Data("odd".utf8), properties: AMQPProperties(headers: headers), mandatory: true)
        let unroutable = OutboundMessage(
            exchange: "amq.direct", routingKey: "nobody-binds-this", body: Data("back".utf8),
            properties: AMQPProperties(headers: headers), mandatory: true)
        let results = try await channel.publish([message, unroutable, message])
        #expect((try? results[0].get()) != nil)
        guard case .failure(let error) = results[1] else {
            Issue.record("the unroutable message was not returned")
            return
        }
        #expect(error.code == .returned && error.replyCode == 312)

        let consumer = try await channel.consume(queue: queue)
        let deliveries = try await consumer.first(2, timeout: .seconds(10))
        #expect(deliveries.count == 2)
        for d in deliveries {
            #expect(d.body == Data("odd".utf8))
            let got = try #require(d.properties.headers)
            #expect(got[""] == .string("empty key"))
            #expect(got["x-after"] == .int64(1))
            // x-deep is depth 1; tables below it down to maxDepth are kept, the next is void.
            var levels = 1
            var v = try #require(got["x-deep"])
            while case .table(let t) = v, let inner = t[""] {
                v = inner
                levels += 1
            }
            #expect(levels == FieldTable.maxDepth + 1)
            #expect(v == .void)
        }
        try deliveries.last!.ack(multiple: true)
        #expect(connection.isOpen)
        #expect(try await channel.queueDelete(queue) == 0)
        await connection.close()
    }

    /// A header key over 255 bytes (nested too) cannot be a short string:
    /// rabbitmq-c would write its length cut to one byte and the broker read
    /// a corrupt frame. That message alone is refused; the rest of its window
    /// arrives and the connection stays up.
    @Test func aHeaderKeyLongerThanAShortStringIsRefusedAlone() async throws {
        let connection = try await TestBroker.connect("long-key")
        let channel = try await connection.openChannel()
        let queue = TestBroker.uniqueName("long-key")
        try await channel.queueDeclare(queue, durable: false, autoDelete: false)
        try await channel.confirmSelect()
        let long = String(repeating: "k", count: 256)
        let good = OutboundMessage(exchange: "", routingKey: queue, body: Data("good".utf8), properties: AMQPProperties(headers: ["k": 1]))
        let top = OutboundMessage(exchange: "", routingKey: queue, body: Data("top".utf8), properties: AMQPProperties(headers: [long: 1]))
        let nested = OutboundMessage(
            exchange: "", routingKey: queue, body: Data("nested".utf8), properties: AMQPProperties(headers: ["n": .array([.table([long: 1])])]))
        let results = try await channel.publish([good, top, good, nested, good])
        for i in [0, 2, 4] { #expect((try? results[i].get()) != nil) }
        for i in [1, 3] {
            guard case .failure(let error) = results[i] else {
                Issue.record("message \(i) with a 256-byte key was published")
                continue
            }
            #expect(error.code == .invalidMessage)
        }
        let consumer = try await channel.consume(queue: queue)
        let deliveries = try await consumer.first(3, timeout: .seconds(10))
        #expect(deliveries.map(\.body) == Array(repeating: Data("good".utf8), count: 3))
        try deliveries.last?.ack(multiple: true)
        #expect(connection.isOpen)
        #expect(try await channel.queueDelete(queue) == 0)
        await connection.close()
    }

    @Test func unroutableMandatoryMessageIsReturnedToThePublisher() async throws {
        let connection = try await TestBroker.connect("return")
        let channel = try await connection.openChannel()
        try await channel.confirmSelect()
        // A routable message before and after: only the unroutable one fails.
        let queue = TestBroker.uniqueName("return")
        try await channel.queueDeclare(queue, durable: false, autoDelete: true)
        let results = try await channel.publish([
            OutboundMessage(exchange: "", routingKey: queue, body: Data("a".utf8), mandatory: true),
            OutboundMessage(exchange: "amq.direct", routingKey: "nobody-binds-this", body: Data("b".utf8), mandatory: true),
            OutboundMessage(exchange: "", routingKey: queue, body: Data("c".utf8), mandatory: true),
        ])
        #expect((try? results[0].get()) != nil)
        #expect((try? results[2].get()) != nil)
        guard case .failure(let error) = results[1] else {
            Issue.record("the unroutable message was not returned")
            return
        }
        #expect(error.code == .returned)
        #expect(error.replyCode == 312)
        await connection.close()
    }

    @Test func windowsPublishedWithoutWaitingAreConfirmedInOrder() async throws {
        let connection = try await TestBroker.connect("pipelined")
        let channel = try await connection.openChannel()
        try await channel.confirmSelect()
        let queue = TestBroker.uniqueName("pipelined")
        try await channel.queueDeclare(queue, durable: false, autoDelete: false)
        func message(_ n: Int, to key: String = queue) -> OutboundMessage {
            OutboundMessage(exchange: key == queue ? "" : "amq.direct", routingKey: key, body: Data("\(n)".utf8), mandatory: true)
        }
        // Three windows handed over before any confirm is awaited; the
        // second holds an unroutable message, which alone fails.
        let first = channel.publishWithoutWaiting((0..<50).map { message($0) })
        let second = channel.publishWithoutWaiting([message(50), message(51, to: "nobody-binds-this"), message(52)])
        let third = channel.publishWithoutWaiting((53..<100).map { message($0) })
        let empty = channel.publishWithoutWaiting([])
        #expect(try await empty.results().isEmpty)
        let thirdResults = try await third.results()
        let secondResults = try await second.results()
        #expect(try await first.results().count == 50)
        #expect(thirdResults.count == 47)
        #expect(thirdResults.allSatisfy { if case .success = $0 { true } else { false } })
        #expect((try? secondResults[0].get()) != nil && (try? secondResults[2].get()) != nil)
        guard case .failure(let error) = secondResults[1] else {
            Issue.record("the unroutable message was not returned")
            return
        }
        #expect(error.code == .returned)

        // The broker has them in the order they were handed over.
        let consumer = try await channel.consume(queue: queue)
        let bodies = try await consumer.first(99, timeout: .seconds(10)).map { String(decoding: $0.body, as: UTF8.self) }
        #expect(bodies == (0..<100).filter { $0 != 51 }.map(String.init))

        // On a closed channel the confirms fail instead of hanging.
        await channel.close()
        await #expect(throws: AMQPError.self) { try await channel.publishWithoutWaiting([message(100)]).results() }
        await connection.close()
    }

    @Test func aWindowWithBodiesLargerThanAFrameArrivesWhole() async throws {
        let connection = try await TestBroker.connect("big-bodies")
        let channel = try await connection.openChannel()
        try await channel.confirmSelect()
        let queue = TestBroker.uniqueName("big-bodies")
        try await channel.queueDeclare(queue, durable: false, autoDelete: false)
        // Around the 128 KiB frame size: empty, one byte, exactly a frame's
        // payload, one more, and several frames, in one window.
        let sizes = [0, 1, 131_064, 131_065, 400_000, 17]
        let bodies = sizes.enumerated().map { n, size in Data((0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ n) }) }
        let properties = AMQPProperties(
            contentType: "application/octet-stream", headers: ["x-n": 1, "x-text": "Zoë"], deliveryMode: 2,
            correlationID: "c", messageID: "m", type: "frontdesk.test.big")
        let results = try await channel.publish(bodies.map {
            OutboundMessage(exchange: "", routingKey: queue, body: $0, properties: properties, mandatory: true)
        })
        #expect(results.allSatisfy { if case .success = $0 { true } else { false } })
        let consumer = try await channel.consume(queue: queue)
        let deliveries = try await consumer.first(sizes.count, timeout: .seconds(10))
        #expect(deliveries.map(\.body.count) == sizes)
        #expect(deliveries.map(\.body) == bodies)
        #expect(deliveries.allSatisfy { $0.properties == properties })
        try deliveries.last!.ack(multiple: true)
        await connection.close()
    }

    @Test func aConsumerWithAClosureGetsEveryDeliveryAndHearsTheEnd() async throws {
        let connection = try await TestBroker.connect("closure-consumer")
        let channel = try await connection.openChannel()
        try await channel.confirmSelect()
        let queue = TestBroker.uniqueName("closure-consumer")
        try await channel.queueDeclare(queue, durable: false, autoDelete: false)
        let received = Mutex<[String]>([])
        let (ended, end) = AsyncStream<AMQPError?>.makeStream()
        let consumerChannel = try await connection.openChannel()
        _ = try await consumerChannel.consume(
            queue: queue,
            deliver: { d in
                received.withLock { $0.append(String(decoding: d.body, as: UTF8.self)) }
                try? d.ack()
            },
            finished: { error in
                end.yield(error)
                end.finish()
            })
        for result in try await channel.publish((0..<50).map { OutboundMessage(exchange: "", routingKey: queue, body: Data("\($0)".utf8)) }) {
            try result.get()
        }
        let deadline = ContinuousClock.now + .seconds(10)
        while received.withLock({ $0.count }) < 50, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(received.withLock { $0 } == (0..<50).map(String.init))
        // The broker deleting the queue cancels the consumer: `finished` hears it, with an error.
        _ = try await channel.queueDelete(queue)
        var iterator = ended.makeAsyncIterator()
        let error = await iterator.next()
        #expect(error != nil && error! != nil)
        await connection.close()
    }
}
}
