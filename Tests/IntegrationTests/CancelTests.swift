import AMQP
import Foundation
import FrontDeskModel
import Testing

extension BrokerIntegration {
    /// CONTRACT.md: `cancelled` within 1 s of the cancel reaching the broker,
    /// in every state; a reroute's new `queued` event within 1 s.
    @Suite("Cancel and reroute at any instant", .timeLimit(.minutes(2)))
    struct CancelTests {
        func states(_ events: [[String: Any]], _ id: String) -> [String] {
            events.filter { $0["dispatchId"] as? String == id }.compactMap { $0["state"] as? String }
        }

        /// Publishes a cancel (confirmed by the broker), waits for `cancelled`
        /// and checks it arrived within 1 s of the confirm.
        func cancelWithinOneSecond(_ h: RouterHarness, _ id: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
            try await h.publish("dispatch.cancel", #"{"id":"\#(id)","reason":"user"}"#)
            let confirmed = ContinuousClock.now
            _ = try await h.events(until: id, reaches: "cancelled", within: .seconds(5))
            let at = try #require(h.arrival(of: id, "cancelled"), sourceLocation: sourceLocation)
            #expect(at - confirmed < .seconds(1), "cancelled \(at - confirmed) after the cancel", sourceLocation: sourceLocation)
        }

        @Test func aCancelEndsTheDispatchWithinOneSecondInEveryState() async throws {
            try await withHarness("cancel-states") { h in
                try await h.startRouter()
                let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_RETRY_BASE_MS": "20000", "FRONTDESK_RETRY_MAX_MS": "20000"])
                try await h.waitUntilLeading(sender)

                // Queued for a target without agents, right after its queued event.
                try await h.publish("dispatch.request", #"{"id":"cs-queued","input":"the agm agenda"}"#)
                _ = try await h.events(until: "cs-queued", reaches: "queued")
                try await cancelWithinOneSecond(h, "cs-queued")

                // Routing: the cancel follows its request at once.
                try await h.publish("dispatch.request", #"{"id":"cs-routing","input":"the agm agenda"}"#)
                try await cancelWithinOneSecond(h, "cs-routing")

                // With an agent that never answers.
                let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .silent)
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"cs-agent","input":"the contract","project":"acme","target":"legal"}"#)
                _ = try await h.events(until: "cs-agent", reaches: "sending")
                try await cancelWithinOneSecond(h, "cs-agent")
                await silent.stop()

                // Waiting 20 s for a retry.
                let failing = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .retryableError)
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"cs-retry","input":"the contract","project":"acme","target":"legal"}"#)
                let wait = try await h.events(until: "cs-retry", reaches: "queued")
                #expect(((wait.last { $0["dispatchId"] as? String == "cs-retry" }?["queue"]) as? [String: Any])?["reason"] as? String == "retry_wait")
                try await cancelWithinOneSecond(h, "cs-retry")
                #expect(await failing.tasks.all.compactMap(\.properties.messageID).filter { $0.hasPrefix("cs-retry/") } == ["cs-retry/1"])
                await failing.stop()
            }
        }

