import AMQP
import Foundation
import FrontDeskModel
import Testing

extension BrokerIntegration {
    /// The sender split into partitions by route (FRONTDESK_SENDER_PARTITIONS):
    /// replicas share them, hand them over as replicas come and go, and a
    /// dispatch moved to another partition by a reroute is still cancelled at once.
    @Suite("Partitioned senders", .timeLimit(.minutes(3)))
    struct PartitionTests {
        static let partitions = ["FRONTDESK_SENDER_PARTITIONS": "4"]

        /// How many partitions replica `p` says it leads.
        func led(_ h: RouterHarness, _ p: Process) async throws -> Int {
            let line = try await h.metrics(p).split(separator: "\n").first { $0.hasPrefix("frontdesk_sender_partitions_led ") }
            return line.flatMap { Double($0.split(separator: " ").last ?? "") }.map { Int($0) } ?? -1
        }

        func waitUntilLed(_ h: RouterHarness, _ replicas: [Process], _ counts: [Int]) async throws {
            try await h.waitUntil("the replicas lead \(counts) partitions", within: .seconds(40)) {
                var got: [Int] = []
                for p in replicas { got.append(try await led(h, p)) }
                return got == counts
            }
        }

        /// Dispatches to both routes (partitions 0 and 1 of 4) all the way
        /// through: 1, 2 and 4 replicas joining, then one killed; each
        /// dispatch shows one reply, its seqs rising (an event comes twice
        /// only as the same message, which a surface drops).
        /// Replies all come to partition 0; a reply over the limit for partition 1's dispatch
        /// goes there as the error it is, and the dispatch fails at once.
        @Test func aReplyOverTheLimitForAnotherPartitionsDispatchFailsItAtOnce() async throws {
            try await withHarness("partitions-oversized") { h in
                try await h.startRouter(extraEnvironment: Self.partitions)
                let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal", behaviour: .oversizedFinal)
                let sender = try await h.startSender(extraEnvironment: Self.partitions)
                try await waitUntilLed(h, [sender], [4])
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"pbig-1","input":"the agm agenda","project":"acme","target":"legal"}"#)
                let events = try await h.events(untilEnded: "pbig-1").filter { $0["dispatchId"] as? String == "pbig-1" }
                #expect(events.map { $0["state"] as? String } == ["drafted", "routing", "sending", "sending", "failed"])
                let error = try #require(events.last?["error"] as? [String: Any])
                #expect(error["code"] as? String == "agent_error" && (error["message"] as? String ?? "").contains("over the limit of 262144"))
                let dead = try await h.drain("frontdesk.dead", count: 1)
                #expect(dead.first?.properties.headers?["x-frontdesk-error"]?.stringValue == "too_large")
                await legal.stop()
            }
        }

        @Test func replicasShareThePartitionsAndNothingIsLostAsTheyComeAndGo() async throws {
            try await withHarness("partitions-scale") { h in
                #expect(SenderPartitions(count: 4).partition(of: .init(project: "yemaya", target: "board-prep")) == 0)
                #expect(SenderPartitions(count: 4).partition(of: .init(project: "acme", target: "legal")) == 1)
                try await h.startRouter(extraEnvironment: Self.partitions)
                let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                var replicas = [try await h.startSender(extraEnvironment: Self.partitions)]
                try await waitUntilLed(h, replicas, [4])

                var ids: [String] = []
                func send(_ n: Int) async throws {
                    for _ in 0..<n {
                        let id = "ps-\(ids.count)"
                        ids.append(id)
                        let hint = ids.count % 2 == 0 ? #""project":"yemaya","target":"board-prep""# : #""project":"acme","target":"legal""#
                        try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"the agm agenda",\#(hint)}"#)
                    }
                }
                try await send(20)
                replicas.append(try await h.startSender(extraEnvironment: Self.partitions))
                try await send(20)
                try await waitUntilLed(h, replicas, [2, 2])
                try await send(20)
                replicas.append(try await h.startSender(extraEnvironment: Self.partitions))
                replicas.append(try await h.startSender(extraEnvironment: Self.partitions))
                try await send(20)
                try await waitUntilLed(h, replicas, [1, 1, 1, 1])
                // The replica leading partition 0 (the replies' and board-prep's) killed in the middle of a run.
                // A replica counts a partition as led once it holds its lock, before its term has
                // caught up with the log and taken its first presence snapshot, so the counts above
                // may come before any replica shows board-prep's agent.
                var killed: Process?
                try await h.waitUntil("a replica shows board-prep's agent", within: .seconds(10)) {
                    killed = nil
                    for p in replicas {
                        if try await h.metrics(p).contains("frontdesk_sender_agents{target=\"yemaya/board-prep\"} 1") { killed = p }
                    }
                    return killed != nil
                }
                let victim = try #require(killed)
                try await send(10)
                kill(victim.processIdentifier, SIGKILL)
                replicas.removeAll { $0 === victim }
                try await send(30)
                // All four led, none of the three idle (the share alone, ⌈4 / 3⌉ = 2, left them at 2, 2, 0 once).
                try await h.waitUntil("the three replicas lead 1, 1 and 2 partitions", within: .seconds(40)) {
                    var counts: [Int] = []
                    for p in replicas { counts.append(try await led(h, p)) }
                    return counts.sorted() == [1, 1, 2]
                }

                let events = try await h.events("all \(ids.count) dispatches ended", within: .seconds(60)) { events in
                    let ended = Set(events.filter { RouterHarness.terminal.contains($0["state"] as? String ?? "") }.compactMap { $0["dispatchId"] as? String })
                    return ids.allSatisfy(ended.contains)
                }
                for id in ids {
                    // A replica killed between an event's confirm and its
                    // lease's ack: the next leader publishes the event again,
                    // the same message, which a surface drops.
                    let (shown, strays) = RouterHarness.shown(events.filter { $0["dispatchId"] as? String == id })
                    let ends = shown.filter { RouterHarness.terminal.contains($0["state"] as? String ?? "") }
                    #expect(ends.count == 1 && ends.first?["state"] as? String == "replied", "\(id): \(ends.map { $0["state"] ?? "" })")
                    #expect(strays.isEmpty, "\(id): events out of order or changed on a repeat: \(strays)")
                }
                await board.stop()
                await legal.stop()
            }
        }

