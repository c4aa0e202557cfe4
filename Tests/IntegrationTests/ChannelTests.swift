import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    @Suite("Queues, prefetch and broker errors", .timeLimit(.minutes(1)))
    struct ChannelTests {
        @Test func prefetchLimitsUnackedDeliveries() async throws {
            let connection = try await TestBroker.connect("prefetch")
            defer { Task { await connection.close() } }
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("prefetch")
            try await channel.queueDeclare(queue, durable: false, autoDelete: true)
            try await channel.confirmSelect()
            _ = try await channel.publish((0..<20).map {
                OutboundMessage(exchange: "", routingKey: queue, body: Data("\($0)".utf8))
            })
            try await channel.qos(prefetchCount: 5)
            let consumer = try await channel.consume(queue: queue)
            var iterator = consumer.makeAsyncIterator()
            var received: [AMQPDelivery] = []
            for _ in 0..<5 { received.append(try #require(try await iterator.next())) }
            // With 5 unacked, the broker must hold the rest back.
            try await waitUntil("15 messages wait in the queue") {
                try await connection.withChannel { try await $0.queueDeclare(queue, passive: true) }.messageCount == 15
            }
            // Acking releases the next ones.
            try received.last!.ack(multiple: true)
            for _ in 0..<5 { received.append(try #require(try await iterator.next())) }
            #expect(received.map { String(decoding: $0.body, as: UTF8.self) } == (0..<10).map(String.init))
        }

        @Test func passiveDeclareReportsMessageAndConsumerCounts() async throws {
            let connection = try await TestBroker.connect("counts")
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("counts")
            try await channel.queueDeclare(queue, durable: false)
            try await channel.confirmSelect()
            for i in 0..<3 { try await channel.publish(exchange: "", routingKey: queue, body: Data("\(i)".utf8)) }
            var counts = try await channel.queueDeclare(queue, passive: true)
            #expect(counts.messageCount == 3)
            #expect(counts.consumerCount == 0)

            let other = try await connection.openChannel()
            try await other.qos(prefetchCount: 1)
            let consumer = try await other.consume(queue: queue)
            counts = try await channel.queueDeclare(queue, passive: true)
            #expect(counts.consumerCount == 1)
            try await consumer.cancel()
            counts = try await channel.queueDeclare(queue, passive: true)
            #expect(counts.consumerCount == 0)
            try await channel.queueDelete(queue)
            await connection.close()
        }

        @Test func quorumQueueDeclareAndTypedBrokerErrors() async throws {
            let connection = try await TestBroker.connect("errors")
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("quorum")
            let arguments: FieldTable = [
                "x-queue-type": "quorum", "x-dead-letter-exchange": "frontdesk.test.dlx",
                "x-delivery-limit": 5, "x-single-active-consumer": true,
            ]
            try await channel.queueDeclare(queue, arguments: arguments)
            // Declaring again with the same arguments is idempotent.
            try await channel.queueDeclare(queue, arguments: arguments)

            // Different arguments: 406 PRECONDITION_FAILED, and the channel is closed.
            await #expect {
                try await channel.queueDeclare(queue, arguments: ["x-queue-type": "classic"])
            } throws: { error in
                let e = error as? AMQPError
                return e?.code == .channelClosed && e?.replyCode == 406 && e?.isRetryable == false
            }
            await #expect(throws: AMQPError.self) { try await channel.queueDeclare(queue, passive: true) }

            // A missing queue: 404 NOT_FOUND on a fresh channel.
            let fresh = try await connection.openChannel()
            await #expect {
                try await fresh.queueDeclare(TestBroker.uniqueName("missing"), passive: true)
            } throws: { error in
                (error as? AMQPError)?.replyCode == 404 && "\(error)".contains("NOT_FOUND")
            }
            // The connection survives channel errors.
            let third = try await connection.openChannel()
            let counts = try await third.queueDeclare(queue, passive: true)
            #expect(counts.messageCount == 0)
            try await third.queueDelete(queue)
            #expect(connection.isOpen)
            await connection.close()
        }

        @Test func publishingToAMissingExchangeFailsTheConfirm() async throws {
            let connection = try await TestBroker.connect("missing-exchange")
            let channel = try await connection.openChannel()
            try await channel.confirmSelect()
            await #expect {
                try await channel.publish(exchange: TestBroker.uniqueName("nope"), routingKey: "x", body: Data())
            } throws: { error in
                (error as? AMQPError)?.replyCode == 404
            }
            await connection.close()
        }

        /// Our channel.close crossing the broker's (a publish to a missing
        /// exchange flushed just before it): the broker's close is answered,
        /// so the channel's number opens again. Unanswered, the broker kept it
        /// closing and ignored the next channel.open on it, which waited out
        /// the RPC timeout and ended the connection.
        @Test func aCloseThatCrossesTheBrokersCloseLeavesItsNumberUsable() async throws {
            var url = TestBroker.url
            url.channelMax = 3
            let connection = try await AMQPConnection.connect(TestBroker.configuration("crossed-close", url: url))
            defer { Task { await connection.close() } }
            let first = try await connection.openChannel()
            _ = first.publishWithoutWaiting([OutboundMessage(exchange: TestBroker.uniqueName("nope"), routingKey: "x", body: Data())])
            await first.close()
            // Numbers 2 and 3, then the first one's again.
            let others = [try await connection.openChannel(), try await connection.openChannel()]
            let started = ContinuousClock.now
            let reused = try await connection.openChannel()
            #expect(reused.id == first.id)
            #expect(ContinuousClock.now - started < .seconds(2))
            try await reused.queueDeclare(TestBroker.uniqueName("crossed"), durable: false, exclusive: true)
            #expect(connection.isOpen)
            for c in others { await c.close() }
        }

        @Test func exchangesBindUnbindPurgeAndDelete() async throws {
            let connection = try await TestBroker.connect("exchanges")
            let channel = try await connection.openChannel()
            let exchange = TestBroker.uniqueName("topic")
            let queue = TestBroker.uniqueName("bound")
            try await channel.exchangeDeclare(exchange, type: "topic", durable: false, autoDelete: false)
            try await channel.queueDeclare(queue, durable: false)
            try await channel.queueBind(queue, exchange: exchange, routingKey: "status.yemaya.#")
            try await channel.confirmSelect()
            try await channel.publish(exchange: exchange, routingKey: "status.yemaya.board-prep.sending", body: Data("1".utf8))
            try await channel.publish(exchange: exchange, routingKey: "status.acme.ops.sending", body: Data("2".utf8))
            #expect(try await channel.queueDeclare(queue, passive: true).messageCount == 1)
            #expect(try await channel.queuePurge(queue) == 1)
            try await channel.queueUnbind(queue, exchange: exchange, routingKey: "status.yemaya.#")
            try await channel.publish(exchange: exchange, routingKey: "status.yemaya.board-prep.sending", body: Data("3".utf8))
            #expect(try await channel.queueDeclare(queue, passive: true).messageCount == 0)
            try await channel.queueDelete(queue)
            try await channel.exchangeDelete(exchange)
            await #expect(throws: AMQPError.self) {
                try await connection.withChannel { try await $0.exchangeDeclare(exchange, type: "topic", passive: true) }
            }
            await connection.close()
        }

        /// A stream with `count` small messages, published and confirmed.
        private func stream(_ name: String, count: Int, on channel: AMQPChannel) async throws -> String {
            let queue = TestBroker.uniqueName(name)
            try await channel.queueDeclare(queue, arguments: ["x-queue-type": "stream"])
            try await channel.confirmSelect()
            let results = try await channel.publish((0..<count).map {
                OutboundMessage(exchange: "", routingKey: queue, body: Data("\($0)".utf8))
            })
            #expect(results.allSatisfy { (try? $0.get()) != nil })
            return queue
        }

        /// Deletes `queue` on a connection of its own (the test's may have ended).
        private func deleteLater(_ queue: String) async {
            guard let cleanup = try? await TestBroker.connect("stream-cleanup") else { return }
            _ = try? await cleanup.openChannel().queueDelete(queue)
            await cleanup.close()
        }

        /// A stream consumer cancelled while the broker still sends it
        /// deliveries: those that come after the cancel are not handed back
        /// with basic.reject, which RabbitMQ answers by closing the whole
        /// connection (540). Four partitions replaying one stream at once
        /// hit this; the term whose connection it closed waited 30 s.
        @Test func aStreamConsumerCancelledMidFlowKeepsItsConnection() async throws {
            let connection = try await TestBroker.connect("stream-cancel")
            defer { Task { await connection.close() } }
            let setup = try await connection.openChannel()
            let queue = try await stream("stream-cancel", count: 2000, on: setup)
            defer { Task { await deleteLater(queue) } }
            let channel = try await connection.openChannel()
            try await channel.qos(prefetchCount: 2000)
            let consumer = try await channel.consume(queue: queue, arguments: [AMQPStream.offsetArgument: "first"])
            var iterator = consumer.makeAsyncIterator()
            let first = try #require(try await iterator.next())
            #expect(String(decoding: first.body, as: UTF8.self) == "0")
            try await consumer.cancel()
            // A round trip after the cancel, on another channel: the broker
            // reads it after whatever the cancel's stragglers caused.
            let counts = try await setup.queueDeclare(queue, passive: true)
            #expect(counts.consumerCount == 0)
            #expect(connection.isOpen)
            // The channel goes on too: a new consumer reads the stream from its start.
            let again = try await channel.consume(queue: queue, arguments: [AMQPStream.offsetArgument: "first"])
            var next = again.makeAsyncIterator()
            #expect(try await next.next().map { String(decoding: $0.body, as: UTF8.self) } == "0")
            #expect(connection.isOpen)
        }

        /// A channel close whose answer is the connection's end (here a
        /// reject sent to a stream just before it) ends the connection at
        /// once: it did not look closed until the broker gave up waiting for
        /// our close-ok, 30 s later.
        @Test func aChannelCloseAnsweredByTheConnectionsEndEndsItAtOnce() async throws {
            let connection = try await TestBroker.connect("close-answered")
            defer { Task { await connection.close() } }
            let setup = try await connection.openChannel()
            let queue = try await stream("close-answered", count: 1, on: setup)
            defer { Task { await deleteLater(queue) } }
            let channel = try await connection.openChannel()
            try await channel.qos(prefetchCount: 10)
            let consumer = try await channel.consume(queue: queue, arguments: [AMQPStream.offsetArgument: "first"])
            var iterator = consumer.makeAsyncIterator()
            let delivery = try #require(try await iterator.next())
            // Buffered, it goes out with the close, which the broker answers with connection.close.
            try delivery.reject(requeue: true)
            await channel.close()
            try await waitUntil("the connection is seen closed", within: .seconds(5)) { !connection.isOpen }
        }
    }
}

