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
                _ = try await h.events()
                kill(sender.processIdentifier, SIGKILL)
                try await h.startSender()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let events = try await h.events(quiet: .seconds(2))
                for i in 0..<20 { #expect(states(events, "p-\(i)").last == "replied", "p-\(i)") }
                #expect(Set(await agent.tasks.all.compactMap { $0.properties.correlationID }).count == 20)
                await agent.stop()
            }
        }

        @Test func aStandbyTakesOverWhenTheLeaderIsKilledMidFlight() async throws {
            try await withHarness("sender-takeover") { h in
                try await h.startRouter()
                let first = try await h.startSender()
                try await Task.sleep(for: .milliseconds(500))
                try await h.startSender()  // standby
                let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
                try await Task.sleep(for: .milliseconds(800))
                try await h.publish("dispatch.request", #"{"id":"t-1","input":"the agm agenda"}"#)
                try await Task.sleep(for: .milliseconds(800))
                kill(first.processIdentifier, SIGKILL)
                await silent.stop()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let events = try await h.events(quiet: .seconds(3))
                let history = states(events, "t-1")
                #expect(history.first == "drafted" && history.last == "replied")
                #expect(history.filter { ["replied", "failed", "cancelled"].contains($0) }.count == 1)
                let s = seqs(events, "t-1")
                #expect(s == s.sorted() && Set(s).count == s.count, "seq only grows: \(s)")
                await agent.stop()
            }
        }

        /// RabbitMQ does not enforce `exclusive` on a quorum queue's consumers:
        /// leadership must come from the count, with one leader among replicas
        /// started at the same instant and one added later.
        @Test func threeReplicasHaveExactlyOneLeader() async throws {
            try await withHarness("sender-one-leader") { h in
                async let a = h.startSender()
                async let b = h.startSender()
                _ = try await (a, b)
                try await h.startSender()
                func leaders() async throws -> UInt32 {
                    try await h.channel.queueDeclare("frontdesk.sender.leader", passive: true).consumerCount
                }
                try await Task.sleep(for: .seconds(3))
                #expect(try await leaders() == 1)
                try await Task.sleep(for: .seconds(2))
                #expect(try await leaders() == 1)
            }
        }

        @Test func anAgentThatDisappearsPutsTheDispatchBackInQueued() async throws {
            try await withHarness("sender-agent-gone") { h in
                try await h.startRouter()
                try await h.startSender()
                let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
                try await Task.sleep(for: .milliseconds(800))
                try await h.publish("dispatch.request", #"{"id":"g-1","input":"the agm agenda"}"#)
                try await Task.sleep(for: .milliseconds(800))
                await silent.stop()
                var events = try await h.events()
                #expect(states(events, "g-1") == ["drafted", "routing", "sending", "queued"])
                let queued = events.last { $0["dispatchId"] as? String == "g-1" }
                #expect((queued?["queue"] as? [String: Any])?["reason"] as? String == "agent_offline")
                #expect(queued?["attempt"] as? Int == 2)
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                events = try await h.events()
                #expect(states(events, "g-1") == ["sending", "sending", "sending", "replied"])
                #expect(await agent.tasks.all.compactMap(\.properties.messageID).contains("g-1/2"))
                await agent.stop()
            }
        }

        @Test func anAgentThatAcceptsThenFallsSilentTimesOut() async throws {
            try await withHarness("sender-accept-silent") { h in
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .acceptThenSilent)
                try await h.startRouter()
                try await h.startSender(extraEnvironment: [
                    "FRONTDESK_REPLY_TIMEOUT_S": "1", "FRONTDESK_RETRY_BASE_MS": "200", "FRONTDESK_MAX_ATTEMPTS": "2",
                ])
                try await Task.sleep(for: .milliseconds(800))
                try await h.publish("dispatch.request", #"{"id":"as-1","input":"the agm agenda"}"#)
                let events = try await h.events(quiet: .seconds(3))
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
                try await h.startSender(extraEnvironment: ["FRONTDESK_LIFETIME_S": "3"])
                try await Task.sleep(for: .milliseconds(800))
                let started = Date()
                try await h.publish("dispatch.request", #"{"id":"ae-1","input":"the agm agenda"}"#)
                let events = try await h.events(quiet: .seconds(6))
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
                let events = try await h.events(quiet: .seconds(6))
                #expect(states(events, "e-1") == ["drafted", "routing", "queued", "failed"])
                expectExpiredOnTime(events, "e-1", started: started, lifetime: 3)
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
            try await Task.sleep(for: .milliseconds(800))
            try await h.publish("dispatch.request", #"{"id":"rk-1","input":"the agm agenda"}"#)
            try await Task.sleep(for: .milliseconds(700))
            kill(first.processIdentifier, SIGKILL)
            try await h.startSender(extraEnvironment: env)
            let events = try await h.events(quiet: .seconds(4))
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
            try await h.startSender()
            for i in 0..<10 { try await h.publish("dispatch.request", #"{"id":"br-\#(i)","input":"the agm agenda \#(i)"}"#) }
            var events = try await h.events()
            for i in 0..<10 { #expect(states(events, "br-\(i)") == ["drafted", "routing", "queued"]) }
            try TestBroker.script(["restart"])
            try await h.reconnect()
            // The services come back by themselves; then an agent appears.
            try await Task.sleep(for: .seconds(3))
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            events = try await h.events(quiet: .seconds(3))
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
            try await h.startSender(extraEnvironment: ["FRONTDESK_RETRY_BASE_MS": "30000", "FRONTDESK_RETRY_MAX_MS": "30000"])
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .retryableError)
            try await Task.sleep(for: .milliseconds(800))
            let started = Date()
            try await h.publish("dispatch.request", #"{"id":"rx-1","input":"the agm agenda"}"#)
            let events = try await h.events(quiet: .seconds(7))
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
            try await Task.sleep(for: .milliseconds(500))
            try await h.startSender()  // standby
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .slowStream)
            try await Task.sleep(for: .milliseconds(800))
            try await h.publish("dispatch.request", #"{"id":"mr-1","input":"the agm agenda"}"#)
            try await Task.sleep(for: .milliseconds(900))  // mid-stream
            kill(first.processIdentifier, SIGKILL)
            let deliveries = try await h.drain(h.statusQueue, quiet: .seconds(4))
            let events = deliveries.map { try! JSONSerialization.jsonObject(with: $0.body) as! [String: Any] }
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
