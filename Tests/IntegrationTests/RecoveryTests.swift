import AMQP
import Foundation
import Synchronization
import Testing

extension BrokerIntegration {
    @Suite("Recovery after the broker goes away", .timeLimit(.minutes(2)))
    struct RecoveryTests {
        /// A client declaring `queue` (quorum); `onRestartFailure` runs at each
        /// `consumerRestartFailed` (a broker's cancel, a failed restart).
        func client(_ name: String, queue: String, onRestartFailure: (@Sendable () -> Void)? = nil) -> AMQPClient {
            var configuration = AMQPClient.Configuration(connection: TestBroker.configuration(name))
            configuration.reconnectBackoff = Backoff(baseMs: 100, maxMs: 1000)
            return AMQPClient(configuration: configuration, topology: { channel in
                try await channel.queueDeclare(queue, arguments: ["x-queue-type": "quorum"])
            }, onEvent: { event in
                if case .consumerRestartFailed = event { onRestartFailure?() }
            })
        }

        @Test func consumerResumesAfterABrokerRestartAndNoMessageIsLost() async throws {
            let queue = TestBroker.uniqueName("recovery")
            let client = client("recovery", queue: queue)
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            let deliveries = await client.consume(ConsumerSpecification(queue: queue, prefetchCount: 10))

            // Half before the restart, half after; every one must arrive and be acked.
            let persistent = AMQPProperties(deliveryMode: 2)
            for i in 0..<20 {
                try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("\(i)".utf8), properties: persistent))
            }
            var seen = Set<String>()
            var iterator = deliveries.makeAsyncIterator()
            for _ in 0..<10 {
                let d = try #require(await iterator.next())
                seen.insert(String(decoding: d.body, as: UTF8.self))
                try d.ack()
            }

