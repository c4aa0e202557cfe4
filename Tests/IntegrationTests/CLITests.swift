import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    @Suite("frontdesk command line", .timeLimit(.minutes(2)))
    struct CLITests {
        /// Runs `frontdesk` with `arguments` against the harness's vhost; returns exit status and stdout.
        func frontdesk(_ h: RouterHarness, _ arguments: [String], timeout: Duration = .seconds(20)) async throws -> (Int32, String) {
            let p = Process()
            p.executableURL = Bundle.main.executableURL!.deletingLastPathComponent().appendingPathComponent("frontdesk")
            p.arguments = arguments + ["--amqp-url", "amqp://guest:guest@\(h.url.host):\(h.url.port)/\(h.vhost)"]
            let out = FileManager.default.temporaryDirectory.appendingPathComponent("cli-\(UUID().uuidString)")
            _ = FileManager.default.createFile(atPath: out.path, contents: nil)
            defer { try? FileManager.default.removeItem(at: out) }
            p.standardOutput = try FileHandle(forWritingTo: out)
            p.standardError = FileHandle.nullDevice
            try p.run()
            let deadline = ContinuousClock.now + timeout
            while p.isRunning, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
            if p.isRunning { p.terminate() }
            // Waited for without blocking a thread of the pool, and killed if
            // SIGTERM does not end it (it may have been started with it ignored).
            let killAt = ContinuousClock.now + .seconds(5)
            while p.isRunning {
                if ContinuousClock.now >= killAt { kill(p.processIdentifier, SIGKILL) }
                try await Task.sleep(for: .milliseconds(50))
            }
            return (p.terminationStatus, try String(contentsOf: out, encoding: .utf8))
        }

        func agent(_ h: RouterHarness, _ target: String, _ extra: [String] = []) throws -> Process {
            let p = Process()
            p.executableURL = Bundle.main.executableURL!.deletingLastPathComponent().appendingPathComponent("frontdesk")
            p.arguments = ["agent", "--target", target, "--delay-ms", "50", "--amqp-url", "amqp://guest:guest@\(h.url.host):\(h.url.port)/\(h.vhost)"] + extra
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            try p.run()
            h.processes.append(p)
            return p
        }

        func states(_ jsonLines: String) -> [String] {
            jsonLines.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["state"] as? String
            }
        }

        @Test func dispatchFollowsTheSeedRequestToRepliedWithTheReferenceAgent() async throws {
            try await withHarness("cli-dispatch") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                _ = try agent(h, "yemaya/board-prep")
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let (status, out) = try await frontdesk(h, ["dispatch", "Reply to Lisa about the AGM agenda — short, confirm 14:00", "--json", "--id", "cli-1"])
                #expect(status == 0)
                let s = states(out)
                #expect(s.first == "drafted" && s.last == "replied" && s.contains("sending"))
                let last = try JSONSerialization.jsonObject(with: Data(out.split(separator: "\n").last!.utf8)) as? [String: Any]
                #expect((last?["reply"] as? String)?.contains("Confirmed for 14:00") == true)
                // watch replays it from the status log.
                let (_, watched) = try await frontdesk(h, ["watch", "status.yemaya.#", "--json"], timeout: .seconds(3))
                #expect(states(watched).suffix(1) == ["replied"])
                #expect(!states(watched).contains("drafted"))  // drafted is status._._.drafted: not in this pattern
                let (_, pushes) = try await frontdesk(h, ["watch", "--format", "apns"], timeout: .seconds(3))
                let lastPush = try JSONSerialization.jsonObject(with: Data(pushes.split(separator: "\n").last!.utf8)) as? [String: Any]
                let aps = lastPush?["aps"] as? [String: Any]
                #expect(aps?["event"] as? String == "end")
            }
        }

        @Test func theInstantAgentAnswersEveryTaskOnceAndLeavesNothingUnacked() async throws {
            try await withHarness("cli-instant") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let instant = try agent(h, "yemaya/board-prep", ["--instant"])
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                for i in 0..<200 {
                    try await h.publish("dispatch.request", #"{"id":"instant-\#(i)","input":"Reply to Lisa, confirm 9:30","project":"yemaya","target":"board-prep"}"#)
                }
                var replied: [String: String] = [:]
                let events = try await h.events("200 replied", within: .seconds(30)) { $0.filter { $0["state"] as? String == "replied" }.count >= 200 }
                for e in events where e["state"] as? String == "replied" {
                    #expect(replied[e["dispatchId"] as! String] == nil, "replied twice")
                    replied[e["dispatchId"] as! String] = e["reply"] as? String
                }
                #expect(replied.count == 200)
                #expect(replied["instant-7"]?.contains("Confirmed for 9:30") == true)
                // A task left unacked would be back in the queue once the agent is gone.
                kill(instant.processIdentifier, SIGKILL)
                instant.waitUntilExit()
                try await h.waitUntil("the agent's queue has no consumer") { try await h.consumers("frontdesk.agent.yemaya.board-prep") == 0 }
                let tasks = try await h.channel.queueDeclare("frontdesk.agent.yemaya.board-prep", passive: true)
                #expect(tasks.messageCount == 0)
            }
        }

        @Test func operatorsInspectDispatchesTargetsAndDeadLetters() async throws {
            try await withHarness("cli-operator") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                _ = try agent(h, "yemaya/board-prep")
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let (replied, _) = try await frontdesk(h, ["dispatch", "Reply to Lisa about the AGM agenda", "--json", "--id", "op-1"])
                #expect(replied == 0)
                let (detached, detachOut) = try await frontdesk(h, ["dispatch", "the contract", "--project", "acme", "--target", "legal", "--id", "op-2", "--detach", "--json"])
                #expect(detached == 0)
                #expect(detachOut.contains(#""id":"op-2""#))
                _ = try await h.events(until: "op-2", reaches: "queued")

                let (shown, show) = try await frontdesk(h, ["show", "op-1", "--json"])
                #expect(shown == 0)
                let showJSON = try JSONSerialization.jsonObject(with: Data(show.utf8)) as? [String: Any]
                #expect((showJSON?["latest"] as? [String: Any])?["state"] as? String == "replied")
                let seqs = (showJSON?["events"] as? [[String: Any]])?.compactMap { $0["seq"] as? Int } ?? []
                #expect(seqs == Array(1...max(1, seqs.count)) && seqs.count >= 4)
                #expect(try await frontdesk(h, ["show", "never-was"]).0 == 1)

                let (_, queued) = try await frontdesk(h, ["list", "--state", "queued", "--json"])
                let queuedIDs = ((try? JSONSerialization.jsonObject(with: Data(queued.utf8))) as? [[String: Any]])?.compactMap { $0["dispatchId"] as? String }
                #expect(queuedIDs == ["op-2"])
                let (_, board) = try await frontdesk(h, ["list", "--target", "yemaya/board-prep"])
                #expect(board.contains("op-1") && !board.contains("op-2"))

                let (_, targets) = try await frontdesk(h, ["targets", "--routes", h.tableFile, "--json"])
                let rows = (try? JSONSerialization.jsonObject(with: Data(targets.utf8))) as? [[String: Any]] ?? []
                #expect(rows.first { $0["target"] as? String == "board-prep" }?["online"] as? Bool == true)
                #expect(rows.first { $0["target"] as? String == "legal" }?["parked"] as? Int == 1)

                // A dead letter: listed in place, then replayed (dead again here: the body is still no JSON).
                try await h.channel.publish(
                    exchange: "frontdesk.commands", routingKey: "dispatch.request", body: Data("{nope".utf8),
                    properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, messageID: "dl-1"))
                try await h.waitUntil("the dead letter") { try await h.messages("frontdesk.dead") == 1 }
                let (_, listed) = try await frontdesk(h, ["dead", "list", "--json"])
                let letters = (try? JSONSerialization.jsonObject(with: Data(listed.utf8))) as? [[String: Any]] ?? []
                #expect(letters.count == 1 && letters.first?["messageId"] as? String == "dl-1" && letters.first?["code"] as? String == "invalid_json")
                try await h.waitUntil("the listed letter back in its queue") { try await h.messages("frontdesk.dead") == 1 }
                let (replayed, _) = try await frontdesk(h, ["dead", "replay", "dl-1"])
                #expect(replayed == 0)
                try await h.waitUntil("the replayed letter dead again") { try await h.messages("frontdesk.dead") == 1 }
                let (_, again) = try await frontdesk(h, ["dead", "list", "--json"])
                let second = (try? JSONSerialization.jsonObject(with: Data(again.utf8))) as? [[String: Any]] ?? []
                #expect(second.first?["replayedBy"] as? String == "guest")
                #expect(try await frontdesk(h, ["dead", "replay", "no-such-letter"]).0 == 1)
            }
        }

        @Test func everyCommandExplainsItselfAndRefusesUnknownOptions() async throws {
            try await withHarness("cli-usage") { h in
                try await h.startRouter()
                // Whatever reaches frontdesk.commands lands here too.
                try await h.channel.queueDeclare("frontdesk.test.commands", arguments: ["x-queue-type": "quorum"])
                try await h.channel.queueBind("frontdesk.test.commands", exchange: "frontdesk.commands", routingKey: "#")
                for command in ["dispatch", "show", "list", "targets", "cancel", "reroute", "watch", "dead", "route", "routes", "agent"] {
                    let (status, out) = try await frontdesk(h, [command, "-h"])
                    #expect(status == 0 && out.hasPrefix("usage: frontdesk \(command)"), "\(command) -h")
                }
                // -h anywhere is help: nothing is published.
                let (help, out) = try await frontdesk(h, ["cancel", "some-id", "-h"])
                #expect(help == 0 && out.contains("usage: frontdesk cancel"))
                #expect(try await frontdesk(h, ["cancel", "-x"]).0 == 2)
                #expect(try await frontdesk(h, ["cancel", "has space"]).0 == 2)
                #expect(try await frontdesk(h, ["list", "--state", "lost"]).0 == 2)
                #expect(try await frontdesk(h, ["--version"]).1.hasPrefix("frontdesk 1.1"))
                let (_, route) = try await frontdesk(h, ["route", "the AGM agenda for Lisa", "--json"])
                #expect((try? JSONSerialization.jsonObject(with: Data(route.utf8)) as? [String: Any])?["route"] as? String == "yemaya/board-prep")
                #expect(try await h.messages("frontdesk.test.commands") == 0, "nothing was published")
            }
        }

        @Test func aFailingAgentEndsTheDispatchWithExitOne() async throws {
            try await withHarness("cli-fail") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                _ = try agent(h, "acme/legal", ["--fail"])
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                let (status, out) = try await frontdesk(h, ["dispatch", "sign the contract", "--project", "acme", "--target", "legal", "--json"])
                #expect(status == 1)
                #expect(states(out).last == "failed")
                let (usage, _) = try await frontdesk(h, ["reroute", "only-an-id"])
                #expect(usage == 2)
            }
        }
    }
}