extension BrokerIntegration {
    @Suite("Settling deliveries and broker alarms", .timeLimit(.minutes(1)))
    struct SettlementTests {
        /// A message AMQP cannot carry (a routing key past 255 bytes) is
        /// refused alone: the rest of its window is published and confirmed,
        /// and the connection and its other channels go on.
        @Test func aMessageAMQPCannotCarryIsRefusedAloneAndTheConnectionGoesOn() async throws {
            let connection = try await TestBroker.connect("unencodable")
            defer { Task { await connection.close() } }
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("carried")
            try await channel.queueDeclare(queue, durable: false, autoDelete: false)
            try await channel.confirmSelect()
            let results = try await channel.publish([
                OutboundMessage(exchange: "", routingKey: queue, body: Data("before".utf8)),
                OutboundMessage(exchange: "", routingKey: String(repeating: "k", count: 300), body: Data("too long".utf8)),
                OutboundMessage(exchange: "", routingKey: queue, body: Data("after".utf8),
                    properties: AMQPProperties(messageID: String(repeating: "m", count: 256))),
                OutboundMessage(exchange: "", routingKey: queue, body: Data("last".utf8)),
            ])
            #expect(results.count == 4)
            guard results.count == 4 else { return }
            if case .failure(let e) = results[1] { #expect(e.code == .invalidMessage) } else { Issue.record("a 300-byte key was published") }
            if case .failure(let e) = results[2] { #expect(e.code == .invalidMessage) } else { Issue.record("a 256-byte message id was published") }
            for i in [0, 3] {
                if case .failure(let e) = results[i] { Issue.record("message \(i) failed: \(e)") }
            }
            // The same channel and another one still publish.
            try await channel.publish(exchange: "", routingKey: queue, body: Data("again".utf8))
            let other = try await connection.openChannel()
            try await other.confirmSelect()
            try await other.publish(exchange: "", routingKey: queue, body: Data("other".utf8))
            #expect(try await channel.queueDeclare(queue, passive: true).messageCount == 4)
            try await channel.queueDelete(queue)
        }

        /// Acks and publishes are written once a turn of the connection's
        /// loop; whatever follows them through rabbitmq-c itself in the same
        /// turn (a channel or connection close) must reach the broker after them.
        @Test func bufferedAcksAndPublishesReachTheBrokerBeforeACloseThatFollows() async throws {
            let count = 200
            let queue = TestBroker.uniqueName("ordered")
            let setup = try await TestBroker.connect("ordered-setup")
            defer { Task { await setup.close() } }
            let control = try await setup.openChannel()
            try await control.queueDeclare(queue, durable: false)

            // Confirm-mode publishes (buffered until the turn ends), then the
            // connection's close, from one job on the connection's thread: the
            // publishes and the close come to the loop in the same turn.
            let publisher = try await TestBroker.connect("ordered-publish")
            let confirming = try await publisher.openChannel()
            try await confirming.confirmSelect()
            let messages = (0..<count).map {
                OutboundMessage(exchange: "", routingKey: queue, body: Data("\($0)".utf8))
            }
            await withTaskExecutorPreference(publisher.executor) {
                _ = confirming.publishWithoutWaiting(messages)
                await publisher.close()
            }
            try await waitUntil("all \(count) publishes written before the close are in the queue") {
                try await control.queueDeclare(queue, passive: true).messageCount == UInt32(count)
            }

            // Acks of every delivery, then the channel's close, again from one
            // job: an ack written after the close would leave its message to be
            // requeued.
            let consumer = try await TestBroker.connect("ordered-ack")
            let channel = try await consumer.openChannel()
            try await channel.qos(prefetchCount: UInt16(count))
            var iterator = try await channel.consume(queue: queue).makeAsyncIterator()
            var deliveries: [AMQPDelivery] = []
            for _ in 0..<count { deliveries.append(try #require(try await iterator.next())) }
            let received = deliveries
            try await withTaskExecutorPreference(consumer.executor) {
                for d in received { try d.ack() }
                await channel.close()
            }
            // An ack written after the close would also be a frame on a closed
            // channel, which the broker answers by closing the connection.
            let after = try await consumer.withChannel { try await $0.queueDeclare(queue, passive: true) }
            #expect(after.messageCount == 0)
            #expect(try await control.queueDeclare(queue, passive: true).messageCount == 0)
            await consumer.close()
            try await control.queueDelete(queue)
        }

        @Test func rejectDeadLettersAndNackRequeues() async throws {
            let connection = try await TestBroker.connect("settle")
            let channel = try await connection.openChannel()
            let dlx = TestBroker.uniqueName("dlx"), dlq = TestBroker.uniqueName("dlq"), queue = TestBroker.uniqueName("work")
            try await channel.exchangeDeclare(dlx, type: "fanout", durable: false, autoDelete: false)
            try await channel.queueDeclare(dlq, durable: false)
            try await channel.queueBind(dlq, exchange: dlx, routingKey: "")
            try await channel.queueDeclare(queue, durable: false, arguments: ["x-dead-letter-exchange": .string(dlx)])
            try await channel.confirmSelect()
            try await channel.publish(exchange: "", routingKey: queue, body: Data("requeue me".utf8))
            try await channel.publish(exchange: "", routingKey: queue, body: Data("dead letter me".utf8))
            try await channel.qos(prefetchCount: 1)
            var iterator = try await channel.consume(queue: queue).makeAsyncIterator()
            let first = try #require(try await iterator.next())
            #expect(!first.redelivered)
            try first.nack(requeue: true)
            let again = try #require(try await iterator.next())
            #expect(again.body == first.body)
            #expect(again.redelivered)
            try again.ack()
            let second = try #require(try await iterator.next())
            try second.reject(requeue: false)
            try await waitUntil("the rejected message is dead-lettered") { try await channel.queueDeclare(dlq, passive: true).messageCount == 1 }
            for q in [queue, dlq] { try await channel.queueDelete(q) }
            try await channel.exchangeDelete(dlx)
            await connection.close()
        }

        /// With `republishAfterMs` 0 every repeatable message still waiting at
        /// a confirm sweep is published again: each copy reaches the queue,
        /// and each message's result is one success.
        @Test func overdueRepeatableMessagesArePublishedAgainAndSettleOnce() async throws {
            var configuration = TestBroker.configuration("republish")
            configuration.republishAfterMs = 0
            let connection = try await AMQPConnection.connect(configuration)
            defer { Task { await connection.close() } }
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("republish")
            try await channel.queueDeclare(queue, durable: false, autoDelete: false)
            try await channel.confirmSelect()
            var published = 0
            try await waitUntil("some messages were published again", within: .seconds(20)) {
                let window = (0..<50).map { i in
                    OutboundMessage(exchange: "", routingKey: queue, body: Data("\(published + i)".utf8), repeatable: true)
                }
                let results = try await channel.publish(window)
                #expect(results.allSatisfy { if case .success = $0 { true } else { false } })
                published += window.count
                return connection.republishedMessages > 0
            }
            // Every copy is confirmed or settled by the time its batch is.
            try await waitUntil("the queue holds each message and each copy") {
                try await channel.queueDeclare(queue, passive: true).messageCount == UInt32(published + connection.republishedMessages)
            }
            var seen = Set<String>()
            var iterator = try await channel.consume(queue: queue, noAck: true).makeAsyncIterator()
            for _ in 0..<(published + connection.republishedMessages) {
                let got = try #require(try await iterator.next())
                seen.insert(String(decoding: got.body, as: UTF8.self))
            }
            #expect(seen == Set((0..<published).map(String.init)))
            try await channel.queueDelete(queue)
        }

        @Test func aBlockedBrokerFailsPublishesWithATypedError() async throws {
            var configuration = TestBroker.configuration("blocked")
            configuration.confirmTimeoutMs = 1500
            let connection = try await AMQPConnection.connect(configuration)
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("blocked")
            try await channel.queueDeclare(queue, durable: false, autoDelete: true)
            try await channel.confirmSelect()
            try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.000001"])
            defer { _ = try? TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"]) }
            // The first publish after the alarm is held by the broker: it must
            // fail by itself (blocked, or no confirm in time), never hang.
            var failure: AMQPError?
            try await waitUntil("a publish fails", within: .seconds(10)) {
                do {
                    try await channel.publish(exchange: "", routingKey: queue, body: Data("x".utf8))
                    return false
                } catch let error as AMQPError {
                    failure = error
                    return true
                }
            }
            let error = try #require(failure)
            #expect(error.code == .connectionBlocked || error.code == .timeout)
            #expect(error.isRetryable)
            try await waitUntil("the connection knows it is blocked") { connection.blockedReason != nil }
            _ = try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"])
            try await waitUntil("the connection knows it is unblocked") { connection.blockedReason == nil }
            await connection.close()
        }
    }
}