        /// Two replicas leading two partitions each, then a third: nobody is
        /// above its share (⌈4 / 3⌉ = 2) and nothing is unclaimed, so the
        /// third stayed idle for good. Now a leader gives one up to it.
        @Test func aThirdReplicaJoiningTwoAtTheirShareGetsAPartition() async throws {
            try await withHarness("partitions-third") { h in
                try await h.startRouter(extraEnvironment: Self.partitions)
                var replicas = [try await h.startSender(extraEnvironment: Self.partitions)]
                replicas.append(try await h.startSender(extraEnvironment: Self.partitions))
                try await waitUntilLed(h, replicas, [2, 2])
                replicas.append(try await h.startSender(extraEnvironment: Self.partitions))
                try await h.waitUntil("the three replicas lead 1, 1 and 2 partitions", within: .seconds(40)) {
                    var counts: [Int] = []
                    for p in replicas { counts.append(try await led(h, p)) }
                    return counts.sorted() == [1, 1, 2]
                }
            }
        }

        /// A router still on one partition (the senders changed first, as
        /// deploy/README says): its hand-offs all reach partition 0, which
        /// passes the others' on; nothing waits for an agent that is online.
        @Test func handOffsOfARouterWithOnePartitionArePassedOn() async throws {
            try await withHarness("partitions-mismatch") { h in
                try await h.startRouter()
                let a = try await h.startSender(extraEnvironment: Self.partitions)
                try await waitUntilLed(h, [a], [4])
                // Led is counted once a lock is held; the hand-off needs
                // partition 0's term too, past its takeover read.
                try await h.waitUntil("the four terms begun", within: .seconds(40)) { try await h.terms(a) ?? 0 >= 4 }
                let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                try await h.waitUntilSenderSeesAgents(a, on: "acme/legal")
                try await h.publish("dispatch.request", #"{"id":"pm-1","input":"the contract","project":"acme","target":"legal"}"#)
                let events = try await h.events(untilEnded: "pm-1")
                let states = events.filter { $0["dispatchId"] as? String == "pm-1" }.compactMap { $0["state"] as? String }
                #expect(states.last == "replied" && !states.contains("queued"), "\(states)")
                #expect(await legal.tasks.all.compactMap(\.properties.correlationID) == ["pm-1"])
                await legal.stop()
            }
        }

        /// Two replicas, board-prep (partition 0) and legal (partition 1):
        /// a reroute moves a waiting dispatch across partitions within 1 s,
        /// a cancel then ends it within 1 s, and nothing of it reaches an agent.
        @Test func aRerouteAcrossPartitionsAndACancelAfterItActAtOnce() async throws {
            try await withHarness("partitions-reroute") { h in
                try await h.startRouter(extraEnvironment: Self.partitions)
                let a = try await h.startSender(extraEnvironment: Self.partitions)
                let b = try await h.startSender(extraEnvironment: Self.partitions)
                try await waitUntilLed(h, [a, b], [2, 2])
                for round in 0..<4 {
                    let id = "pr-\(round)"
                    try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"the agm agenda"}"#)
                    _ = try await h.events(until: id, reaches: "queued")
                    try await h.publish("dispatch.reroute", #"{"id":"\#(id)","project":"acme","target":"legal"}"#)
                    // Round 0: the cancel right behind the reroute (partition 1 may take
                    // both before partition 0 moves the dispatch there); later rounds
                    // once the move shows, and a moment after.
                    if round > 0 {
                        let sent = ContinuousClock.now
                        _ = try await h.events("\(id) queued at acme/legal", within: .seconds(5)) { events in
                            events.contains { $0["dispatchId"] as? String == id && ($0["target"] as? [String: Any])?["id"] as? String == "legal" }
                        }
                        #expect(ContinuousClock.now - sent < .seconds(1))
                        // The cancel's instant varies (a stimulus, not a wait for a condition).
                        try await Task.sleep(for: .milliseconds(300 * (round - 1)))
                    }
                    try await h.publish("dispatch.cancel", #"{"id":"\#(id)","reason":"user"}"#)
                    let confirmed = ContinuousClock.now
                    let after = try await h.events(until: id, reaches: "cancelled", within: .seconds(5))
                    let at = try #require(h.arrival(of: id, "cancelled"))
                    #expect(at - confirmed < .seconds(1), "\(id) cancelled \(at - confirmed) after the cancel")
                    #expect(after.filter { $0["dispatchId"] as? String == id && RouterHarness.terminal.contains($0["state"] as? String ?? "") }.count == 1)
                }
                // Rerouted to another partition and back: the last reroute holds (a
                // copy of the first, passed on between partitions, must not undo it).
                try await h.publish("dispatch.request", #"{"id":"pr-back","input":"the agm agenda"}"#)
                _ = try await h.events(until: "pr-back", reaches: "queued")
                func queuedAt(_ target: String) async throws {
                    _ = try await h.events("pr-back queued at \(target)", within: .seconds(5)) { events in
                        events.last { $0["dispatchId"] as? String == "pr-back" }.map {
                            $0["state"] as? String == "queued" && ($0["target"] as? [String: Any])?["id"] as? String == target
                        } ?? false
                    }
                }
                try await h.publish("dispatch.reroute", #"{"id":"pr-back","project":"acme","target":"legal"}"#)
                try await queuedAt("legal")
                try await h.publish("dispatch.reroute", #"{"id":"pr-back","project":"yemaya","target":"board-prep"}"#)
                try await queuedAt("board-prep")
                // Every copy of the two reroutes taken (each partition's inbox empty): still at board-prep.
                try await h.waitUntil("every partition's inbox is empty") {
                    var total: UInt32 = 0
                    for k in 0..<4 { total += try await h.messages(k == 0 ? "frontdesk.sender.inbox" : "frontdesk.sender.inbox.\(k)") }
                    return total == 0
                }
                let all = RouterHarness.decode(h.statusEvents.since(0).0.map(\.delivery))
                let last = all.last { $0["dispatchId"] as? String == "pr-back" }
                #expect(last?["state"] as? String == "queued" && (last?["target"] as? [String: Any])?["id"] as? String == "board-prep")

                // A dispatch to legal replies through partition 0's pass-on; the cancelled copies reach no agent.
                let legal = try await TestAgent(url: h.url, queue: "frontdesk.agent.acme.legal")
                let board = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                try await h.publish("dispatch.request", #"{"id":"pr-live","input":"the contract","project":"acme","target":"legal"}"#)
                let events = try await h.events(untilEnded: "pr-live", "pr-back")
                #expect(events.last { $0["dispatchId"] as? String == "pr-live" }?["state"] as? String == "replied")
                let back = events.filter { $0["dispatchId"] as? String == "pr-back" }
                #expect(back.last?["state"] as? String == "replied" && (back.last?["target"] as? [String: Any])?["id"] as? String == "board-prep")
                #expect(back.filter { RouterHarness.terminal.contains($0["state"] as? String ?? "") }.count == 1)
                try await h.waitUntil("the park queues are empty") {
                    let legalParked = try await h.messages("frontdesk.sender.park.acme.legal")
                    let boardParked = try await h.messages("frontdesk.sender.park.yemaya.board-prep")
                    return legalParked == 0 && boardParked == 0
                }
                #expect(await legal.tasks.all.compactMap(\.properties.correlationID) == ["pr-live"])
                #expect(await board.tasks.all.compactMap(\.properties.correlationID) == ["pr-back"])
                // Only the leader of partition 0 consumes the contract's reply queue.
                #expect(try await h.consumers("frontdesk.replies") == 1)
                await legal.stop()
                await board.stop()
            }
        }
    }
}
