import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    /// Any login that may bind a queue to `frontdesk.status` (a surface) or
    /// `frontdesk.dead` (an operator) can bind one that refuses what it is
    /// sent: full, with `x-overflow: reject-publish`. The broker then nacks
    /// the service's publish, though every other queue took it. That must
    /// not make the router retry its requests for ever (its prefetch fills
    /// and every dispatch stalls) nor end the sender's terms one after another.
    @Suite("A queue that refuses status events or dead letters stalls nothing", .timeLimit(.minutes(2)))
    struct HostileSurfaceTests {
        /// A queue bound to `exchange` that holds one message and refuses the rest.
        func refusingQueue(_ h: RouterHarness, on exchange: String, routingKey: String) async throws -> String {
            let queue = TestBroker.uniqueName("refusing")
            try await h.channel.queueDeclare(queue, arguments: ["x-max-length": .int64(1), "x-overflow": .string("reject-publish")])
            try await h.channel.queueBind(queue, exchange: exchange, routingKey: routingKey)
            try await h.channel.publish(exchange: "", routingKey: queue, body: Data("filler".utf8))
            return queue
        }

        /// Reads the status log from its start until `done` holds (the test fails at the deadline).
        func statusLog(_ h: RouterHarness, within: Duration = .seconds(20), until done: @escaping @Sendable ([AMQPDelivery]) -> Bool) async throws
            -> [AMQPDelivery] {
            let c = try await h.connection.openChannel()
            try await c.qos(prefetchCount: 500)
            let consumer = try await c.consume(queue: "frontdesk.status.log", arguments: ["x-stream-offset": .string("first")])
            let collected = CollectedElements<AMQPDelivery>()
            let reader = Task {
                for try await d in consumer {
                    _ = await collected.append(d)
                    try? d.ack()
                }
            }
            try await h.waitUntil("the status log to hold what was expected", within: within) { done(await collected.all) }
            reader.cancel()
            await c.close()
            return await collected.all
        }

        /// The confirm-mode channels (as the broker names them) of the
        /// connections in the harness's vhost whose client name begins with
        /// `prefix`, its alarm probe's aside.
        func confirmChannels(_ h: RouterHarness, named prefix: String) throws -> Set<String> {
            // (3.10 lists the client's name only inside its client properties.)
            let connections = try TestBroker.script(["ctl", "list_connections", "name", "vhost", "client_properties", "--silent"])
            let names = connections.split(separator: "\n").filter {
                $0.contains("\t\(h.vhost)\t") && $0.contains("\"\(prefix)") && !$0.contains("(alarm probe)")
            }.compactMap { $0.split(separator: "\t").first.map(String.init) }
            let channels = try TestBroker.script(["ctl", "list_channels", "name", "confirm", "--silent"])
            return Set(channels.split(separator: "\n").compactMap { row -> String? in
                let columns = row.split(separator: "\t")
                guard columns.count == 2, columns[1] == "true" else { return nil }
                let channel = String(columns[0])
                return names.contains { channel.hasPrefix("\($0) (") } ? channel : nil
            })
        }

        @Test func dispatchesAndDeadLettersGoOnWhileAQueueRefusesThem() async throws {
            try await withHarness("hostile-surface") { h in
                // The sender declares the status log: started first, so the refusing queues come after it.
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let router = try await h.startRouter()
                let sender = try await h.startSender()
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let senderChannels = try confirmChannels(h, named: "frontdesk-sender@")
                try #require(!senderChannels.isEmpty, "the sender's publish channel")
                let refusingStatus = try await refusingQueue(h, on: "frontdesk.status", routingKey: "status.#")
                let refusingDead = try await refusingQueue(h, on: "frontdesk.dead", routingKey: "")

                let ids = (1...30).map { "hs-\($0)" }
                for id in ids { try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"the agm agenda"}"#) }
                for i in 1...5 { try await h.publish("dispatch.request", "{not json \(i)") }

                let events = try await h.events("every dispatch to reply") { events in
                    Set(events.filter { $0["state"] as? String == "replied" }.compactMap { $0["dispatchId"] as? String }).count == ids.count
                }
                for id in ids {
                    let (shown, strays) = RouterHarness.shown(events.filter { $0["dispatchId"] as? String == id })
                    #expect(shown.map { $0["state"] as? String ?? "?" } == ["drafted", "routing", "sending", "sending", "sending", "replied"], "\(id)")
                    #expect(strays.isEmpty, "\(id): \(strays)")
                }
                // The router acked every request and letter (a refused publish
                // it would retry, and count nothing), and the letters are in
                // frontdesk.dead.
                try await h.waitUntil("the router to count 30 accepted and 5 dead letters") {
                    let text = try await h.metrics(router)
                    return text.contains(#"frontdesk_router_requests_total{outcome="accepted"} 30"#)
                        && text.contains(#"frontdesk_router_dead_letters_total{code="invalid_json"} 5"#)
                }
                // Each letter reached frontdesk.dead through the fanout when
                // the refusing queue made the broker nack it, and once more by
                // its own way (a nack does not say which queue refused): twice
                // each, and no more (the router did not publish it again).
                let letters = try await h.drain("frontdesk.dead", count: 10)
                let bodies = letters.map { String(decoding: $0.body, as: UTF8.self) }
                #expect(Set(bodies) == Set((1...5).map { "{not json \($0)" }))
                #expect(bodies.count == 10 && Set((1...5).map { i in bodies.filter { $0 == "{not json \(i)" }.count }) == [2])
                #expect(letters.allSatisfy { $0.properties.headers?["x-frontdesk-error"]?.stringValue == "invalid_json" })
                // The status log, which a next sender leader and the gateway
                // read, holds every dispatch's end.
                let wanted = Set(ids)
                let log = try await statusLog(h) { deliveries in
                    let ended = deliveries.filter { $0.routingKey.hasSuffix(".replied") }.compactMap(\.properties.correlationID)
                    return wanted.isSubset(of: Set(ended))
                }
                #expect(!log.isEmpty)
                // One leader term the whole time: a nack would have ended it.
                let terms = try await h.metrics(sender).split(separator: "\n").first { $0.hasPrefix("frontdesk_sender_terms_total ") }
                #expect(terms == "frontdesk_sender_terms_total 1")
                #expect(try await h.messages(refusingStatus) == 1)
                // It goes on on a new publish channel (on RabbitMQ 3.10 a channel that
                // met a dead quorum leader goes on refusing), and closes the old one
                // once settled. At most once a second: the next dispatch after that moves it.
                let deadline = ContinuousClock.now + .seconds(15)
                var now = try confirmChannels(h, named: "frontdesk-sender@")
                var extra = 0
                while now.isEmpty || !now.isDisjoint(with: senderChannels), ContinuousClock.now < deadline {
                    extra += 1
                    try await h.publish("dispatch.request", #"{"id":"hs-extra-\#(extra)","input":"the agm agenda"}"#)
                    _ = try await h.events(until: "hs-extra-\(extra)", reaches: "replied")
                    now = try confirmChannels(h, named: "frontdesk-sender@")
                }
                #expect(!now.isEmpty && now.isDisjoint(with: senderChannels), "before \(senderChannels), after \(now)")
                #expect(try await h.messages(refusingDead) == 1)
                await agent.stop()
            }
        }
    }
}

extension BrokerIntegration {
    /// An agent's login may declare, and delete, its own target's queue
    /// (deploy/README.md). One target's agents must never keep the sender
    /// from serving the other targets.
    @Suite("An agent queue declared otherwise, or refusing tasks, concerns its target alone", .timeLimit(.minutes(2)))
    struct AgentQueueTests {
        /// The events of `id`, in arrival order, as states.
        func states(_ events: [[String: Any]], _ id: String) -> [String] {
            events.filter { $0["dispatchId"] as? String == id }.map { $0["state"] as? String ?? "?" }
        }

        @Test func aClassicAgentQueueDeclaredBeforeTheSenderIsUsedAsItIs() async throws {
            try await withHarness("agent-queue-classic") { h in
                // As a client library declares by default: durable, classic, before the sender ever ran.
                try await h.channel.queueDeclare("frontdesk.agent.yemaya.board-prep")
                try await h.startRouter()
                let sender = try await h.startSender()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", declaring: nil)
                let other = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.publish("dispatch.request", #"{"id":"cl-1","input":"the agm agenda"}"#)
                try await h.publish("dispatch.request", #"{"id":"cl-2","input":"review the contract"}"#)
                let events = try await h.events(untilEnded: "cl-1", "cl-2")
                #expect(states(events, "cl-1").last == "replied" && states(events, "cl-2").last == "replied")
                #expect(await agent.tasks.all.count == 1)
                await agent.stop()
                await other.stop()
            }
        }

        @Test func aTaskItsAgentQueueRefusesIsThatDispatchsFailedAttempt() async throws {
            try await withHarness("agent-queue-refusing") { h in
                // An agent that is online on a queue that takes nothing (a
                // classic queue refuses any message over its byte limit, also
                // with a consumer waiting; a quorum queue takes some first).
                try await h.channel.queueDeclare(
                    "frontdesk.agent.yemaya.board-prep", arguments: ["x-max-length-bytes": .int64(1), "x-overflow": "reject-publish"])
                try await h.startRouter()
                let sender = try await h.startSender(extraEnvironment: [
                    "FRONTDESK_RETRY_BASE_MS": "200", "FRONTDESK_RETRY_MAX_MS": "200", "FRONTDESK_MAX_ATTEMPTS": "3",
                ])
                let refusing = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", declaring: nil)
                let other = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"rf-1","input":"the agm agenda"}"#)
                try await h.publish("dispatch.request", #"{"id":"rf-2","input":"review the contract"}"#)
                let events = try await h.events(untilEnded: "rf-1", "rf-2")
                // Three attempts, each refused by the broker, then failed; the
                // other target's dispatch replied meanwhile.
                #expect(states(events, "rf-1") == ["drafted", "routing", "sending", "queued", "sending", "queued", "sending", "failed"])
                let failed = events.last { $0["dispatchId"] as? String == "rf-1" }
                let error = failed?["error"] as? [String: Any]
                #expect(error?["code"] as? String == "retries_exhausted")
                #expect((error?["message"] as? String)?.contains("did not take the task") == true, "\(String(describing: error))")
                #expect(failed?["attempt"] as? Int == 3)
                #expect(states(events, "rf-2").last == "replied")
                #expect(await refusing.tasks.all.isEmpty)
                // One term throughout: a refused task no longer ends it.
                #expect(try await h.terms(sender) == 1)
                await refusing.stop()
                await other.stop()
            }
        }

        @Test func anAgentQueueItsAgentsDeleteIsThatTargetOfflineAndDeclaredAgain() async throws {
            try await withHarness("agent-queue-deleted") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let other = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                _ = try await h.channel.queueDelete("frontdesk.agent.yemaya.board-prep")
                // The sender's next presence poll finds it gone and declares it again.
                try await h.waitUntil("the sender to declare the agent queue again") {
                    let probe = try await h.connection.openChannel()
                    defer { Task { await probe.close() } }
                    return (try? await probe.queueDeclare("frontdesk.agent.yemaya.board-prep", passive: true)) != nil
                }
                try await h.publish("dispatch.request", #"{"id":"dq-1","input":"review the contract"}"#)
                try await h.publish("dispatch.request", #"{"id":"dq-2","input":"the agm agenda"}"#)
                let before = try await h.events("dq-1 to reply and dq-2 to wait") { events in
                    states(events, "dq-1").last == "replied" && states(events, "dq-2").last == "queued"
                }
                #expect(states(before, "dq-1") == ["drafted", "routing", "sending", "sending", "sending", "replied"])
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let after = try await h.events(untilEnded: "dq-2")
                #expect(states(after, "dq-2") == ["sending", "sending", "sending", "replied"])
                #expect(try await h.terms(sender) == 1)
                await agent.stop()
                await other.stop()
            }
        }

        @Test func anAgentQueueHeldExclusiveIsThatTargetOfflineAlone() async throws {
            try await withHarness("agent-queue-exclusive") { h in
                // Held exclusive by another connection (here the harness's): RESOURCE_LOCKED to the sender.
                try await h.channel.queueDeclare("frontdesk.agent.yemaya.board-prep", exclusive: true)
                try await h.startRouter()
                let sender = try await h.startSender()
                let other = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"ex-1","input":"review the contract"}"#)
                try await h.publish("dispatch.request", #"{"id":"ex-2","input":"the agm agenda"}"#)
                let events = try await h.events("ex-1 to reply and ex-2 to wait") { events in
                    states(events, "ex-1").last == "replied" && states(events, "ex-2").last == "queued"
                }
                #expect(states(events, "ex-2") == ["drafted", "routing", "queued"])
                #expect(try await h.terms(sender) == 1)
                await other.stop()
            }
        }
    }
}