        @Test func aRerouteShowsAtOnceAndACancelUnderANewLeaderEndsItWithoutItsAgent() async throws {
            try await withHarness("reroute-cancel-takeover") { h in
                try await h.startRouter()
                let first = try await h.startSender()
                try await h.waitUntilLeading(first)
                try await h.publish("dispatch.request", #"{"id":"rc-1","input":"the agm agenda"}"#)
                try await h.publish("dispatch.request", #"{"id":"rc-2","input":"the agm agenda"}"#)
                _ = try await h.events("both queued") { $0.filter { $0["state"] as? String == "queued" }.count >= 2 }

                // The reroute's queued event, with the new route, within 1 s.
                try await h.publish("dispatch.reroute", #"{"id":"rc-1","project":"acme","target":"legal"}"#)
                let sent = ContinuousClock.now
                let moved = try await h.events("rc-1 queued at acme/legal", within: .seconds(5)) { events in
                    events.contains { $0["dispatchId"] as? String == "rc-1" && ($0["target"] as? [String: Any])?["id"] as? String == "legal" }
                }
                let queued = try #require(moved.last { $0["dispatchId"] as? String == "rc-1" })
                #expect(queued["state"] as? String == "queued" && (queued["project"] as? [String: Any])?["id"] as? String == "acme")
                #expect(ContinuousClock.now - sent < .seconds(1))

                // A new leader knows both wait, from the log alone: each cancel acts at once.
                kill(first.processIdentifier, SIGKILL)
                let second = try await h.startSender()
                try await h.waitUntilLeading(second)
                try await cancelWithinOneSecond(h, "rc-1")
                try await cancelWithinOneSecond(h, "rc-2")

                // Their copies surface when agents come, and are dropped: no task for either.
                let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntil("both park queues are empty") {
                    let a = try await h.messages("frontdesk.sender.park.yemaya.board-prep")
                    let b = try await h.messages("frontdesk.sender.park.acme.legal")
                    return a == 0 && b == 0
                }
                // A later dispatch for the same target is delivered: the dropped copies were seen.
                try await h.publish("dispatch.request", #"{"id":"rc-3","input":"the contract","project":"acme","target":"legal"}"#)
                let after = try await h.events(untilEnded: "rc-3")
                #expect(states(after, "rc-3").last == "replied")
                #expect(states(after, "rc-1").isEmpty && states(after, "rc-2").isEmpty)
                #expect(await board.tasks.all.isEmpty)
                #expect(await legal.tasks.all.compactMap(\.properties.correlationID) == ["rc-3"])
                await board.stop()
                await legal.stop()
            }
        }
    }
}

extension BrokerIntegration {
    /// CONTRACT.md, Untrusted input: properties and values a hostile or
    /// merely unusual producer sets change nothing they should not.
    @Suite("Untrusted properties and values", .timeLimit(.minutes(2)))
    struct UntrustedInputTests {
        @Test func hostilePropertiesNeitherStallNorCrashNorForgeReplies() async throws {
            try await withHarness("hostile-properties") { h in
                try await h.startRouter()
                let first = try await h.startSender()
                try await h.waitUntilLeading(first)
                let hostile = RouterHarness.hostileProperties
                // A cancel for an id not seen yet, with every property set: remembered in the commands stream.
                try await h.publish("dispatch.cancel", #"{"id":"hp-later","reason":"user"}"#, properties: hostile)
                try await h.waitUntil("the cancel is remembered") {
                    try await h.metrics(first).contains("frontdesk_sender_commands_total{kind=\"remembered\"} 1")
                }
                // A new leader replays it (a timestamp of 2^64 − 1 once trapped here) and applies it.
                kill(first.processIdentifier, SIGKILL)
                let second = try await h.startSender()
                try await h.waitUntilLeading(second)
                try await h.publish("dispatch.request", #"{"id":"hp-later","input":"the agm agenda"}"#, properties: hostile)
                var events = try await h.events(untilEnded: "hp-later")
                #expect(events.last { $0["dispatchId"] as? String == "hp-later" }?["state"] as? String == "cancelled")
                // A request with the producer's own user_id and CC to the replies queue goes through as usual.
                try await h.publish("dispatch.request", #"{"id":"hp-1","input":"the agm agenda"}"#, properties: hostile)
                events = try await h.events(until: "hp-1", reaches: "queued")
                try await h.publish("dispatch.cancel", #"{"id":"hp-1","reason":"user"}"#, properties: hostile)
                _ = try await h.events(untilEnded: "hp-1")
                // No forged copy of a command reached the agents' replies queue (the
                // sender would have dead-lettered it as no reply), and nothing was refused.
                #expect(try await h.messages("frontdesk.replies") == 0)
                #expect(try await h.messages("frontdesk.dead") == 0)
            }
        }

        @Test func aCreatedAtFarAheadCountsAsIntakeTimeAndParks() async throws {
            try await withHarness("future-created-at") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                try await h.waitUntilLeading(sender)
                let intake = Date()
                try await h.publish("dispatch.request", #"{"id":"fa-1","input":"the agm agenda","createdAt":"2100-01-01T00:00:00.000Z"}"#)
                try await h.publish("dispatch.request", #"{"id":"fa-2","input":"the agm agenda"}"#)
                let events = try await h.events("both queued") { $0.filter { $0["state"] as? String == "queued" }.count >= 2 }
                let queued = try #require(events.first { $0["dispatchId"] as? String == "fa-1" && $0["state"] as? String == "queued" })
                let expires = try #require((queued["expiresAt"] as? String).flatMap { ISO8601DateFormatter.withFractions.date(from: $0) })
                #expect(expires.timeIntervalSince(intake) <= 14_400 + 5)
                #expect(try await h.messages("frontdesk.sender.park.yemaya.board-prep") == 2)
            }
        }

        @Test func aParkedDispatchExpiresOnTimeBehindOneThatLivesLonger() async throws {
            // A park queue expires a message only at its head: the 4-hour one
            // in front would hold the short one back for hours.
            try await withHarness("expiry-behind") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                try await h.waitUntilLeading(sender)
                try await h.publish("dispatch.request", #"{"id":"long-1","input":"the agm agenda"}"#)
                _ = try await h.events(until: "long-1", reaches: "queued")
                let created = RFC3339.format(Date().addingTimeInterval(-14_400 + 2))
                try await h.publish("dispatch.request", #"{"id":"short-1","input":"the agm agenda","createdAt":"\#(created)"}"#)
                let events = try await h.events(until: "short-1", reaches: "failed", within: .seconds(15))
                let failed = try #require(events.first { $0["dispatchId"] as? String == "short-1" && $0["state"] as? String == "failed" })
                #expect((failed["error"] as? [String: Any])?["code"] as? String == "expired")
                let expires = try #require((failed["expiresAt"] as? String).flatMap { ISO8601DateFormatter.withFractions.date(from: $0) })
                let at = try #require((failed["at"] as? String).flatMap { ISO8601DateFormatter.withFractions.date(from: $0) })
                #expect(at.timeIntervalSince(expires) >= 0 && at.timeIntervalSince(expires) <= 5, "expired \(at.timeIntervalSince(expires)) s after expiresAt")
                #expect(!events.contains { $0["dispatchId"] as? String == "long-1" })  // the long one waits on
                // The leader's successor knows it ended, too: its copy, when it surfaces, is dropped.
                kill(sender.processIdentifier, SIGKILL)
                sender.waitUntilExit()
                let next = try await h.startSender()
                try await h.waitUntilLeading(next)
                try await h.publish("dispatch.cancel", #"{"id":"long-1"}"#)
                let after = try await h.events(until: "long-1", reaches: "cancelled")
                #expect(!after.contains { $0["dispatchId"] as? String == "short-1" }, "a second end for short-1")
            }
        }
    }
}

extension BrokerIntegration.CancelTests {
    /// A dispatch parked, then delivered by a leader that died with it in
    /// flight: the waiting record of before is out of date, and a reroute
    /// under the next leader must change nothing (CONTRACT.md: once
    /// delivered, a reroute changes nothing).
    @Test func aRerouteAfterATakeoverOfADeliveredDispatchChangesNothing() async throws {
        try await withHarness("reroute-after-delivery") { h in
            try await h.startRouter()
            let first = try await h.startSender()
            try await h.waitUntilLeading(first)
            try await h.publish("dispatch.request", #"{"id":"rd-1","input":"the agm agenda"}"#)
            _ = try await h.events(until: "rd-1", reaches: "queued")
            let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
            _ = try await h.events(until: "rd-1", reaches: "sending")
            kill(first.processIdentifier, SIGKILL)
            await silent.stop()
            let second = try await h.startSender()
            try await h.waitUntilLeading(second)
            try await h.publish("dispatch.reroute", #"{"id":"rd-1","project":"acme","target":"legal"}"#)
            let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
            let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            let events = try await h.events(untilEnded: "rd-1")
            let ended = try #require(events.last { $0["dispatchId"] as? String == "rd-1" })
            #expect(ended["state"] as? String == "replied")
            #expect((ended["target"] as? [String: Any])?["id"] as? String == "board-prep")
            #expect(!events.contains { $0["dispatchId"] as? String == "rd-1" && ($0["target"] as? [String: Any])?["id"] as? String == "legal" })
            #expect(await legal.tasks.all.isEmpty)
            await legal.stop()
            await board.stop()
        }
    }

    /// The same, and its agent gone for good: the lease is back in a park
    /// queue nobody reads while the target is offline. A cancel under the next
    /// leader still ends it within 1 s, numbered above what the log shows.
    @Test func aCancelAfterATakeoverOfADeliveredDispatchWhoseAgentLeftEndsItAtOnce() async throws {
        try await withHarness("cancel-after-delivery") { h in
            try await h.startRouter()
            let first = try await h.startSender()
            try await h.waitUntilLeading(first)
            try await h.publish("dispatch.request", #"{"id":"cd-1","input":"the agm agenda"}"#)
            _ = try await h.events(until: "cd-1", reaches: "queued")
            let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
            let before = try await h.events(until: "cd-1", reaches: "sending")
            kill(first.processIdentifier, SIGKILL)
            await silent.stop()
            let second = try await h.startSender()
            try await h.waitUntilLeading(second)
            let sent = ContinuousClock.now
            try await h.publish("dispatch.cancel", #"{"id":"cd-1","reason":"user"}"#)
            let events = try await h.events(until: "cd-1", reaches: "cancelled", within: .seconds(5))
            let took = ContinuousClock.now - sent
            #expect(took < .seconds(1), "cancelled after \(took)")
            let lastBefore = before.filter { $0["dispatchId"] as? String == "cd-1" }.compactMap { $0["seq"] as? Int }.max() ?? 0
            let cancelled = try #require(events.first { $0["dispatchId"] as? String == "cd-1" && $0["state"] as? String == "cancelled" })
            #expect((cancelled["seq"] as? Int ?? 0) > lastBefore)
            // When an agent comes, nothing reaches it: the lease is dropped.
            let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            try await h.waitUntil("the park queue drained") { try await h.messages("frontdesk.sender.park.yemaya.board-prep") == 0 }
            #expect(await board.tasks.all.isEmpty)
            await board.stop()
        }
    }
}

extension BrokerIntegration.UntrustedInputTests {
    /// CONTRACT.md: /readyz is 200 only while the broker is not blocking the
    /// service's publishes with a resource alarm; work resumes when it clears.
    @Test func aResourceAlarmMakesTheRouterUnreadyUntilItClears() async throws {
        try await withHarness("alarm") { h in
            let first = try await h.startRouter()  // declares the topology
            first.terminate()
            first.waitUntilExit()
            try await h.publish("dispatch.request", #"{"id":"al-1","input":"the agm agenda"}"#)
            try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.000001"])
            defer { _ = try? TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"]) }
            // Started under the alarm: it takes the request, its publishes are blocked.
            let router = try await h.start("frontdesk-router", extraEnvironment: [:], waitUntilReady: false)
            // The broker says the router's connection is blocked (it tried to publish), and so does /readyz.
            try await h.waitUntil("the broker blocks the router's own connection") {
                // (client_properties last: it holds the connection's name, the alarm probe's "… (alarm probe)".)
                let rows = try TestBroker.script(["ctl", "list_connections", "vhost", "state", "client_properties", "--silent"])
                return rows.split(separator: "\n").contains {
                    $0.hasPrefix(h.vhost + "\tblocked\t") && !$0.contains("(alarm probe)")
                }
            }
            #expect(await h.probe(router, "/readyz") == 503)
            #expect(await h.probe(router, "/healthz") == 200)
            _ = try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"])
            try await h.waitUntil("/readyz answers 200 once it cleared") { await h.probe(router, "/readyz") == 200 }
            let events = try await h.events(until: "al-1", reaches: "routing")
            #expect(events.filter { $0["dispatchId"] as? String == "al-1" }.compactMap { $0["state"] as? String } == ["drafted", "routing"])
        }
    }

    /// A service whose own connection the broker blocks stops at once on
    /// SIGTERM, and cleanly: the broker reads nothing from that connection,
    /// so a cancel or close would be answered only once the alarm clears.
    /// What it held goes back to its queue and is handled after the alarm.
    @Test func aServiceTheBrokerBlocksStopsAtOnce() async throws {
        try await withHarness("alarm-stop") { h in
            // Four partitions: the sender writes a heartbeat every 250 ms, so it publishes during the alarm too.
            let partitions = ["FRONTDESK_SENDER_PARTITIONS": "4"]
            let first = try await h.startRouter(extraEnvironment: partitions)  // declares the topology
            first.terminate()
            first.waitUntilExit()
            let sender = try await h.startSender(extraEnvironment: partitions)
            try await h.publish("dispatch.request", #"{"id":"as-1","input":"the agm agenda"}"#)
            try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.000001"])
            defer { _ = try? TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"]) }
            // Started under the alarm: it takes the request, its publishes are blocked.
            let router = try await h.start("frontdesk-router", extraEnvironment: partitions, waitUntilReady: false)
            try await h.waitUntil("the broker blocks the router's and the sender's own connections", within: .seconds(15)) {
                // (client_properties last: it holds the connection's name, the alarm probe's "… (alarm probe)".)
                let rows = try TestBroker.script(["ctl", "list_connections", "vhost", "state", "client_properties", "--silent"])
                let blocked = rows.split(separator: "\n").filter { $0.hasPrefix(h.vhost + "\tblocked\t") && !$0.contains("(alarm probe)") }
                return blocked.contains { $0.contains("frontdesk-router") } && blocked.contains { $0.contains("frontdesk-sender") }
            }
            for p in [router, sender] {
                let stopping = ContinuousClock.now
                p.terminate()
                p.waitUntilExit()
                let took = ContinuousClock.now - stopping
                #expect(p.terminationStatus == 0)
                // (An RPC waiting on a block rabbitmq-c has not yet passed on is cut short after 5 s.)
                #expect(took < .seconds(8), "\(p === router ? "router" : "sender") stopped in \(took)")
            }
            // The router's connection was dropped for the stop, not replaced: only it lingers, until the broker reads again.
            let rows = try TestBroker.script(["ctl", "list_connections", "vhost", "client_properties", "--silent"])
            let routers = rows.split(separator: "\n").filter {
                $0.hasPrefix(h.vhost + "\t") && $0.contains("frontdesk-router@") && !$0.contains("(alarm probe)")
            }
            #expect(routers.count <= 1, "\(routers.count) router connections left")
            _ = try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"])
            // Nothing was lost: the request the blocked router held is routed by the next one.
            _ = try await h.startRouter(extraEnvironment: partitions)
            let events = try await h.events(until: "as-1", reaches: "routing", within: .seconds(30))
            let states = events.filter { $0["dispatchId"] as? String == "as-1" }.compactMap { $0["state"] as? String }
            #expect(Set(states) == ["drafted", "routing"], "\(states)")
        }
    }
}

extension BrokerIntegration.UntrustedInputTests {
    /// RabbitMQ tells a connection of an alarm only once it publishes: idle
    /// services learn of it from their alarm probe, and /readyz says so.
    @Test func aResourceAlarmMakesIdleServicesUnreadyUntilItClears() async throws {
        try await withHarness("alarm-idle") { h in
            let router = try await h.startRouter()
            let sender = try await h.startSender()
            let gateway = try await h.startGateway()
            let services = [router, sender, gateway.process]
            for p in services { #expect(await h.probe(p, "/readyz") == 200) }
            try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.000001"])
            defer { _ = try? TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"]) }
            try await h.waitUntil("every idle service unready", within: .seconds(15)) {
                var codes: [Int] = []
                for p in services { codes.append(await h.probe(p, "/readyz")) }
                return codes == [503, 503, 503]
            }
            for p in services { #expect(await h.probe(p, "/healthz") == 200) }
            // A service stopped under the alarm exits at once, and cleanly: its probe's blocked connection
            // (the broker reads nothing from it, a close included) holds nothing up.
            let extra = try await h.start("frontdesk-sender", extraEnvironment: [:], waitUntilReady: false)
            try await h.waitUntil("the new sender unready too", within: .seconds(15)) { await h.probe(extra, "/readyz") == 503 }
            let stopping = ContinuousClock.now
            extra.terminate()
            extra.waitUntilExit()
            #expect(extra.terminationStatus == 0)
            #expect(ContinuousClock.now - stopping < .seconds(6), "stopped in \(ContinuousClock.now - stopping)")
            _ = try TestBroker.script(["ctl", "set_vm_memory_high_watermark", "0.4"])
            try await h.waitUntil("every service ready once it cleared", within: .seconds(15)) {
                var codes: [Int] = []
                for p in services { codes.append(await h.probe(p, "/readyz")) }
                return codes == [200, 200, 200]
            }
            // Their own connections were never blocked: work goes on at once.
            try await h.publish("dispatch.request", #"{"id":"ai-1","input":"the agm agenda"}"#)
            let events = try await h.events(until: "ai-1", reaches: "queued")
            #expect(events.filter { $0["dispatchId"] as? String == "ai-1" }.compactMap { $0["state"] as? String } == ["drafted", "routing", "queued"])
        }
    }
}

extension BrokerIntegration.UntrustedInputTests {
    /// CONTRACT.md: one target's agents — slow, silent, or holding hundreds
    /// of tasks — never delay another target's dispatches.
    /// Sends `count` requests for acme/legal (ids `<prefix>-0` …) and waits until the sender has taken
    /// each (`sending` or `queued`): the events so far.
    @discardableResult
    func sendToLegalUntilTaken(_ h: RouterHarness, _ prefix: String, count: Int) async throws -> [[String: Any]] {
        for i in 0..<count {
            try await h.publish("dispatch.request", #"{"id":"\#(prefix)-\#(i)","input":"the contract","project":"acme","target":"legal"}"#)
        }
        return try await h.events("all \(count) taken by the sender", within: .seconds(60)) { events in
            Set(events.filter { ["sending", "queued"].contains($0["state"] as? String ?? "") }.compactMap { $0["dispatchId"] as? String }).count >= count
        }
    }

    /// A routing table of ten targets in one project: legal and idle-1 … idle-9 (shares of 25 in the inbox window).
    func tenTargets(_ h: RouterHarness) throws -> String {
        let idle = (1...9).map { #"{"id":"idle-\#($0)","name":"Idle \#($0)"}"# }.joined(separator: ",")
        let table = #"{"projects":[{"id":"acme","name":"Acme Corp","targets":[{"id":"legal","name":"Legal"},"# + idle + "]}]}"
        let tableFile = FileManager.default.temporaryDirectory.appendingPathComponent("routes-ten-\(h.vhost).json").path
        try table.write(toFile: tableFile, atomically: true, encoding: .utf8)
        return tableFile
    }

    /// Its share of the inbox window (500 / (2 × 10 targets) = 25) bounds a
    /// target only while the window is busy: a lone busy target's burst goes
    /// straight to its online agent while the window's spare is free, none
    /// of it `queued` as if offline.
    @Test func aLoneBusyTargetIsNotParkedBehindItsShare() async throws {
        try await withHarness("lone-target") { h in
            let tableFile = try tenTargets(h)
            defer { try? FileManager.default.removeItem(atPath: tableFile) }
            try await h.startRouter(extraEnvironment: ["FRONTDESK_ROUTES": tableFile])
            let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_ROUTES": tableFile])
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .silent)
            try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
            let events = try await sendToLegalUntilTaken(h, "lone", count: 100)
            let queued = events.filter { $0["state"] as? String == "queued" }.compactMap { $0["dispatchId"] as? String }
            #expect(queued.isEmpty, "\(queued.count) queued though the agent was online")
            try await h.waitUntil("the agent holds all 100 tasks") { await agent.tasks.all.count == 100 }
            await agent.stop()
        }
    }

    /// Answers `task` with a final reply, as its agent would: its slot frees. Returns its dispatch id.
    @discardableResult
    func replyFinal(_ h: RouterHarness, to task: AMQPDelivery) async throws -> String {
        let body = try #require(try JSONSerialization.jsonObject(with: task.body) as? [String: Any])
        let id = try #require(body["dispatchId"] as? String)
        let reply = try JSONSerialization.data(withJSONObject: ["dispatchId": id, "attempt": body["attempt"] as? Int ?? 1, "kind": "final", "text": "done"])
        try await h.channel.publish(
            exchange: "", routingKey: "frontdesk.replies", body: reply,
            properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: id))
        return id
    }

    /// A dispatch parked because its target had no room keeps its place: a
    /// newer one that comes just as a slot frees does not overtake it, though
    /// the sender's poll of the park queue (every 300 ms) may not have counted
    /// it yet. Four targets, each filled until one dispatch parks (the first
    /// takes its share and the window's spare, 125; the others their share,
    /// 25); then at once one slot frees (a final reply) and one more comes.
    @Test func aParkedDispatchIsNotOvertakenWhenASlotFrees() async throws {
        try await withHarness("park-fifo") { h in
            let tableFile = try tenTargets(h)
            defer { try? FileManager.default.removeItem(atPath: tableFile) }
            try await h.startRouter(extraEnvironment: ["FRONTDESK_ROUTES": tableFile])
            let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_ROUTES": tableFile])
            var agents: [TestAgent] = []
            var raced = 0
            for (trial, target) in ["legal", "idle-1", "idle-2", "idle-3"].enumerated() {
                // (Each agent stays: one that left would give its slots back.)
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.\(target)", behaviour: .silent)
                agents.append(agent)
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/\(target)")
                let count = trial == 0 ? 126 : 26
                for i in 0..<count {
                    try await h.publish("dispatch.request", #"{"id":"fifo-\#(trial)-\#(i)","input":"the contract","project":"acme","target":"\#(target)"}"#)
                }
                let parked = "fifo-\(trial)-\(count - 1)"
                try await h.waitUntil("\(parked) queued", within: .seconds(30)) { h.arrival(of: parked, "queued") != nil }
                // At once: a slot frees, and a newer dispatch comes.
                try await replyFinal(h, to: try #require(await agent.tasks.all.first))
                let late = "fifo-\(trial)-late"
                let lateAt = ContinuousClock.now
                try await h.publish("dispatch.request", #"{"id":"\#(late)","input":"the contract","project":"acme","target":"\#(target)"}"#)
                // The parked one reaches the agent (sending) first; the newer one waits
                // behind it in the park queue, and follows (parked copies have slots of their own).
                try await h.waitUntil("\(parked) and \(late) sent", within: .seconds(10)) {
                    h.arrival(of: parked, "sending") != nil && h.arrival(of: late, "sending") != nil
                }
                let parkedSent = try #require(h.arrival(of: parked, "sending"))
                let lateSent = try #require(h.arrival(of: late, "sending"))
                #expect(parkedSent < lateSent, "trial \(trial): \(late) was sent \(parkedSent - lateSent) before \(parked)")
                // The race was on: the parked one still waited when the newer one came (and so the newer one waited too).
                if parkedSent > lateAt {
                    raced += 1
                    #expect(h.arrival(of: late, "queued") != nil, "trial \(trial): \(late) went straight past \(parked)")
                }
            }
            // (The sender's poll may find a park before the slot frees; most trials race.)
            #expect(raced >= 2, "only \(raced) of 4 trials raced")
            // Once the parked ones have surfaced, the sender counts them no more: with a slot
            // free, the next dispatch goes straight to the agent (a park counted too long would queue it).
            let id = try await replyFinal(h, to: try #require(await agents[3].tasks.all.dropFirst().first))
            try await h.waitUntil("\(id) replied") { h.arrival(of: id, "replied") != nil }
            // (The poll no longer counts them either.)
            try await h.waitUntil("the poll finds idle-3's park queue empty") {
                try await h.metrics(sender).split(separator: "\n").contains("frontdesk_sender_parked{target=\"acme/idle-3\"} 0")
            }
            try await h.publish("dispatch.request", #"{"id":"fifo-after","input":"the contract","project":"acme","target":"idle-3"}"#)
            try await h.waitUntil("fifo-after sent or queued") { (h.arrival(of: "fifo-after", "sending") ?? h.arrival(of: "fifo-after", "queued")) != nil }
            #expect(h.arrival(of: "fifo-after", "queued") == nil, "a dispatch with room and nothing parked ahead was queued")
            for agent in agents { await agent.stop() }
        }
    }

    /// With ten targets a silent one takes its share and the spare (150 of
    /// 500 slots): another target's dispatch is still served at once, and a
    /// cancel still wins within a second.
    @Test func aSilentTargetWithTheSpareTooDelaysNoOtherTargetNorACancel() async throws {
        try await withHarness("isolation-ten") { h in
            let tableFile = try tenTargets(h)
            defer { try? FileManager.default.removeItem(atPath: tableFile) }
            try await h.startRouter(extraEnvironment: ["FRONTDESK_ROUTES": tableFile])
            let sender = try await h.startSender(extraEnvironment: ["FRONTDESK_ROUTES": tableFile])
            let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .silent)
            let other = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.idle-1")
            try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
            try await h.waitUntilSenderSeesAgents(sender, on: "acme/idle-1")
            try await sendToLegalUntilTaken(h, "iso10", count: 600)
            let line = try await h.metrics(sender).split(separator: "\n").first { $0.hasPrefix("frontdesk_sender_window_held{window=\"inbox\"}") }
            #expect(line.flatMap { Double($0.split(separator: " ").last ?? "") } == 125, "the silent target holds the spare: \(line ?? "none")")
            var started = ContinuousClock.now
            try await h.publish("dispatch.request", #"{"id":"iso10-other","input":"the agenda","project":"acme","target":"idle-1"}"#)
            let replied = try await h.events(untilEnded: "iso10-other")
            #expect(replied.last { $0["dispatchId"] as? String == "iso10-other" }?["state"] as? String == "replied")
            #expect(ContinuousClock.now - started < .seconds(2), "the other target's dispatch took \(ContinuousClock.now - started)")
            // A dispatch in flight with the silent agent is cancelled at once.
            started = ContinuousClock.now
            try await h.publish("dispatch.cancel", #"{"id":"iso10-3","reason":"user"}"#)
            _ = try await h.events(until: "iso10-3", reaches: "cancelled", within: .seconds(5))
            #expect(ContinuousClock.now - started < .seconds(1), "cancelled after \(ContinuousClock.now - started)")
            await silent.stop()
            await other.stop()
        }
    }

    @Test func aSilentAgentHoldingHundredsOfTasksDelaysNoOtherTarget() async throws {
        try await withHarness("isolation") { h in
            try await h.startRouter()
            let sender = try await h.startSender()
            let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .silent)
            let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
            try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
            // More than the sender's whole inbox window (500) for the silent target.
            try await sendToLegalUntilTaken(h, "iso", count: 600)
            let started = ContinuousClock.now
            try await h.publish("dispatch.request", #"{"id":"iso-other","input":"the agm agenda"}"#)
            let events = try await h.events(untilEnded: "iso-other")
            #expect(events.last { $0["dispatchId"] as? String == "iso-other" }?["state"] as? String == "replied")
            #expect(ContinuousClock.now - started < .seconds(2), "the other target's dispatch took \(ContinuousClock.now - started)")
            // The silent target's backlog with its agents is bounded, and measured.
            let metrics = try await h.metrics(sender)
            let line = metrics.split(separator: "\n").first { $0.hasPrefix("frontdesk_sender_in_flight{target=\"acme/legal\"}") }
            let inFlight = line.flatMap { Double($0.split(separator: " ").last ?? "") } ?? -1
            #expect(inFlight > 0 && inFlight < 600, "in flight at acme/legal: \(inFlight)")
            await silent.stop()
            await board.stop()
        }
    }
}

extension BrokerIntegration.UntrustedInputTests {
    /// The router and the sender under logins of their own, with no
    /// FRONTDESK_ROUTER_USER: hand-offs, cancels and reroutes come through
    /// frontdesk.sender.handoff, which only the services write to, and count.
    @Test func aRouterUnderAnotherLoginIsTrustedThroughTheHandOffExchange() async throws {
        try await withHarness("logins") { h in
            let login = "router-\(UUID().uuidString.prefix(6).lowercased())"
            try RouterHarness.ctl(["add_user", login, "secret-\(login)"])
            defer { try? RouterHarness.ctl(["delete_user", login]) }
            try RouterHarness.ctl(["set_permissions", "-p", h.vhost, login, ".*", ".*", ".*"])
            try await h.startRouter(extraEnvironment: ["AMQP_URL": "amqp://\(login):secret-\(login)@\(h.url.host):\(h.url.port)/\(h.vhost)"])
            let sender = try await h.startSender()
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
            try await h.publish("dispatch.request", #"{"id":"login-1","input":"the agm agenda"}"#)
            let events = try await h.events(untilEnded: "login-1")
            #expect(events.last { $0["dispatchId"] as? String == "login-1" }?["state"] as? String == "replied")
            await agent.stop()
            // A cancel through the router reaches a dispatch held by a silent agent.
            let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .silent)
            try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
            try await h.publish("dispatch.request", #"{"id":"login-2","input":"the contract","project":"acme","target":"legal"}"#)
            _ = try await h.events(until: "login-2", reaches: "sending")
            try await h.publish("dispatch.cancel", #"{"id":"login-2","reason":"user"}"#)
            let ended = try await h.events(untilEnded: "login-2")
            #expect(ended.last { $0["dispatchId"] as? String == "login-2" }?["state"] as? String == "cancelled")
            let rejected = try await h.metrics(sender).split(separator: "\n")
                .first { $0.hasPrefix("frontdesk_sender_rejected_total{queue=\"frontdesk.sender.inbox\"}") }
            #expect(rejected == nil || rejected?.hasSuffix(" 0") == true, "\(rejected ?? "")")
            await silent.stop()
        }
    }

    /// Agents may publish to the default exchange (their replies go there),
    /// so they can put a message in any queue by name. Messages in the
    /// services' internal queues count only when a service wrote them.
    @Test func messagesForgedIntoInternalQueuesChangeNothing() async throws {
        try await withHarness("forged") { h in
            let intruder = "intruder-\(UUID().uuidString.prefix(6))"
            try RouterHarness.ctl(["add_user", intruder, "secret-\(intruder)"])
            defer { try? RouterHarness.ctl(["delete_user", intruder]) }
            // An agent's rights: write to the default exchange, nothing else.
            try RouterHarness.ctl(["set_permissions", "-p", h.vhost, intruder, "^$", "^amq\\.default$", "^$"])
            try await h.startRouter()
            let sender = try await h.startSender()
            try await h.waitUntilLeading(sender)
            try await h.publish("dispatch.request", #"{"id":"real-1","input":"the agm agenda"}"#)
            _ = try await h.events(until: "real-1", reaches: "queued")

            var url = h.url
            url.user = intruder
            url.password = "secret-\(intruder)"
            let connection = try await AMQPConnection.connect(.init(url: url, connectionName: "intruder"))
            let channel = try await connection.openChannel()
            func forge(_ queue: String, _ body: Data, type: String, id: String, asUser: Bool) async throws {
                try await channel.publish(
                    exchange: "", routingKey: queue, body: body,
                    properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: id,
                                               messageID: "\(id)/forged", type: type, userID: asUser ? intruder : nil))
            }
            let handOff = BrokerIntegration.SenderTests().handOff("forged-1")
            try await forge("frontdesk.sender.inbox", handOff, type: "frontdesk.handoff.dispatch.v1", id: "forged-1", asUser: true)
            try await forge("frontdesk.sender.inbox", handOff, type: "frontdesk.handoff.dispatch.v1", id: "forged-1", asUser: false)
            try await forge("frontdesk.sender.inbox", Data(#"{"id":"real-1","reason":"forged"}"#.utf8), type: "frontdesk.handoff.cancel.v1", id: "real-1", asUser: false)
            // A waiting record claiming a newer copy of real-1: the real copy must not look superseded.
            var record = try #require(try JSONSerialization.jsonObject(with: handOff) as? [String: Any])
            record["id"] = "real-1"
            let copy: [String: Any] = [
                "record": record, "project": ["id": "yemaya", "name": "Yemaya", "glyph": "YE"], "target": ["id": "board-prep", "name": "Board Prep"],
                "attempt": 1, "everDelivered": false, "lastSeq": 2_000_000_000, "stepReached": 1,
            ]
            try await forge("frontdesk.status.log", try JSONSerialization.data(withJSONObject: copy), type: "frontdesk.sender.waiting.v1", id: "real-1", asUser: true)
            // A parked copy of a dispatch nobody sent.
            var fake = copy
            var fakeRecord = record
            fakeRecord["id"] = "forged-2"
            fake["record"] = fakeRecord
            fake["lastSeq"] = 3
            try await forge("frontdesk.sender.park.yemaya.board-prep", try JSONSerialization.data(withJSONObject: fake), type: "frontdesk.sender.parked.v1", id: "forged-2", asUser: true)
            // A decision record claiming the id of a request still to come.
            try await forge("frontdesk.router.decisions", Data("{}".utf8), type: "frontdesk.router.decision.v1", id: "real-2", asUser: true)
            // A status event put in the log by name, claiming the sender published for it already.
            try await channel.publish(
                exchange: "", routingKey: "frontdesk.status.log", body: Data("{}".utf8),
                properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: "real-2",
                                           messageID: "real-2/99", type: "frontdesk.status.v1", userID: intruder))
            await connection.close()

            try await h.waitUntil("the sender drops the three forged hand-offs and commands") {
                try await h.metrics(sender).contains("frontdesk_sender_rejected_total{queue=\"frontdesk.sender.inbox\"} 3")
            }
            // Dead-lettered with the reason: a misconfigured login would lose nothing silently.
            let dead = try await h.drain("frontdesk.dead", count: 3)
            #expect(dead.count == 3 && dead.allSatisfy {
                $0.properties.headers?["x-frontdesk-service"]?.stringValue == "frontdesk-sender"
                    && ($0.properties.headers?["x-frontdesk-reason"]?.stringValue ?? "").contains("takes only messages the services wrote")
            })
            // A new leader reads the log, with the forged record in it.
            kill(sender.processIdentifier, SIGKILL)
            let second = try await h.startSender()
            try await h.waitUntilLeading(second)
            try await h.publish("dispatch.request", #"{"id":"real-2","input":"the agm agenda"}"#)
            let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
            let events = try await h.events(untilEnded: "real-1", "real-2")
            for id in ["real-1", "real-2"] {
                #expect(events.last { $0["dispatchId"] as? String == id }?["state"] as? String == "replied", "\(id)")
            }
            #expect(!events.contains { ["forged-1", "forged-2"].contains($0["dispatchId"] as? String ?? "") })
            #expect(await agent.tasks.all.compactMap(\.properties.correlationID).allSatisfy { $0.hasPrefix("real-") })
            try await h.waitUntil("the new leader drops the forged parked copy") {
                try await h.metrics(second).contains("frontdesk_sender_rejected_total{queue=\"frontdesk.sender.park.yemaya.board-prep\"} 1")
            }
            await agent.stop()
        }
    }
}
