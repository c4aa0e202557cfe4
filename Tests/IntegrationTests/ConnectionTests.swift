import AMQP
import Foundation
import Synchronization
import Testing

extension BrokerIntegration {
    @Suite("Connections: login, TLS, heartbeats, names", .timeLimit(.minutes(1)))
    struct ConnectionTests {
        @Test func wrongPasswordIsAClearAuthenticationError() async throws {
            var url = TestBroker.url
            url.password = "certainly-not-the-password"
            let configuration = TestBroker.configuration("bad-login", url: url)
            do {
                _ = try await AMQPConnection.connect(configuration)
                Issue.record("a wrong password was accepted")
            } catch let error as AMQPError {
                #expect(error.code == .authenticationFailed)
                #expect(error.replyCode == 403)
                #expect(!error.description.contains("certainly-not-the-password"))
                #expect(error.description.contains("ACCESS_REFUSED"))
            }
        }

        @Test func unreachableBrokerIsAConnectionError() async throws {
            var url = TestBroker.url
            url.port = 1  // nothing listens there
            await #expect {
                _ = try await AMQPConnection.connect(TestBroker.configuration("unreachable", url: url))
            } throws: { ($0 as? AMQPError)?.code == .connectionFailed && ($0 as? AMQPError)?.isRetryable == true }
        }

        @Test func tlsWithTheRightCAConnectsAndPublishes() async throws {
            var configuration = TestBroker.configuration("tls", url: TestBroker.tlsURL)
            configuration.tls = .init(caFile: "\(TestBroker.certsDirectory)/ca.pem")
            let connection = try await AMQPConnection.connect(configuration)
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("tls")
            try await channel.queueDeclare(queue, durable: false, autoDelete: true)
            try await channel.confirmSelect()
            try await channel.publish(exchange: "", routingKey: queue, body: Data("over tls".utf8))
            let delivered = try await channel.consume(queue: queue, noAck: true).first(1, timeout: .seconds(5))
            #expect(delivered.map { String(decoding: $0.body, as: UTF8.self) } == ["over tls"])
            await connection.close()
        }

        /// Over TLS rabbitmq-c writes frame by frame, so a message AMQP
        /// cannot carry is refused before any of it is written: the
        /// connection goes on.
        @Test func overTLSAMessageAMQPCannotCarryIsRefusedAlone() async throws {
            var configuration = TestBroker.configuration("tls-unencodable", url: TestBroker.tlsURL)
            configuration.tls = .init(caFile: "\(TestBroker.certsDirectory)/ca.pem")
            let connection = try await AMQPConnection.connect(configuration)
            defer { Task { await connection.close() } }
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("tls-carried")
            try await channel.queueDeclare(queue, durable: false, autoDelete: false)
            try await channel.confirmSelect()
            let results = try await channel.publish([
                OutboundMessage(exchange: "", routingKey: queue, body: Data("a".utf8)),
                OutboundMessage(exchange: "", routingKey: queue, body: Data("b".utf8),
                    properties: AMQPProperties(correlationID: String(repeating: "c", count: 300))),
                OutboundMessage(exchange: "", routingKey: queue, body: Data("d".utf8)),
            ])
            #expect(results.count == 3)
            guard results.count == 3 else { return }
            if case .failure(let e) = results[1] { #expect(e.code == .invalidMessage) } else { Issue.record("published") }
            for i in [0, 2] {
                if case .failure(let e) = results[i] { Issue.record("message \(i) failed: \(e)") }
            }
            #expect(try await channel.queueDeclare(queue, passive: true).messageCount == 2)
            try await channel.queueDelete(queue)
        }

        @Test func tlsWithAClientCertificateConnects() async throws {
            var configuration = TestBroker.configuration("tls-client-cert", url: TestBroker.tlsURL)
            let dir = TestBroker.certsDirectory
            configuration.tls = .init(caFile: "\(dir)/ca.pem", certificateFile: "\(dir)/client.pem", keyFile: "\(dir)/client.key")
            let connection = try await AMQPConnection.connect(configuration)
            #expect(connection.isOpen)
            await connection.close()
        }

        @Test func tlsWithTheWrongCAIsRefused() async throws {
            var configuration = TestBroker.configuration("tls-wrong-ca", url: TestBroker.tlsURL)
            configuration.tls = .init(caFile: "\(TestBroker.certsDirectory)/wrong-ca.pem")
            await #expect {
                _ = try await AMQPConnection.connect(configuration)
            } throws: { ($0 as? AMQPError)?.code == .tlsFailed }
        }

