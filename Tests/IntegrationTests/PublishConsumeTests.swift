import AMQP
import Foundation
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
}
}
