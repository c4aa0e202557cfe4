import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    @Suite("Sender end to end", .timeLimit(.minutes(2)))
    struct SenderTests {
        /// (state, seq) of a dispatch's events, in arrival order.
        func history(_ events: [[String: Any]], _ id: String) -> [String] {
            events.filter { $0["dispatchId"] as? String == id }.map { "\($0["state"] as! String)" }
        }

        @Test func onlineAgentGetsTheTaskAndTheReplyStreamsToReplied() async throws {
            try await withHarness("sender-online") { h in
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                try await h.startRouter()
                let sender = try await h.startSender()
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.publish("dispatch.request", #"{"id":"s-1","input":"Reply to Lisa about the AGM agenda — short, confirm 14:00"}"#)
                let events = try await h.events(untilEnded: "s-1")
                let mine = events.filter { $0["dispatchId"] as? String == "s-1" }
                #expect(mine.map { $0["state"] as? String } == ["drafted", "routing", "sending", "sending", "sending", "replied"])
                let seqs = mine.compactMap { $0["seq"] as? Int }
                #expect(seqs == seqs.sorted() && Set(seqs).count == seqs.count)
                let progress = mine[4]
                #expect(progress["etaMs"] as? Int == 2000 && progress["activity"] as? String == "Drafting reply")
                #expect(progress["preview"] as? [String] == ["Hi Lisa, confirmed for 14:00 on Thursday.", "The agenda"])
                #expect(mine.last?["reply"] as? String == "Hi Lisa, confirmed for 14:00 on Thursday.\nThe agenda is attached.")
                #expect(mine.last?["step"] as? Int == 3)
                let tasks = await agent.tasks.all
                #expect(tasks.count == 1)
                #expect(tasks.first?.properties.messageID == "s-1/1" && tasks.first?.properties.replyTo == "frontdesk.replies")
                await agent.stop()
            }
        }

        @Test func offlineTargetQueuesAndDispatchesByItselfOnReconnect() async throws {
            try await withHarness("sender-offline") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                try await h.publish("dispatch.request", #"{"id":"q-1","input":"the agm agenda"}"#)
                try await h.publish("dispatch.request", #"{"id":"q-2","input":"the agm minutes"}"#)
                var events = try await h.events("both queued") { $0.filter { $0["state"] as? String == "queued" }.count >= 2 }
                #expect(history(events, "q-1") == ["drafted", "routing", "queued"])
                let queued = events.first { $0["dispatchId"] as? String == "q-1" && $0["state"] as? String == "queued" }
                #expect((queued?["queue"] as? [String: Any])?["reason"] as? String == "agent_offline")
                #expect(queued?["etaMs"] == nil && queued?["attempt"] as? Int == 1)
                // A target without agents has its park queue counted every tenth poll (3 s).
                try await h.waitUntil("the gauge counts both parked", within: .seconds(6)) {
                    try await h.metrics(sender).split(separator: "\n").contains("frontdesk_sender_parked{target=\"yemaya/board-prep\"} 2")
                }
                let started = ContinuousClock.now
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                events = try await h.events(untilEnded: "q-1", "q-2")
                #expect(history(events, "q-1") == ["sending", "sending", "sending", "replied"])
                #expect(history(events, "q-2") == ["sending", "sending", "sending", "replied"])
                // First in, first out.
                let tasks = await agent.tasks.all.map { $0.properties.correlationID }
                #expect(tasks == ["q-1", "q-2"])
                #expect(ContinuousClock.now - started < .seconds(5))
                await agent.stop()
            }
        }

        @Test func cancelEndsADispatchBeforeAndAfterItArrives() async throws {
            try await withHarness("sender-cancel") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                // Before its request: remembered and applied on arrival.
                try await h.publish("dispatch.cancel", #"{"id":"c-early","reason":"changed my mind"}"#)
                try await h.waitUntil("the cancel is remembered") {
                    try await h.metrics(sender).contains("frontdesk_sender_commands_total{kind=\"remembered\"} 1")
                }
                try await h.publish("dispatch.request", #"{"id":"c-early","input":"the agm agenda"}"#)
                // In flight with an agent that never answers.
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .silent)
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"c-live","input":"the contract","project":"acme","target":"legal"}"#)
                var events = try await h.events("c-early cancelled, c-live sending") { events in
                    events.contains { $0["dispatchId"] as? String == "c-early" && $0["state"] as? String == "cancelled" }
                        && events.contains { $0["dispatchId"] as? String == "c-live" && $0["state"] as? String == "sending" }
                }
                try await h.publish("dispatch.cancel", #"{"id":"c-live","reason":"user"}"#)
                events += try await h.events(untilEnded: "c-live")
                #expect(history(events, "c-early") == ["drafted", "routing", "cancelled"])
                #expect(history(events, "c-live") == ["drafted", "routing", "sending", "cancelled"])
                let cancelled = events.first { $0["dispatchId"] as? String == "c-early" && $0["state"] as? String == "cancelled" }
                #expect((cancelled?["cancel"] as? [String: Any])?["reason"] as? String == "changed my mind")
                await agent.stop()
            }
        }

        @Test func retryableErrorsRetryWithBackoffThenFail() async throws {
            try await withHarness("sender-retry") { h in
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .retryableError)
                try await h.startRouter()
                let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_RETRY_BASE_MS": "200", "FRONTDESK_MAX_ATTEMPTS": "3"])
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                try await h.publish("dispatch.request", #"{"id":"r-1","input":"the agm agenda"}"#)
                let events = try await h.events(untilEnded: "r-1")
                #expect(history(events, "r-1") == ["drafted", "routing", "sending", "queued", "sending", "queued", "sending", "failed"])
                let waits = events.filter { $0["state"] as? String == "queued" }
                #expect(waits.allSatisfy { ($0["queue"] as? [String: Any])?["reason"] as? String == "retry_wait" })
                #expect(waits.map { $0["attempt"] as? Int } == [2, 3])
                #expect((events.last?["error"] as? [String: Any])?["code"] as? String == "retries_exhausted")
                #expect(await agent.tasks.all.map(\.properties.messageID) == ["r-1/1", "r-1/2", "r-1/3"])
                await agent.stop()
            }
        }
    }
}

extension BrokerIntegration.SenderTests {
    @Test func aReplyOverTheLimitFailsItsDispatchAtOnceWithTheReason() async throws {
        try await withHarness("sender-oversized-reply") { h in
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .oversizedFinal)
            try await h.startRouter()
            let sender = try await h.startSender()  // the reply timeout is 600 s: the test's 2 minutes would not see it
            try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
            try await h.publish("dispatch.request", #"{"id":"big-1","input":"Reply to Lisa about the AGM agenda"}"#)
            let events = try await h.events(untilEnded: "big-1").filter { $0["dispatchId"] as? String == "big-1" }
            #expect(events.map { $0["state"] as? String } == ["drafted", "routing", "sending", "sending", "failed"])
            let error = try #require(events.last?["error"] as? [String: Any])
            #expect(error["code"] as? String == "agent_error")
            #expect((error["message"] as? String ?? "").contains("over the limit of 262144"))
            let dead = try await h.drain("frontdesk.dead", count: 1)
            #expect(dead.first?.properties.headers?["x-frontdesk-error"]?.stringValue == "too_large")
            #expect(await agent.tasks.all.count == 1, "not retried: the next attempt would write the same")
            await agent.stop()
        }
    }

    @Test func repliesThatAreNoRepliesAreDeadLetteredWithTheReason() async throws {
        try await withHarness("sender-bad-replies") { h in
            let sender = try await h.startSender()
            try await h.waitUntilLeading(sender)
            let bodies = [
                "{not json", #"{"attempt":1,"kind":"final"}"#, #"{"dispatchId":"r-1","attempt":1,"kind":"maybe"}"#,
                #"{"dispatchId":"r-1","attempt":1e300,"kind":"final"}"#, #"{"dispatchId":"r-1","attempt":-9223372036854775808,"kind":"final"}"#,
                // A well-formed reply for a dispatch nobody holds: ignored, not dead-lettered.
                #"{"dispatchId":"nobody","attempt":1,"kind":"final","text":"late"}"#,
            ]
            for body in bodies {
                try await h.channel.publish(
                    exchange: "", routingKey: "frontdesk.replies", body: Data(body.utf8),
                    properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: "r-1"))
            }
            // Replies are versioned like every message; and a body past the limit is too large.
            let final = #"{"dispatchId":"r-1","attempt":1,"kind":"final","text":"v2"}"#
            try await h.channel.publish(
                exchange: "", routingKey: "frontdesk.replies", body: Data(final.utf8),
                properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: "r-1", type: "frontdesk.reply.v2"))
            let huge = #"{"dispatchId":"r-1","attempt":1,"kind":"final","text":""# + String(repeating: "x", count: 300_000) + #""}"#
            try await h.channel.publish(
                exchange: "", routingKey: "frontdesk.replies", body: Data(huge.utf8),
                properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: "r-1"))
            let dead = try await h.drain("frontdesk.dead", count: 7)
            #expect(dead.map { $0.properties.headers?["x-frontdesk-error"]?.stringValue ?? "?" }.sorted()
                == ["invalid_json", "invalid_request", "invalid_request", "invalid_request", "invalid_request", "too_large", "unsupported_version"])
            for d in dead {
                let headers = try #require(d.properties.headers)
                #expect(headers["x-frontdesk-service"]?.stringValue == "frontdesk-sender")
                #expect(headers["x-frontdesk-routing-key"]?.stringValue == "frontdesk.replies")
                #expect((headers["x-frontdesk-reason"]?.stringValue ?? "").count > 10)
                #expect(d.properties.correlationID == "r-1")
            }
            #expect(Set(dead.map { String(decoding: $0.body, as: UTF8.self) }).isSuperset(of: Set(bodies.prefix(5))))
            // Each was acked: with the sender gone, none comes back to the queue.
            kill(sender.processIdentifier, SIGKILL)
            sender.waitUntilExit()
            try await h.waitUntil("the replies queue has no consumer") { try await h.consumers("frontdesk.replies") == 0 }
            #expect(try await h.messages("frontdesk.replies") == 0)
        }
    }

    @Test func cancelOfAParkedDispatchEndsItAtOnce() async throws {
        try await withHarness("sender-cancel-parked") { h in
            try await h.startRouter()
            try await h.startSender()
            for i in 0..<5 { try await h.publish("dispatch.request", #"{"id":"cp-\#(i)","input":"the agm agenda"}"#) }
            _ = try await h.events("5 queued") { $0.filter { $0["state"] as? String == "queued" }.count >= 5 }
            try await h.publish("dispatch.cancel", #"{"id":"cp-2","reason":"user"}"#)
            var events = try await h.events(untilEnded: "cp-2")
            #expect(history(events, "cp-2") == ["cancelled"])
            #expect(events.first?["step"] as? Int == 1)
            // The others still wait, in order, and only they reach the agent.
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            events = try await h.events(untilEnded: "cp-0", "cp-1", "cp-3", "cp-4")
            #expect(await agent.tasks.all.compactMap(\.properties.correlationID) == ["cp-0", "cp-1", "cp-3", "cp-4"])
            #expect(history(events, "cp-2").isEmpty)
            await agent.stop()
        }
    }

    /// An agent that comes and goes while a dispatch waits for it: each time
    /// it comes, the parked dispatch goes to it; each time it goes, back to
    /// `queued`. The sender's park consumer reuses one channel for the
    /// target, so its connection's channels do not grow with the flips
    /// (they grew by one a flip, and 2,047 flips ended the term).
    @Test func anAgentThatComesAndGoesCostsTheSenderNoChannels() async throws {
        try await withHarness("sender-flapping") { h in
            try await h.startRouter()
            try await h.startSender()
            try await h.publish("dispatch.request", #"{"id":"fl-1","input":"the agm agenda"}"#)
            func count(_ events: [[String: Any]], _ state: String) -> Int {
                events.filter { $0["dispatchId"] as? String == "fl-1" && $0["state"] as? String == state }.count
            }
            _ = try await h.events("fl-1 queued") { count($0, "queued") >= 1 }
            func senderChannels() throws -> Int {
                let rows = try TestBroker.script(["ctl", "list_connections", "vhost", "client_properties", "channels", "--silent"])
                return rows.split(separator: "\n").filter {
                    $0.hasPrefix("\(h.vhost)\t") && $0.contains("\"frontdesk-sender@") && !$0.contains("(alarm probe)")
                }.compactMap { $0.split(separator: "\t").last.flatMap { Int($0) } }.reduce(0, +)
            }
            var before: Int?
            let flips = 4  // each lost agent costs an attempt: the fifth (the last) must reach one that stays
            for flip in 1...flips {
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
                // (Each wait sees the events that came since the one before.)
                _ = try await h.events("fl-1 sent to the agent, time \(flip)") { count($0, "sending") >= 1 }
                // Counted once the park consumer exists (its first channel is not a leak).
                if before == nil { before = try senderChannels() }
                await agent.stop()
                _ = try await h.events("fl-1 queued again, time \(flip)") { count($0, "queued") >= 1 }
            }
            let after = try senderChannels()
            #expect(try #require(before) > 0)
            #expect(after <= before! , "the sender's channels went from \(before!) to \(after) over \(flips) flips")
            // And the dispatch still reaches an agent that stays.
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            let events = try await h.events(untilEnded: "fl-1")
            #expect(history(events, "fl-1").last == "replied")
            await agent.stop()
        }
    }

    @Test func rerouteMovesAParkedDispatchAndNeverDeliversToTheOldTarget() async throws {
        try await withHarness("sender-reroute") { h in
            try await h.startRouter()
            try await h.startSender()
            let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
            try await h.publish("dispatch.request", #"{"id":"rr-1","input":"the agm agenda"}"#)
            var events = try await h.events(until: "rr-1", reaches: "queued")
            #expect(history(events, "rr-1") == ["drafted", "routing", "queued"])
            try await h.publish("dispatch.reroute", #"{"id":"rr-1","project":"acme","target":"legal"}"#)
            events = try await h.events(untilEnded: "rr-1")
            let moved = events.filter { $0["dispatchId"] as? String == "rr-1" }
            #expect(moved.map { $0["state"] as? String } == ["queued", "sending", "sending", "sending", "replied"])
            #expect((moved.first?["target"] as? [String: Any])?["id"] as? String == "legal")
            #expect(await legal.tasks.all.compactMap(\.properties.correlationID) == ["rr-1"])
            // The old target's agent arrives later and gets nothing.
            let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            // The stale copy in the old target's park queue is taken and dropped.
            try await h.waitUntil("the old park queue is empty") { try await h.messages("frontdesk.sender.park.yemaya.board-prep") == 0 }
            #expect(await board.tasks.all.isEmpty)
            await legal.stop()
            await board.stop()
        }
    }
}

extension BrokerIntegration.SenderTests {
    /// A hand-off as the router writes it (DispatchRecord), for a dispatch started now.
    func handOff(_ id: String) -> Data {
        let now = Date()
        let f = ISO8601DateFormatter.withFractions
        return Data("""
        {"id":"\(id)","bodyFingerprint":"x","outcome":"routed","input":"the agm agenda","invalid":false,
         "project":{"id":"yemaya","name":"Yemaya","glyph":"YE"},"target":{"id":"board-prep","name":"Board Prep"},
         "route":{"confidence":1,"reason":"test","alternatives":[]},
         "startedAt":"\(f.string(from: now))","decidedAt":"\(f.string(from: now))",
         "expiresAt":"\(f.string(from: now.addingTimeInterval(3600)))","lastSeq":2}
        """.utf8)
    }

    @Test func aDuplicateHandOffIsDroppedWhileParkedAndAfterItFinished() async throws {
        try await withHarness("sender-dup-handoff") { h in
            let sender = try await h.startSender()
            // As the router writes it: with the broker-validated user_id of a service login.
            let properties = AMQPProperties(contentType: "application/json", deliveryMode: 2, type: "frontdesk.handoff.dispatch.v1", userID: h.url.user)
            for _ in 0..<2 {
                try await h.channel.publish(exchange: "", routingKey: "frontdesk.sender.inbox", body: handOff("dup-1"), properties: properties)
            }
            var events = try await h.events(until: "dup-1", reaches: "queued")
            #expect(history(events, "dup-1") == ["queued"])
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            events = try await h.events(untilEnded: "dup-1")
            #expect(history(events, "dup-1") == ["sending", "sending", "sending", "replied"])
            try await h.channel.publish(exchange: "", routingKey: "frontdesk.sender.inbox", body: handOff("dup-1"), properties: properties)
            // The second copy while parked was the first duplicate; this is the second.
            try await h.waitUntil("the sender drops the duplicate") {
                try await h.metrics(sender).contains("frontdesk_sender_dispatches_total{state=\"duplicate\"} 2")
            }
            events = try await h.events { _ in true }
            #expect(history(events, "dup-1").isEmpty)
            #expect(await agent.tasks.all.count == 1)
            await agent.stop()
        }
    }
}

extension BrokerIntegration.SenderTests {
    @Test func aDuplicateHandOffUnderANewLeaderIsDroppedToo() async throws {
        try await withHarness("sender-dup-across-terms") { h in
            let first = try await h.startSender()
            // As the router writes it: with the broker-validated user_id of a service login.
            let properties = AMQPProperties(contentType: "application/json", deliveryMode: 2, type: "frontdesk.handoff.dispatch.v1", userID: h.url.user)
            try await h.channel.publish(exchange: "", routingKey: "frontdesk.sender.inbox", body: handOff("dup-2"), properties: properties)
            #expect(history(try await h.events(until: "dup-2", reaches: "queued"), "dup-2") == ["queued"])
            kill(first.processIdentifier, SIGKILL)
            let second = try await h.startSender()
            try await h.waitUntilLeading(second)
            try await h.channel.publish(exchange: "", routingKey: "frontdesk.sender.inbox", body: handOff("dup-2"), properties: properties)
            try await h.waitUntil("the new leader drops the duplicate") {
                try await h.metrics(second).contains("frontdesk_sender_dispatches_total{state=\"duplicate\"} 1")
            }
            #expect(history(try await h.events { _ in true }, "dup-2").isEmpty)
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            let events = try await h.events(untilEnded: "dup-2")
            #expect(history(events, "dup-2") == ["sending", "sending", "sending", "replied"])
            #expect(await agent.tasks.all.count == 1)
            await agent.stop()
        }
    }
}