        @Test func idleConnectionStaysAliveOnHeartbeats() async throws {
            var url = TestBroker.url
            url.heartbeat = 1  // the broker drops a peer silent for 2 heartbeats
            let connection = try await AMQPConnection.connect(TestBroker.configuration("heartbeat", url: url))
            try await Task.sleep(for: .seconds(4))  // the idle time under test: four heartbeat intervals
            #expect(connection.isOpen)
            let channel = try await connection.openChannel()
            try await channel.queueDeclare(TestBroker.uniqueName("alive"), durable: false, autoDelete: true)
            await connection.close()
        }

        @Test func aClientOfSeveralNodesConnectsToOneThatAnswersAndMovesWhenItGoes() async throws {
            // Two "nodes" (proxies to the broker) and one that refuses: wherever it starts, it ends connected,
            // and when its node falls silent it moves to the other.
            let p1 = try FreezingProxy(upstreamPort: UInt16(TestBroker.url.port))
            let p2 = try FreezingProxy(upstreamPort: UInt16(TestBroker.url.port))
            defer {
                p1.stop()
                p2.stop()
            }
            var u1 = TestBroker.url, u2 = TestBroker.url, dead = TestBroker.url
            u1.port = Int(p1.port)
            u2.port = Int(p2.port)
            dead.port = 1
            u1.heartbeat = 1
            u2.heartbeat = 1
            var connection = TestBroker.configuration("nodes", url: u1)
            connection.alternates = [dead, u2]
            var configuration = AMQPClient.Configuration(connection: connection)
            configuration.reconnectBackoff = Backoff(baseMs: 50, maxMs: 200)
            let client = AMQPClient(configuration: configuration, topology: { _ in })
            let run = Task { await client.run() }
            defer { run.cancel() }
            try await waitUntil("connected to a node", within: .seconds(10)) { client.isReady }
            let (first, other) = p1.used.load(ordering: .relaxed) ? (p1, p2) : (p2, p1)
            #expect(first.used.load(ordering: .relaxed) && !other.used.load(ordering: .relaxed))
            first.freeze()
            try await waitUntil("connected through the other node", within: .seconds(15)) {
                other.used.load(ordering: .relaxed) && client.isReady
            }
            try await client.withChannel { ch in
                _ = try await ch.queueDeclare("", durable: false, exclusive: true, autoDelete: true)
            }
            await client.shutdown()
        }

        /// Cancelled with no broker to reach (a service's grace period over),
        /// the client stops: its back-off does not wait under cancellation,
        /// so it went on attempting with no pause between.
        @Test func aCancelledClientStopsReconnecting() async throws {
            var dead = TestBroker.url
            dead.port = 1
            var configuration = AMQPClient.Configuration(connection: TestBroker.configuration("cancelled", url: dead))
            configuration.reconnectBackoff = Backoff(baseMs: 200, maxMs: 200)
            let attempts = Atomic<Int>(0)
            let client = AMQPClient(configuration: configuration, topology: { _ in }, onEvent: { event in
                if case .connectFailed = event { attempts.add(1, ordering: .relaxed) }
            })
            let run = Task { await client.run() }
            try await waitUntil("a first attempt failed", within: .seconds(10)) { attempts.load(ordering: .relaxed) >= 1 }
            run.cancel()
            let cancelledAt = ContinuousClock.now
            await run.value
            #expect(ContinuousClock.now - cancelledAt < .seconds(2))
            // At most the attempt under way when the cancel came.
            #expect(attempts.load(ordering: .relaxed) <= 2, "\(attempts.load(ordering: .relaxed)) attempts")
        }