            let states = client.stateUpdates()
            try TestBroker.script(["restart"])
            // The client must notice, then come back by itself.
            var sawReconnecting = false
            for await s in states {
                if case .reconnecting = s { sawReconnecting = true }
                if sawReconnecting, s == .connected { break }
            }
            #expect(sawReconnecting)
            for i in 20..<30 {
                try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("\(i)".utf8), properties: persistent))
            }
            // Unacked ones come again after the restart: collect until all 30 are seen.
            while seen.count < 30 {
                let d = try #require(await iterator.next())
                seen.insert(String(decoding: d.body, as: UTF8.self))
                try? d.ack()
            }
            #expect(seen == Set((0..<30).map(String.init)))
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
            #expect(client.connectionState == .closed)
        }

        @Test func clientReconnectsAfterTheBrokerClosesItsConnection() async throws {
            let queue = TestBroker.uniqueName("forced")
            let client = client("forced-close-\(UUID().uuidString.prefix(6))", queue: queue)
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            let states = client.stateUpdates()
            try TestBroker.script(["ctl", "close_all_connections", "test: forced close"])
            var sawReconnecting = false
            for await s in states {
                if case .reconnecting = s { sawReconnecting = true }
                if sawReconnecting, s == .connected { break }
            }
            // The topology was declared again: the queue is there and usable.
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("after".utf8), mandatory: true))
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
        }

        /// A consumer the broker cancelled (its queue deleted) starts again
        /// once its queue is back, however long that takes, on a new channel;
        /// the old channel is closed. One failed try used to be the last (the
        /// consumer stayed silent until the next connection), and each
        /// restart kept its old channel open.
        @Test func aConsumerWhoseQueueWasDeletedResumesWhenItIsBackAndKeepsNoOldChannel() async throws {
            final class Seen: Sendable {
                let bodies = Mutex<[String]>([])
                let restartFailures = Atomic<Int>(0)
                let starts = Atomic<Int>(0)
            }
            let seen = Seen()
            let queue = TestBroker.uniqueName("cancelled")
            let name = "cancelled-\(UUID().uuidString.prefix(6))"
            let client = client(name, queue: queue) { seen.restartFailures.add(1, ordering: .relaxed) }
            func channels() throws -> Int? {
                try TestBroker.script(["ctl", "list_connections", "-q", "channels", "client_properties"])
                    .split(separator: "\n").first { $0.contains("frontdesk-test:\(name)") }
                    .flatMap { Int($0.prefix { $0 != "\t" }) }
            }
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            // A start asks for its arguments (the gateway begins its catch-up there): only starts that go ahead do.
            let specification = ConsumerSpecification(queue: queue, prefetchCount: 10, argumentsOnStart: {
                seen.starts.add(1, ordering: .relaxed)
                return nil
            })
            let stop = await client.consume(specification, deliver: { d in
                seen.bodies.withLock { $0.append(String(decoding: d.body, as: UTF8.self)) }
                try? d.ack()
            }, ended: {})
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("before".utf8)))
            try await waitUntil("the first message is consumed") { seen.bodies.withLock { $0 } == ["before"] }
            let before = try #require(try channels())
            _ = try await client.withChannel { try await $0.queueDelete(queue) }
            // The broker's cancel, then at least two tries that find no queue.
            // (Declared again at once, a quorum queue's consumer may get no cancel at all.)
            try await waitUntil("the cancel and two failed restarts") { seen.restartFailures.load(ordering: .relaxed) >= 3 }
            #expect(seen.starts.load(ordering: .relaxed) == 1, "no start went ahead while the queue was away")
            try await client.withChannel { _ = try await $0.queueDeclare(queue, arguments: ["x-queue-type": "quorum"]) }
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("after".utf8), mandatory: true))
            try await waitUntil("the consumer takes the message sent once the queue is back") {
                seen.bodies.withLock { $0 } == ["before", "after"]
            }
            try await waitUntil("the connection is back to its \(before) channels") { try channels() == before }
            #expect(seen.starts.load(ordering: .relaxed) == 2)
            await stop()
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
        }

        /// A consumer stopped while it starts again (its queue back after the
        /// broker's cancel, or on a new connection) keeps nothing: its stop
        /// found no consumer to cancel, so the start's channel is closed,
        /// nothing reaches the consumer after its end (not what waited in the
        /// queue, handed to the start at once), and messages stay queued. The start used to leave a consumer
        /// running that took the queue's messages for a caller that had gone.
        @Test(arguments: ["its queue deleted", "a new connection"])
        func aConsumerStoppedWhileItStartsAgainTakesNothing(_ how: String) async throws {
            final class Seen: Sendable {
                let bodies = Mutex<[String]>([])
                let starts = Atomic<Int>(0)
                let ended = Atomic<Bool>(false)
                let cancels = Atomic<Int>(0)
                let sentWhileStarting = Atomic<Bool>(false)
                let stop = Mutex<(@Sendable () async -> Void)?>(nil)
            }
            let seen = Seen()
            let queue = TestBroker.uniqueName("stopped-start")
            let name = "stopped-start-\(UUID().uuidString.prefix(6))"
            let client = client(name, queue: queue) { seen.cancels.add(1, ordering: .relaxed) }
            /// The channels of each of this client's connections the broker knows.
            func channels() throws -> [Int] {
                try TestBroker.script(["ctl", "list_connections", "-q", "channels", "client_properties"])
                    .split(separator: "\n").filter { $0.contains("frontdesk-test:\(name)") }
                    .compactMap { Int($0.prefix { $0 != "\t" }) }
            }
            func waiting() async throws -> (messages: UInt32, consumers: UInt32) {
                let r = try await client.withChannel { try await $0.queueDeclare(queue, passive: true) }
                return (r.messageCount, r.consumerCount)
            }
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            _ = try await waiting()
            let idle = try #require(try channels().first, "the connection's channels without a consumer")
            let specification = ConsumerSpecification(queue: queue, prefetchCount: 10, argumentsOnStart: {
                guard seen.starts.add(1, ordering: .relaxed).newValue == 2 else { return nil }
                // The second start: its consumer is stopped, and has ended, and a message waits in its
                // queue (the broker hands it over at once), before its basic.consume goes out.
                let stop = seen.stop.withLock { $0 }
                Task { await stop?() }
                let deadline = ContinuousClock.now + .seconds(10)
                while !seen.sentWhileStarting.load(ordering: .relaxed), ContinuousClock.now < deadline { usleep(1000) }
                return nil
            })
            let stop = await client.consume(specification, deliver: { d in
                seen.bodies.withLock { $0.append(String(decoding: d.body, as: UTF8.self)) }
                try? d.ack()
            }, ended: { seen.ended.store(true, ordering: .relaxed) })
            seen.stop.withLock { $0 = stop }
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("before".utf8)))
            try await waitUntil("the first message is consumed") { seen.bodies.withLock { $0 } == ["before"] }
            if how == "its queue deleted" {
                _ = try await client.withChannel { try await $0.queueDelete(queue) }
                try await waitUntil("the broker's cancel") { seen.cancels.load(ordering: .relaxed) >= 1 }
                try await client.withChannel { _ = try await $0.queueDeclare(queue, arguments: ["x-queue-type": "quorum"]) }
            } else {
                await client.reconnect()
            }
            try await waitUntil("the second start, stopped on its way") {
                seen.starts.load(ordering: .relaxed) == 2 && seen.ended.load(ordering: .relaxed)
            }
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("waiting".utf8), mandatory: true))
            seen.sentWhileStarting.store(true, ordering: .relaxed)
            // Its channel (and, after a broker's cancel, the old one) closed: as before the consumer.
            try await waitUntil("one connection with \(idle) channels", within: .seconds(30)) { try channels() == [idle] }
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("later".utf8), mandatory: true))
            try await waitUntil("both messages wait in the queue") { try await waiting().messages == 2 }
            #expect(try await waiting().consumers == 0)
            #expect(seen.bodies.withLock { $0 } == ["before"])
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
        }

        /// A consumer whose channel the broker closes starts again on a new
        /// one: here for an ack the broker did not know (it closes the channel
        /// with 406), in production also for a delivery held past the broker's
        /// `consumer_timeout` (30 minutes: a pusher holding events while APNs
        /// is away). It used to stay silent until the next connection.
        @Test func aConsumerWhoseChannelTheBrokerClosedStartsAgain() async throws {
            final class Seen: Sendable {
                let bodies = Mutex<[String]>([])
                let restarts = Atomic<Int>(0)
            }
            let seen = Seen()
            let queue = TestBroker.uniqueName("closed-under")
            let client = client("closed-under-\(UUID().uuidString.prefix(6))", queue: queue) { seen.restarts.add(1, ordering: .relaxed) }
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            let stop = await client.consume(ConsumerSpecification(queue: queue, prefetchCount: 10), deliver: { d in
                let body = String(decoding: d.body, as: UTF8.self)
                seen.bodies.withLock { $0.append(body) }
                try? d.ack()
                if body == "twice" { try? d.ack() }  // an ack the broker no longer knows: it closes the channel
            }, ended: {})
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("twice".utf8)))
            try await waitUntil("the channel closed under the consumer") { seen.restarts.load(ordering: .relaxed) >= 1 }
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("after".utf8), mandatory: true))
            try await waitUntil("the consumer takes the message sent after") { seen.bodies.withLock { $0 } == ["twice", "after"] }
            await stop()
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
        }

        /// A consumer's `ended` runs once, however often it is stopped; one
        /// asked for after the client shut down ends at once (nothing would
        /// ever start or end it: a caller reading its sequence waited for ever).
        @Test func aConsumerEndsOnceAndOneAskedForAfterShutdownEndsAtOnce() async throws {
            final class Ends: Sendable {
                let first = Atomic<Int>(0)
                let late = Atomic<Int>(0)
            }
            let ends = Ends()
            let queue = TestBroker.uniqueName("late")
            let client = client("late-\(UUID().uuidString.prefix(6))", queue: queue)
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            let stop = await client.consume(ConsumerSpecification(queue: queue), deliver: { _ in }, ended: { ends.first.add(1, ordering: .relaxed) })
            await stop()
            await stop()
            await client.stopConsuming()
            #expect(ends.first.load(ordering: .relaxed) == 1)
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
            let stopLate = await client.consume(ConsumerSpecification(queue: queue), deliver: { _ in }, ended: { ends.late.add(1, ordering: .relaxed) })
            #expect(ends.late.load(ordering: .relaxed) == 1, "ended as it was asked for")
            await stopLate()
            #expect(ends.late.load(ordering: .relaxed) == 1)
            var late = await client.consume(ConsumerSpecification(queue: queue)).makeAsyncIterator()
            #expect(await late.next() == nil)
        }

        /// `reconnect()` (a consumer that hangs, see ReadBackWatch): a new
        /// connection, and the consumer reads again on it.
        @Test func reconnectOpensANewConnectionAndTheConsumerGoesOn() async throws {
            let queue = TestBroker.uniqueName("reconnect")
            let name = "reconnect-\(UUID().uuidString.prefix(6))"
            let client = client(name, queue: queue)
            // The broker's names of this client's connections ("address:port -> address:port").
            func connections() throws -> [String] {
                try TestBroker.script(["ctl", "list_connections", "-q", "name", "client_properties"])
                    .split(separator: "\n").filter { $0.contains("frontdesk-test:\(name)") }
                    .map { String($0.prefix { $0 != "\t" }) }
            }
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            let deliveries = await client.consume(ConsumerSpecification(queue: queue, prefetchCount: 10))
            var iterator = deliveries.makeAsyncIterator()
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("before".utf8)))
            let first = try #require(await iterator.next())
            #expect(String(decoding: first.body, as: UTF8.self) == "before")
            try first.ack()
            let before = try connections()
            let states = client.stateUpdates()
            await client.reconnect()
            var sawReconnecting = false
            for await s in states {
                if case .reconnecting = s { sawReconnecting = true }
                if sawReconnecting, s == .connected { break }
            }
            #expect(sawReconnecting)
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("after".utf8)))
            let second = try #require(await iterator.next())
            #expect(String(decoding: second.body, as: UTF8.self) == "after")
            try second.ack()
            let after = try connections()
            #expect(before.count == 1 && after.count == 1 && before != after, "\(before) then \(after)")
            try await client.withChannel { try await $0.queueDelete(queue) }
            await client.shutdown()
            await runner.value
        }
    }
}
