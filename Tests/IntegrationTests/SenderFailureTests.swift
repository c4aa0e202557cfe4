import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    @Suite("Sender under failure", .timeLimit(.minutes(2)))
    struct SenderFailureTests {
        func states(_ events: [[String: Any]], _ id: String) -> [String] {
            events.filter { $0["dispatchId"] as? String == id }.compactMap { $0["state"] as? String }
        }

        func seqs(_ events: [[String: Any]], _ id: String) -> [Int] {
            events.filter { $0["dispatchId"] as? String == id }.compactMap { $0["seq"] as? Int }
        }

        /// The dispatch's last event is `failed` with `expired`, at most 5 s
        /// after the lifetime (`lifetime` s from `started`) ran out.
        func expectExpiredOnTime(
            _ events: [[String: Any]], _ id: String, started: Date, lifetime: Double,
            sourceLocation: SourceLocation = #_sourceLocation
        ) {
            let failed = events.last { $0["dispatchId"] as? String == id }
            #expect((failed?["error"] as? [String: Any])?["code"] as? String == "expired", sourceLocation: sourceLocation)
            let at = (failed?["at"] as? String).flatMap { ISO8601DateFormatter.withFractions.date(from: $0) }
            let lateness = at.map { $0.timeIntervalSince(started) - lifetime } ?? 99
            #expect(lateness < 5, "failed \(lateness) s after expiresAt", sourceLocation: sourceLocation)
        }

        @Test func killedWhileDispatchesAreParkedLosesNothing() async throws {
            try await withHarness("sender-kill-parked") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                for i in 0..<20 { try await h.publish("dispatch.request", #"{"id":"p-\#(i)","input":"the agm agenda \#(i)"}"#) }
                _ = try await h.events("20 queued") { $0.filter { $0["state"] as? String == "queued" }.count >= 20 }
                kill(sender.processIdentifier, SIGKILL)
                try await h.startSender()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let events = try await h.events("20 replied") { $0.filter { $0["state"] as? String == "replied" }.count >= 20 }
                for i in 0..<20 { #expect(states(events, "p-\(i)").last == "replied", "p-\(i)") }
                #expect(Set(await agent.tasks.all.compactMap { $0.properties.correlationID }).count == 20)
                await agent.stop()
            }
        }

        @Test func aStandbyTakesOverWhenTheLeaderIsKilledMidFlight() async throws {
            try await withHarness("sender-takeover") { h in
                try await h.startRouter()
                let first = try await h.startSender()
                try await h.waitUntilLeading(first)
                try await h.startSender()  // standby
                let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
                try await h.waitUntilSenderSeesAgents(first, on: "yemaya/board-prep")
                try await h.publish("dispatch.request", #"{"id":"t-1","input":"the agm agenda"}"#)
                var events = try await h.events(until: "t-1", reaches: "sending")
                kill(first.processIdentifier, SIGKILL)
                await silent.stop()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                events += try await h.events(untilEnded: "t-1")
                let history = states(events, "t-1")
                #expect(history.first == "drafted" && history.last == "replied")
                #expect(history.filter { ["replied", "failed", "cancelled"].contains($0) }.count == 1)
                let s = seqs(events, "t-1")
                #expect(s == s.sorted() && Set(s).count == s.count, "seq only grows: \(s)")
                await agent.stop()
            }
        }

        /// Leadership is the exclusive lock queue: one leader among replicas
        /// started at the same instant and one added later, as each says
        /// itself (`frontdesk_sender_leader`) and as the broker shows (the
        /// replies queue has one consumer: only a leader consumes it).
        @Test func threeReplicasHaveExactlyOneLeader() async throws {
            try await withHarness("sender-one-leader") { h in
                async let a = h.startSender()
                async let b = h.startSender()
                let (first, second) = try await (a, b)
                let third = try await h.startSender()
                func leaders() async throws -> Int {
                    var n = 0
                    for p in [first, second, third] where try await h.isLeading(p) { n += 1 }
                    return n
                }
                // One leads at once, and no second one joins it while the three run.
                try await h.waitUntil("one sender leads") { try await leaders() == 1 }
                try await h.waitUntil("the leader consumes the replies") { try await h.consumers("frontdesk.replies") == 1 }
                for _ in 0..<25 {
                    #expect(try await leaders() == 1)
                    #expect(try await h.consumers("frontdesk.replies") == 1)
                    try await Task.sleep(for: .milliseconds(200))  // sampling over 5 s, not waiting for a condition
                }
            }
        }

        @Test func anAgentThatDisappearsPutsTheDispatchBackInQueued() async throws {
            try await withHarness("sender-agent-gone") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.publish("dispatch.request", #"{"id":"g-1","input":"the agm agenda"}"#)
                var events = try await h.events(until: "g-1", reaches: "sending")
                await silent.stop()
                events += try await h.events(until: "g-1", reaches: "queued")
                #expect(states(events, "g-1") == ["drafted", "routing", "sending", "queued"])
                let queued = events.last { $0["dispatchId"] as? String == "g-1" }
                #expect((queued?["queue"] as? [String: Any])?["reason"] as? String == "agent_offline")
                #expect(queued?["attempt"] as? Int == 2)
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                events = try await h.events(untilEnded: "g-1")
                #expect(states(events, "g-1") == ["sending", "sending", "sending", "replied"])
                #expect(await agent.tasks.all.compactMap(\.properties.messageID).contains("g-1/2"))
                await agent.stop()
            }
        }

        @Test func anAgentThatAcceptsThenFallsSilentTimesOut() async throws {
            try await withHarness("sender-accept-silent") { h in
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .acceptThenSilent)
                try await h.startRouter()
                let sender = try await h.startSender(extraEnvironment: [
                    "FRONTDESK_REPLY_TIMEOUT_S": "1", "FRONTDESK_RETRY_BASE_MS": "200", "FRONTDESK_MAX_ATTEMPTS": "2",
                ])
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.publish("dispatch.request", #"{"id":"as-1","input":"the agm agenda"}"#)
                let events = try await h.events(untilEnded: "as-1")
                // The accepted reply must not stop the reply timeout.
                #expect(states(events, "as-1") == ["drafted", "routing", "sending", "sending", "queued", "sending", "sending", "failed"])
                let failed = events.last { $0["dispatchId"] as? String == "as-1" }
                #expect((failed?["error"] as? [String: Any])?["code"] as? String == "retries_exhausted")
                await agent.stop()
            }
        }

        @Test func aDispatchWithAnAcceptingAgentStillExpiresOnTime() async throws {
            try await withHarness("sender-accept-expiry") { h in
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .acceptThenSilent)
                try await h.startRouter(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let started = Date()
                try await h.publish("dispatch.request", #"{"id":"ae-1","input":"the agm agenda"}"#)
                let events = try await h.events(untilEnded: "ae-1")
                #expect(states(events, "ae-1") == ["drafted", "routing", "sending", "sending", "failed"])
                expectExpiredOnTime(events, "ae-1", started: started, lifetime: 3)
                await agent.stop()
            }
        }

        @Test func aParkedDispatchExpiresOnTime() async throws {
            try await withHarness("sender-expiry") { h in
                try await h.startRouter(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                try await h.startSender(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                let started = Date()
                try await h.publish("dispatch.request", #"{"id":"e-1","input":"the agm agenda"}"#)
                let events = try await h.events(untilEnded: "e-1")
                #expect(states(events, "e-1") == ["drafted", "routing", "queued", "failed"])
                expectExpiredOnTime(events, "e-1", started: started, lifetime: 3)
            }
        }

        /// A reroute that arrives before its request, to a target that is
        /// online: the dispatch is parked there (its copy is its lease from
        /// then on, not the hand-off naming the old route) and delivered at
        /// once; the old target's agent gets nothing.
        @Test func aRerouteBeforeItsRequestIsDeliveredAtTheNewTargetOnly() async throws {
            try await withHarness("sender-early-reroute") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.reroute", #"{"id":"er-1","project":"acme","target":"legal"}"#)
                try await h.publish("dispatch.request", #"{"id":"er-1","input":"the agm agenda"}"#)
                let events = try await h.events(untilEnded: "er-1")
                let mine = events.filter { $0["dispatchId"] as? String == "er-1" }
                #expect(states(events, "er-1").prefix(3) == ["drafted", "routing", "queued"] && mine.last?["state"] as? String == "replied")
                #expect(mine.dropFirst(2).allSatisfy { ($0["target"] as? [String: Any])?["id"] as? String == "legal" })
                #expect(await board.tasks.all.isEmpty)
                #expect(await legal.tasks.all.compactMap(\.properties.correlationID) == ["er-1"])
                await board.stop()
                await legal.stop()
            }
        }

        /// "A cancel … that arrives before its request is remembered for the
        /// lifetime window": past it, the request is served as any other.
        @Test func aCancelOlderThanTheLifetimeWindowNoLongerAppliesToItsRequest() async throws {
            try await withHarness("sender-late-cancel") { h in
                try await h.startRouter(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                try await h.waitUntilLeading(sender)
                try await h.publish("dispatch.cancel", #"{"id":"lc-old","reason":"user"}"#)
                try await h.publish("dispatch.cancel", #"{"id":"lc-new","reason":"user"}"#)
                try await h.publish("dispatch.request", #"{"id":"lc-new","input":"the agm agenda"}"#)
                // Behind the first cancel in the same queues: once this one is cancelled, the sender holds both.
                let early = try await h.events(untilEnded: "lc-new")
                #expect(states(early, "lc-new") == ["drafted", "routing", "cancelled"])
                let held = Date()
                // What is waited for is the clock passing the cancel's window (it reached the sender before `held`).
                while Date() < held.addingTimeInterval(3.5) { try await Task.sleep(for: .milliseconds(50)) }
                try await h.publish("dispatch.request", #"{"id":"lc-old","input":"the agm agenda"}"#)
                // No agent: it waits until its own lifetime ends it, not the old cancel.
                let events = try await h.events(untilEnded: "lc-old")
                #expect(states(events, "lc-old") == ["drafted", "routing", "queued", "failed"])
            }
        }
    }
}

extension ISO8601DateFormatter {
    static var withFractions: ISO8601DateFormatter {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return f
    }
}

extension BrokerIntegration.SenderFailureTests {
    @Test func aRetryWaitSurvivesTheSendersDeathBecauseItWaitsInTheBroker() async throws {
        try await withHarness("sender-retry-kill") { h in
            try await h.startRouter()
            let env = ["FRONTDESK_RETRY_BASE_MS": "3000"]
            let first = try await h.startSender(extraEnvironment: env)
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .failFirstAttempt)
            try await h.waitUntilSenderSeesAgents(first, on: "yemaya/board-prep")
            try await h.publish("dispatch.request", #"{"id":"rk-1","input":"the agm agenda"}"#)
            var events = try await h.events(until: "rk-1", reaches: "queued")
            kill(first.processIdentifier, SIGKILL)
            try await h.startSender(extraEnvironment: env)
            events += try await h.events(untilEnded: "rk-1")
            #expect(states(events, "rk-1") == ["drafted", "routing", "sending", "queued", "sending", "sending", "sending", "replied"])
            let wait = events.first { $0["state"] as? String == "queued" }
            let retryAt = ((wait?["queue"] as? [String: Any])?["retryAt"] as? String).flatMap { ISO8601DateFormatter.withFractions.date(from: $0) }
            let resent = events.last { $0["state"] as? String == "sending" && ($0["attempt"] as? Int) == 2 }
            let resentAt = (resent?["at"] as? String).flatMap { ISO8601DateFormatter.withFractions.date(from: $0) }
            if let retryAt, let resentAt {
                #expect(resentAt >= retryAt, "not before retryAt")
                #expect(resentAt.timeIntervalSince(retryAt) < 2, "within 2 s after retryAt")
            } else {
                Issue.record("no retryAt or no second attempt")
            }
            let s = seqs(events, "rk-1")
            #expect(s == s.sorted() && Set(s).count == s.count)
            #expect(await agent.tasks.all.compactMap(\.properties.messageID) == ["rk-1/1", "rk-1/2"])
            await agent.stop()
        }
    }
}

extension BrokerIntegration.SenderFailureTests {
    @Test func parkedDispatchesSurviveABrokerRestart() async throws {
        try await withHarness("sender-broker-restart") { h in
            try await h.startRouter()
            let sender = try await h.startSender()
            for i in 0..<10 { try await h.publish("dispatch.request", #"{"id":"br-\#(i)","input":"the agm agenda \#(i)"}"#) }
            var events = try await h.events("10 queued") { $0.filter { $0["state"] as? String == "queued" }.count >= 10 }
            for i in 0..<10 { #expect(states(events, "br-\(i)") == ["drafted", "routing", "queued"]) }
            try TestBroker.script(["restart"])
            try await h.reconnect()
            // The services come back by themselves; then an agent appears.
            try await h.waitUntilLeading(sender)
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            events = try await h.events("10 replied") { $0.filter { $0["state"] as? String == "replied" }.count >= 10 }
            for i in 0..<10 { #expect(states(events, "br-\(i)").last == "replied", "br-\(i)") }
            #expect(Set(await agent.tasks.all.compactMap(\.properties.correlationID)).count == 10)
            await agent.stop()
        }
    }
}

extension BrokerIntegration.SenderFailureTests {
    @Test func aRetryWaitLongerThanTheLifetimeStillExpiresOnTime() async throws {
        try await withHarness("sender-retry-expiry") { h in
            try await h.startRouter(extraEnvironment: ["FRONTDESK_LIFETIME_S": "4"])
            let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_RETRY_BASE_MS": "30000", "FRONTDESK_RETRY_MAX_MS": "30000"])
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .retryableError)
            try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
            let started = Date()
            try await h.publish("dispatch.request", #"{"id":"rx-1","input":"the agm agenda"}"#)
            let events = try await h.events(untilEnded: "rx-1")
            #expect(states(events, "rx-1") == ["drafted", "routing", "sending", "queued", "failed"])
            expectExpiredOnTime(events, "rx-1", started: started, lifetime: 4)
            await agent.stop()
        }
    }
}

extension BrokerIntegration.SenderFailureTests {
    @Test func killedWhileAnAgentIsMidReplyEndsExactlyOnce() async throws {
        try await withHarness("sender-kill-mid-reply") { h in
            try await h.startRouter()
            let first = try await h.startSender()
            try await h.waitUntilLeading(first)
            try await h.startSender()  // standby
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .slowStream)
            try await h.waitUntilSenderSeesAgents(first, on: "yemaya/board-prep")
            try await h.publish("dispatch.request", #"{"id":"mr-1","input":"the agm agenda"}"#)
            // Mid-stream: two progress replies in.
            var events = try await h.events("two progress events of mr-1") { $0.filter { $0["state"] as? String == "sending" }.count >= 3 }
            kill(first.processIdentifier, SIGKILL)
            events += try await h.events(untilEnded: "mr-1")
            let history = states(events, "mr-1")
            #expect(history.filter { ["replied", "failed", "cancelled"].contains($0) } == ["replied"])
            #expect(history.last == "replied", "nothing after the terminal state: \(history)")
            let s = seqs(events, "mr-1")
            #expect(s == s.sorted() && Set(s).count == s.count, "seq only grows: \(s)")
            // The task may come twice (the same message id): agents are told so by the contract.
            #expect(Set(await agent.tasks.all.compactMap(\.properties.messageID)) == ["mr-1/1"])
            await agent.stop()
        }
    }
}

extension BrokerIntegration.SenderFailureTests {
    /// A surface's queue for `replied` events that refuses them: it holds one
    /// message and rejects publishes beyond it (the broker nacks them).
    func fullSurface(_ h: RouterHarness) async throws -> String {
        let surface = "frontdesk.test.full-surface"
        try await h.channel.queueDeclare(surface, arguments: ["x-max-length": .int64(1), "x-overflow": .string("reject-publish")])
        try await h.channel.queueBind(surface, exchange: "frontdesk.status", routingKey: "status.*.*.replied")
        try await h.channel.publish(exchange: "", routingKey: surface, body: Data("filler".utf8))
        return surface
    }

    /// A surface's queue that refuses the `replied` event (full, rejecting
    /// publishes) makes the broker nack it, though the status log took it: a
    /// next leader would see the dispatch ended and drop its lease. The term
    /// publishes the event again before it ends, so the surface gets it once
    /// it has room.
    @Test func aRepliedTheBrokerNackedStillReachesTheSurfaceThatRefusedIt() async throws {
        try await withHarness("sender-nacked-replied") { h in
            let surface = try await fullSurface(h)
            try await h.startRouter()
            let sender = try await h.startSender()
            try await h.waitUntilLeading(sender)
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
            try await h.publish("dispatch.request", #"{"id":"nk-1","input":"the agm agenda"}"#)
            // The test's own status queue took it; the full one refused it.
            _ = try await h.events(until: "nk-1", reaches: "replied")
            _ = try await h.channel.queuePurge(surface)
            let arrived = try await h.drain(surface, count: 1, within: .seconds(10))
            let event = RouterHarness.decode(arrived).first
            #expect(event?["dispatchId"] as? String == "nk-1" && event?["state"] as? String == "replied", "\(String(describing: event))")
            await agent.stop()
        }
    }
}

extension BrokerIntegration.SenderFailureTests {
    /// The end of a dispatch can be in the status log and not in a surface's
    /// queue (a nack does not unroute; a node can die between the two). When
    /// its leader dies too, the next one, seeing it ended, drops the lease:
    /// it publishes that end again first, so the surface gets it.
    @Test func aNewLeaderPublishesAgainAnEndTheLogHasThatASurfaceMissed() async throws {
        try await withHarness("sender-end-again") { h in
            let surface = try await fullSurface(h)
            _ = try await h.channel.queuePurge(surface)  // full only once the end is in the log
            try await h.startRouter()
            let first = try await h.startSender()
            try await h.waitUntilLeading(first)
            try await h.startSender()  // standby: it reads the log while it waits
            let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
            try await h.waitUntilSenderSeesAgents(first, on: "yemaya/board-prep")
            try await h.publish("dispatch.request", #"{"id":"ea-1","input":"the agm agenda"}"#)
            _ = try await h.events(until: "ea-1", reaches: "sending")
            // Its end, as a leader that died would have left it: in the log
            // (and the test's own queue), refused by the full surface.
            try await h.channel.publish(exchange: "", routingKey: surface, body: Data("filler".utf8))
            let end = #"{"dispatchId":"ea-1","seq":40,"state":"replied","at":"2026-01-01T00:00:00.000Z","text":"done"}"#
            await #expect(throws: AMQPError.self) {
                try await h.channel.publish(
                    exchange: "frontdesk.status", routingKey: "status.yemaya.board-prep.replied", body: Data(end.utf8),
                    properties: .persistentJSON(messageID: "ea-1/40", correlationID: "ea-1", type: "frontdesk.status.v1"))
            }
            _ = try await h.channel.queuePurge(surface)
            kill(first.processIdentifier, SIGKILL)
            let arrived = try await h.drain(surface, count: 1, within: .seconds(15))
            let event = RouterHarness.decode(arrived).first
            #expect(event?["dispatchId"] as? String == "ea-1" && event?["seq"] as? Int == 40, "\(String(describing: event))")
            #expect(arrived.first?.properties.messageID == "ea-1/40")
            await silent.stop()
        }
    }
}