        /// A consumer holding a delivery learns that its connection ended
        /// before the next connection's first delivery (the same message,
        /// requeued): dropping what it held then drops nothing new.
        @Test func aLostConnectionIsToldBeforeTheNextConnectionsFirstDelivery() async throws {
            let queue = TestBroker.uniqueName("lost-told")
            var configuration = AMQPClient.Configuration(connection: TestBroker.configuration("lost-told"))
            configuration.reconnectBackoff = Backoff(baseMs: 50, maxMs: 200)
            let client = AMQPClient(configuration: configuration, topology: { ch in
                _ = try await ch.queueDeclare(queue, durable: false, autoDelete: false)
            })
            let seen = Mutex<[String]>([])
            client.onConnectionLost { seen.withLock { $0.append("lost") } }
            let run = Task { await client.run() }
            defer { run.cancel() }
            try await waitUntil("connected", within: .seconds(10)) { client.isReady }
            let stop = await client.consume(ConsumerSpecification(queue: queue, prefetchCount: 10), deliver: { d in
                seen.withLock { $0.append(d.redelivered ? "redelivered" : "delivered") }  // held: never acked
            }, ended: {})
            try await client.publish(OutboundMessage(exchange: "", routingKey: queue, body: Data("held".utf8)))
            try await waitUntil("the delivery", within: .seconds(10)) { seen.withLock { $0 } == ["delivered"] }
            for round in 1...3 {
                await client.reconnect()
                try await waitUntil("redelivery \(round)", within: .seconds(10)) { seen.withLock { $0.count } == 1 + 2 * round }
            }
            #expect(seen.withLock { $0 } == ["delivered", "lost", "redelivered", "lost", "redelivered", "lost", "redelivered"])
            await stop()
            try await client.withChannel { _ = try await $0.queueDelete(queue) }
            await client.shutdown()
        }

        /// A connection lost soon after it was up is followed by a back-off that
        /// grows while that goes on; after one that lived, the next comes at once.
        @Test func connectionsLostRightAfterOpeningAreRetriedLessAndLessOften() async throws {
            var configuration = AMQPClient.Configuration(connection: TestBroker.configuration("brief"))
            configuration.reconnectBackoff = Backoff(baseMs: 1000, maxMs: 4000)  // waits of 0.5–1 s, then 1–2 s
            configuration.briefConnection = .seconds(2)
            let events = Mutex<[(connected: Bool, at: ContinuousClock.Instant)]>([])
            let client = AMQPClient(configuration: configuration, onEvent: { event in
                switch event {
                case .connected: events.withLock { $0.append((true, .now)) }
                case .connectionLost: events.withLock { $0.append((false, .now)) }
                default: break
                }
            })
            let run = Task { await client.run() }
            defer { run.cancel() }
            func connections() -> Int { events.withLock { $0.filter(\.connected).count } }
            /// From the last loss to the connection after it.
            func lastGap() -> Duration { events.withLock { $0[$0.count - 1].at - $0[$0.count - 2].at } }
            try await waitUntil("connected", within: .seconds(10)) { connections() == 1 }
            var gaps: [Duration] = []
            for round in 1...2 {
                await client.reconnect()
                try await waitUntil("connection \(round + 1)", within: .seconds(10)) { connections() == round + 1 }
                gaps.append(lastGap())
            }
            #expect(gaps[0] >= .milliseconds(500) && gaps[1] >= .milliseconds(1000), "\(gaps)")
            // Up for longer than `briefConnection`: the next loss is followed at once.
            let upSince = try #require(events.withLock { $0.last?.at })
            try await waitUntil("up for 2 s", within: .seconds(10)) { ContinuousClock.now - upSince > .milliseconds(2100) }
            await client.reconnect()
            try await waitUntil("connection 4", within: .seconds(10)) { connections() == 4 }
            #expect(lastGap() < .milliseconds(500), "\(lastGap())")
            await client.shutdown()
        }

