import AMQP
import Foundation
import Synchronization
import Testing

extension BrokerIntegration {
    /// Hundreds of dispatches with cancels and reroutes at random instants,
    /// agents that come and go, and the leading sender killed -9 in the
    /// middle: every history is whole, and every cancel of a dispatch not
    /// yet ended ends it within 1 s — also one sent while no sender leads
    /// (from the kill until the standby has taken over, measured and reported).
    @Suite("Cancels at random instants", .timeLimit(.minutes(3)))
    struct RandomizedCancelTests {
        @Test func everyCancelEndsItsDispatchWithinOneSecondEvenAcrossATakeover() async throws {
            try await withHarness("random-cancels") { h in
                var rng = SplitMix(seed: 20261201)
                try await h.startRouter()
                let first = try await h.startSender()
                try await h.waitUntilLeading(first)
                let standby = try await h.startSender()
                let routes = ["yemaya.board-prep", "acme.legal"]
                // Agents come and go: online a second or two, away a moment, for each target.
                let comings = Mutex(0)
                let agents = Task {
                    var r = SplitMix(seed: 7)
                    while !Task.isCancelled {
                        var online: [TestAgent] = []
                        for route in routes where r.next() % 4 != 0 {
                            if let a = try? await TestAgent(url: h.url, queue: "frontdesk.agent.\(route)", behaviour: .slowStream) {
                                online.append(a)
                            }
                        }
                        comings.withLock { $0 += online.count }
                        try? await Task.sleep(for: .milliseconds(1000 + Int(r.next() % 1000)))
                        for a in online { await a.stop() }
                        try? await Task.sleep(for: .milliseconds(200 + Int(r.next() % 600)))
                    }
                }
                defer { agents.cancel() }

                let count = 240
                var cancels: [String: Date] = [:]  // id → when its cancel was confirmed
                var later: [(at: ContinuousClock.Instant, key: String, body: String, id: String)] = []
                var killedAt: Date?
                let started = ContinuousClock.now
                for n in 0..<count {
                    let due = started + .milliseconds(25 * n)
                    while ContinuousClock.now < due {
                        while let next = later.first, next.at <= ContinuousClock.now {
                            later.removeFirst()
                            try await h.publish(next.key, next.body)
                            if next.key == "dispatch.cancel" { cancels[next.id] = Date() }
                        }
                        try await Task.sleep(for: .milliseconds(2))
                    }
                    let id = "rc-\(n)"
                    let (project, target) = n % 2 == 0 ? ("yemaya", "board-prep") : ("acme", "legal")
                    try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"request \#(n)","project":"\#(project)","target":"\#(target)"}"#)
                    let roll = rng.next() % 100
                    let delay = Duration.milliseconds(Int(rng.next() % 1500))
                    if roll < 30 {
                        later.append((ContinuousClock.now + delay, "dispatch.cancel", #"{"id":"\#(id)","reason":"user"}"#, id))
                    } else if roll < 40, project == "yemaya" {
                        later.append((ContinuousClock.now + delay, "dispatch.reroute", #"{"id":"\#(id)","project":"acme","target":"legal"}"#, id))
                    }
                    later.sort { $0.at < $1.at }
                    if n == count / 2 {
                        kill(first.processIdentifier, SIGKILL)
                        killedAt = Date()
                    }
                }
                for next in later {
                    try await h.publish(next.key, next.body)
                    if next.key == "dispatch.cancel" { cancels[next.id] = Date() }
                }
                try await h.waitUntilLeading(standby)
                let ids = (0..<count).map { "rc-\($0)" }
                let events = try await h.events("all \(count) to end", within: .seconds(90)) { events in
                    Set(events.filter { RouterHarness.terminal.contains($0["state"] as? String ?? "") }.compactMap { $0["dispatchId"] as? String }).count >= count
                }
                // The standby's takeover: from the kill to its first event.
                let senderStates: Set<String> = ["sending", "queued", "replied", "failed", "cancelled"]
                let standbyFirst = events.compactMap { e -> Date? in
                    guard let at = (e["at"] as? String).flatMap(RFC3339Date.parse), let k = killedAt, at > k,
                        senderStates.contains(e["state"] as? String ?? "")
                    else { return nil }
                    return at
                }.min()
                let takeoverEnd = try #require(standbyFirst, "the standby published nothing")
                let killed = try #require(killedAt)

                var byID: [String: [[String: Any]]] = [:]
                for e in events { byID[e["dispatchId"] as? String ?? "?", default: []].append(e) }
                for id in ids {
                    let history = byID[id] ?? []
                    var seen: [Int: String] = [:]
                    for e in history { seen[e["seq"] as? Int ?? -1] = e["state"] as? String }
                    let ordered = seen.keys.sorted().map { seen[$0]! }
                    let terminals = ordered.filter { RouterHarness.terminal.contains($0) }
                    #expect(terminals.count == 1, "\(id): \(ordered)")
                    #expect(RouterHarness.terminal.contains(ordered.last ?? ""), "\(id): something after its end: \(ordered)")
                }
                var onTime = 0, late: [String] = [], duringTakeover: [Double] = [], endedBefore = 0
                for (id, confirmed) in cancels {
                    guard let end = (byID[id] ?? []).first(where: { RouterHarness.terminal.contains($0["state"] as? String ?? "") }),
                        let at = (end["at"] as? String).flatMap(RFC3339Date.parse)
                    else { continue }
                    let latency = at.timeIntervalSince(confirmed)
                    if latency <= 0 {
                        endedBefore += 1
                    } else if confirmed >= killed.addingTimeInterval(-0.1), confirmed <= takeoverEnd {
                        duringTakeover.append(latency)
                    } else if latency < 1 {
                        onTime += 1
                    } else {
                        late.append("\(id) \(end["state"] ?? "?") after \(latency) s")
                    }
                }
                print("random cancels: \(cancels.count) sent; \(onTime) ended within 1 s, \(endedBefore) had ended before, "
                    + "\(duringTakeover.count) during the \(String(format: "%.1f", takeoverEnd.timeIntervalSince(killed))) s takeover "
                    + "(max \(String(format: "%.1f", duringTakeover.max() ?? 0)) s); agent sessions \(comings.withLock { $0 })")
                #expect(late.isEmpty, "cancels over 1 s while a sender led: \(late.prefix(5))")
                #expect((duringTakeover.max() ?? 0) < 1, "a cancel during the takeover took \(duringTakeover.max() ?? 0) s")
                #expect(onTime > 20, "too few cancels met a dispatch in flight to judge: \(onTime)")
            }
        }
    }
}

/// A small deterministic generator: the run is the same each time.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// RFC 3339 times of status events, read in the tests.
enum RFC3339Date {
    static func parse(_ text: String) -> Date? { ISO8601DateFormatter.withFractions.date(from: text) }
}