extension BrokerIntegration.CLITests {
    /// Runs a producer script against the harness's vhost; returns the ids it printed.
    func producer(_ h: RouterHarness, _ command: [String]) throws -> [String] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = command.map { $0.hasPrefix("deploy/") ? root.appendingPathComponent($0).path : $0 }
        var env = ProcessInfo.processInfo.environment
        env["AMQP_URL"] = "amqp://guest:guest@\(h.url.host):\(h.url.port)/\(h.vhost)"
        p.environment = env
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("producer-\(UUID().uuidString)")
        _ = FileManager.default.createFile(atPath: out.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: out) }
        p.standardOutput = try FileHandle(forWritingTo: out)
        p.standardError = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0, "\(command[0]) exited \(p.terminationStatus)")
        return try String(contentsOf: out, encoding: .utf8).split(separator: "\n").map(String.init)
    }

    @Test func producerScriptsPublishRequestsTheRouterAccepts() async throws {
        try await withHarness("producers") { h in
            try await h.startRouter()
            // Quotes, a backslash, a newline, a tab and a control character arrive unchanged.
            let text = "Reply to Lisa about the \"AGM\" agenda \\ confirm\n14:00\t\u{1}"
            let shell = try producer(h, ["bash", "deploy/producers/publish.sh", text, "3"])
            let python = try producer(h, ["python3", "deploy/producers/publish.py", "sign the NDA", "2", "--project", "acme", "--target", "legal"])
            #expect(shell.count == 3 && python.count == 2)
            let events = try await h.events("two events of each of 5") { $0.filter { $0["state"] as? String == "routing" }.count >= 5 }
            for id in shell { #expect(events.first { $0["dispatchId"] as? String == id }?["input"] as? String == text) }
            for id in shell + python {
                #expect(events.filter { $0["dispatchId"] as? String == id }.compactMap { $0["state"] as? String } == ["drafted", "routing"], "\(id)")
            }
            let legal = events.first { python.contains($0["dispatchId"] as? String ?? "") && $0["state"] as? String == "routing" }
            #expect((legal?["target"] as? [String: Any])?["id"] as? String == "legal")
        }
    }
}