        @Test(arguments: [false, true])
        func aBrokerThatFallsSilentIsNoticedByItsMissedHeartbeats(whilePublishing: Bool) async throws {
            let proxy = try FreezingProxy(upstreamPort: UInt16(TestBroker.url.port))
            defer { proxy.stop() }
            var url = TestBroker.url
            url.port = Int(proxy.port)
            url.heartbeat = 1
            let connection = try await AMQPConnection.connect(TestBroker.configuration("silent", url: url))
            let channel = try await connection.openChannel()
            try await Task.sleep(for: .seconds(2))  // idle through the proxy for two heartbeat intervals
            #expect(connection.isOpen, "heartbeats pass through the proxy")
            proxy.freeze()
            let frozenAt = ContinuousClock.now
            // Busy or idle, the connection must notice: a steady stream of
            // commands keeps its thread awake but must not keep it from reading.
            let publisher = Task {
                while whilePublishing, !Task.isCancelled {
                    _ = channel.publishWithoutWaiting([OutboundMessage(exchange: "", routingKey: "nowhere", body: Data("x".utf8))])
                    try? await Task.sleep(for: .milliseconds(20))
                }
            }
            defer { publisher.cancel() }
            while connection.isOpen, ContinuousClock.now - frozenAt < .seconds(10) {
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(!connection.isOpen, "a silent broker went unnoticed for 10 s")
            #expect(ContinuousClock.now - frozenAt < .seconds(5))
        }

        /// A peer that stops reading while a large window is being written:
        /// the write fills the socket's buffers, and the connection's thread
        /// must give up (within the 15 s stall limit) rather than wait for ever.
        @Test func aWriteThatMakesNoProgressEndsTheConnection() async throws {
            let proxy = try FreezingProxy(upstreamPort: UInt16(TestBroker.url.port))
            defer { proxy.stop() }
            var url = TestBroker.url
            url.port = Int(proxy.port)
            url.heartbeat = 0  // only the write's own limit can notice
            let connection = try await AMQPConnection.connect(TestBroker.configuration("stalled-write", url: url))
            let channel = try await connection.openChannel()
            proxy.freeze()
            let frozenAt = ContinuousClock.now
            let big = Data(repeating: 0x78, count: 4 << 20)
            let publisher = Task {
                for _ in 0..<16 where !Task.isCancelled {
                    _ = channel.publishWithoutWaiting((0..<4).map { _ in OutboundMessage(exchange: "", routingKey: "nowhere", body: big) })
                    try? await Task.sleep(for: .milliseconds(50))
                }
            }
            defer { publisher.cancel() }
            try await waitUntil("the stalled connection ends", within: .seconds(30)) { !connection.isOpen }
            #expect(!connection.isOpen)
            #expect(ContinuousClock.now - frozenAt < .seconds(25))
        }

        @Test func connectionNameIsVisibleToTheBroker() async throws {
            let name = "frontdesk-test:named-\(UUID().uuidString.prefix(6))"
            let connection = try await AMQPConnection.connect(
                AMQPConnectionConfiguration(url: TestBroker.url, connectionName: name))
            let listing = try TestBroker.script(["ctl", "list_connections", "client_properties"])
            #expect(listing.contains(name))
            await connection.close()
        }

        @Test func closeFailsLaterCallsWithAClearError() async throws {
            let connection = try await TestBroker.connect("close")
            let channel = try await connection.openChannel()
            await connection.close()
            #expect(!connection.isOpen)
            await #expect {
                try await channel.queueDeclare("x", passive: true)
            } throws: { ($0 as? AMQPError)?.code == .connectionClosed }
        }
    }
}
