import Foundation
@testable import FrontDeskModel
import Testing

/// The sender's partitions: which partition a route is in, how replicas
/// share them, and where a command acts when every partition gets it.
@Suite("Sender partitions")
struct SenderPartitionsTests {
    let policy = RetryPolicy(baseMs: 1000, maxMs: 60_000, maxAttempts: 3, replyTimeoutSeconds: 600)
    let board = RoutingTable.Route(project: "yemaya", target: "board-prep")
    let legal = RoutingTable.Route(project: "acme", target: "legal")

    @Test func aRoutesPartitionIsFixedInRangeAndSpreadsTheRoutes() {
        let p = SenderPartitions(count: 4)
        var seen = Set<Int>()
        for i in 0..<200 {
            let route = RoutingTable.Route(project: "p\(i % 7)", target: "t-\(i)")
            let k = p.partition(of: route)
            #expect((0..<4).contains(k))
            #expect(SenderPartitions(count: 4).partition(of: route) == k)  // the router's and every sender's
            seen.insert(k)
        }
        #expect(seen == [0, 1, 2, 3])
        // FNV-1a of "yemaya/board-prep", by hand: the same on every machine and build.
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in "yemaya/board-prep".utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        #expect(p.partition(of: board) == Int(h % 4))
        #expect(SenderPartitions.one.partition(of: board) == 0)
        #expect(SenderPartitions(count: 0).count == 1 && SenderPartitions(count: 1000).count == SenderPartitions.maxCount)
    }

    @Test func partitionZeroKeepsTheNamesOfOneSender() {
        #expect(SenderPartitions.suffix(0) == "" && SenderPartitions.suffix(3) == ".3")
    }

    @Test func theShareIsTheCeilingAndAReplicaAboveItGivesUpItsHighestAfterSettling() {
        let b = PartitionBalance(partitions: SenderPartitions(count: 4))
        #expect(b.share(replicas: 1) == 4 && b.share(replicas: 2) == 2 && b.share(replicas: 3) == 2 && b.share(replicas: 4) == 1)
        #expect(b.share(replicas: 0) == 4 && b.share(replicas: 9) == 1)
        let all: Set = [0, 1, 2, 3]
        // Alone: keeps all four.
        #expect(b.release(led: all, replicas: 1, sinceLastChange: 60, sinceOverTake: 600) == [])
        // A second replica came: gives up what is beyond its share, the highest, once settled.
        #expect(b.release(led: all, replicas: 2, sinceLastChange: 1, sinceOverTake: 600) == [])
        #expect(b.release(led: all, replicas: 2, sinceLastChange: 3, sinceOverTake: 600) == [2, 3])
        #expect(b.release(led: all, replicas: 4, sinceLastChange: 3, sinceOverTake: 600) == [1, 2, 3])
        #expect(b.release(led: [0, 1], replicas: 2, sinceLastChange: 60, sinceOverTake: 600) == [])
        // It took one beyond its share lately (nobody else did): it keeps it a while.
        #expect(b.release(led: all, replicas: 2, sinceLastChange: 60, sinceOverTake: 5) == [])
    }

    typealias Peer = PartitionBalance.Peer

    /// Four partitions on three replicas led 2, 2 and 0: nobody is above
    /// ⌈4 / 3⌉ = 2, and the third has nothing unclaimed to try. The leader
    /// above ⌊4 / 3⌋ = 1 with the most (ties: the lowest id) gives its
    /// highest up while the third stands by.
    @Test func aReplicaLeadingNothingWhileOthersLeadMoreThanTheFloorGetsOne() {
        let b = PartitionBalance(partitions: SenderPartitions(count: 4))
        #expect(b.floorShare(replicas: 3) == 1 && b.floorShare(replicas: 0) == 4 && b.floorShare(replicas: 9) == 0)
        let idle = Peer(id: "c", led: 0, standingBy: true)
        let other = Peer(id: "b", led: 2, standingBy: false)
        func release(_ led: Set<Int>, me: String = "a", _ peers: [Peer], settled: Double = 3, overTake: Double = 600, short: Double = .infinity) -> [Int] {
            b.release(led: led, me: me, replicas: 3, peers: peers, sinceLastChange: settled, sinceOverTake: overTake, sinceShortRelease: short)
        }
        #expect(release([1, 3], [other, idle]) == [3])
        // Of two at 2, only the lower id gives one (one hand-off, not two).
        #expect(release([1, 3], me: "d", [other, idle]) == [])
        // Not before it settled, soon after it took one beyond its share, or
        // within `shortReleaseWait` of the last it gave a short replica.
        #expect(release([1, 3], [other, idle], settled: 1) == [])
        #expect(release([1, 3], [other, idle], overTake: 5) == [])
        #expect(release([1, 3], [other, idle], short: 10) == [])
        #expect(release([1, 3], [other, idle], short: PartitionBalance.shortReleaseWait) == [3])
        // A replica at 0 that does not stand by (it cannot connect its slots) is not short.
        #expect(release([1, 3], [other, Peer(id: "c", led: 0, standingBy: false)]) == [])
        // The others lead at least the floor, or nobody else is known: it keeps them.
        #expect(release([1, 3], [Peer(id: "b", led: 1, standingBy: true), Peer(id: "c", led: 1, standingBy: true)]) == [])
        #expect(release([1, 3], []) == [])
        // At the floor itself it keeps its one: giving it up would only move the gap.
        #expect(b.release(led: [2], me: "a", replicas: 4, peers: [idle], sinceLastChange: 60, sinceOverTake: 600) == [])
        // Another leads more: that one gives.
        #expect(release([1, 3], [Peer(id: "b", led: 3, standingBy: false), idle]) == [])
        // Seven on three, led 3, 3, 1: the floor is 2, so one at 3 gives one up.
        let seven = PartitionBalance(partitions: SenderPartitions(count: 7))
        #expect(seven.release(
            led: [0, 1, 2], me: "a", replicas: 3, peers: [Peer(id: "b", led: 3, standingBy: false), Peer(id: "c", led: 1, standingBy: true)],
            sinceLastChange: 3, sinceOverTake: 600) == [2])
        // One partition: a standby (0) is at the floor of two replicas (0).
        let one = PartitionBalance(partitions: .one)
        #expect(one.release(led: [0], me: "a", replicas: 2, peers: [idle], sinceLastChange: 60, sinceOverTake: 600) == [])
    }

    @Test func aPartitionAnotherClaimsIsNotTriedOneUnclaimedFirstByAReplicaBelowItsShare() {
        let b = PartitionBalance(partitions: SenderPartitions(count: 4))
        #expect(!b.mayTry(led: 0, replicas: 2, unclaimedFor: nil))
        #expect(b.mayTry(led: 1, replicas: 2, unclaimedFor: 0))
        #expect(!b.mayTry(led: 2, replicas: 2, unclaimedFor: 0.2))
        #expect(b.mayTry(led: 2, replicas: 2, unclaimedFor: PartitionBalance.overShareWait))
        // Beyond its share, not while it has just taken one (or another slot of it tries).
        #expect(!b.mayTry(led: 2, replicas: 2, unclaimedFor: 5, sinceOwnChange: 0))
        #expect(b.mayTry(led: 2, replicas: 2, unclaimedFor: 5, sinceOwnChange: PartitionBalance.overShareWait))
        // Three replicas, one standing by with nothing: one at the floor (1) waits and
        // leaves a partition given up to the one below it; that one tries at once.
        let idle = Peer(id: "c", led: 0, standingBy: true)
        #expect(!b.mayTry(led: 1, replicas: 3, unclaimedFor: 0, peers: [idle]))
        #expect(b.mayTry(led: 1, replicas: 3, unclaimedFor: PartitionBalance.overShareWait, peers: [idle]))
        #expect(b.mayTry(led: 0, replicas: 3, unclaimedFor: 0, peers: [Peer(id: "b", led: 1, standingBy: true)]))
        #expect(b.mayTry(led: 1, replicas: 3, unclaimedFor: 0, peers: [Peer(id: "b", led: 1, standingBy: true)]))
        #expect(b.mayTry(led: 1, replicas: 3, unclaimedFor: 0, peers: [Peer(id: "c", led: 0, standingBy: false)]))
    }

    /// Replicas deciding on their own, a second of simulated time a step,
    /// each on the heartbeats of the step before: releases first, then each
    /// partition free since an earlier step goes to the first replica
    /// `mayTry` lets take it (a take sees a release a step late; a partition
    /// free for one step more counts as unclaimed for a second), as the
    /// sender does it: a partition given up is not tried by its replica for
    /// `SenderService.releaseHold` (3 s), and one taken beyond the share
    /// restarts `keepAfterOverTake`.
    struct Simulation {
        let balance = PartitionBalance(partitions: SenderPartitions(count: 4))
        var led: [Set<Int>]
        var ids: [String]
        /// Whether each replica's heartbeat says it stands by, and whether it can take a partition.
        var standsBy: [Bool]
        var canTake: [Bool]
        var lastChange: [Double]
        var lastShort: [Double]
        var lastOverTake: [Double]
        var holdUntil: [[Int: Double]]
        var freeSince: [Int: Double] = [:]
        var t = 0.0
        var handOffs = 0

        init(_ led: [Set<Int>]) {
            self.led = led
            ids = led.indices.map { "r\($0)" }
            standsBy = led.map { _ in true }
            canTake = led.map { _ in true }
            lastChange = led.map { _ in 0 }
            lastShort = led.map { _ in -.infinity }
            lastOverTake = led.map { _ in -.infinity }
            holdUntil = led.map { _ in [:] }
        }

        mutating func join(standsBy: Bool = true, canTake: Bool = true) {
            led.append([])
            ids.append("r\(ids.count)")
            self.standsBy.append(standsBy)
            self.canTake.append(canTake)
            lastChange.append(t)
            lastShort.append(-.infinity)
            lastOverTake.append(-.infinity)
            holdUntil.append([:])
        }

        func peers(of r: Int) -> [PartitionBalance.Peer] {
            led.indices.filter { $0 != r }.map { .init(id: ids[$0], led: led[$0].count, standingBy: standsBy[$0]) }
        }

        mutating func step() {
            t += 1
            let n = led.count
            let views = led.indices.map { peers(of: $0) }
            let allLed = led.reduce(into: Set<Int>()) { $0.formUnion($1) }.count == 4
            for r in led.indices {
                let give = balance.release(
                    led: led[r], me: ids[r], replicas: n, peers: views[r], allLed: allLed, sinceLastChange: t - lastChange[r],
                    sinceOverTake: t - lastOverTake[r], sinceShortRelease: t - lastShort[r])
                guard !give.isEmpty else { continue }
                if led[r].count <= balance.share(replicas: n) { lastShort[r] = t }
                for k in give { holdUntil[r][k] = t + 3 }
                led[r].subtract(give)
                lastChange[r] = t
                handOffs += give.count
            }
            let free = Set(0..<4).subtracting(led.reduce(into: Set<Int>()) { $0.formUnion($1) })
            for k in free.sorted() {
                let since = freeSince[k] ?? t
                freeSince[k] = since
                guard t > since else { continue }  // seen free a step late
                if let r = led.indices.first(where: {
                    canTake[$0] && t >= holdUntil[$0][k] ?? 0
                        && balance.mayTry(led: led[$0].count, replicas: n, unclaimedFor: t - since - 1, peers: views[$0])
                }) {
                    if led[r].count >= balance.share(replicas: n) { lastOverTake[r] = t }
                    led[r].insert(k)
                    lastChange[r] = t
                    freeSince[k] = nil
                }
            }
        }
    }

    /// Four replicas, joining one by one: every replica leads one or two
    /// while there are three (one hand-off for the third, not one from each
    /// replica at two), one each with four, and no partition is ever left
    /// without a leader after a step.
    @Test func replicasJoiningOneByOneEndUpWithOnePartitionEach() {
        var sim = Simulation([[0, 1, 2, 3]])
        for joining in 1...3 {
            sim.join()
            let before = sim.handOffs
            for _ in 0..<60 {
                sim.step()
                // A partition is without a leader for one step at most (the step it was given up in).
                #expect(sim.freeSince.values.allSatisfy { $0 == sim.t }, "free since \(sim.freeSince) at \(sim.t)")
            }
            #expect(sim.led.reduce(0) { $0 + $1.count } == 4)
            if joining == 2 {
                #expect(sim.led.map(\.count).sorted() == [1, 1, 2], "three replicas: \(sim.led)")
                #expect(sim.handOffs - before == 1, "hand-offs for the third: \(sim.handOffs - before)")
            }
        }
        #expect(sim.led.map(\.count) == [1, 1, 1, 1])
    }

    /// A third replica whose heartbeat says it stands by but which never
    /// takes a partition (its lock attempts fail): the others give it one at
    /// most every `shortReleaseWait`, not every few seconds. One whose
    /// heartbeat says it does not stand by gets none.
    @Test func aReplicaThatNeverTakesOneDoesNotMakeThePartitionsPassRound() {
        var sim = Simulation([[0, 1], [2, 3]])
        sim.join(standsBy: true, canTake: false)
        for _ in 0..<120 { sim.step() }
        // A round is two hand-offs: the one given up, taken by a leader
        // beyond its share, and that one's extra given up after its keep.
        #expect(sim.handOffs <= 2 * (Int(120 / PartitionBalance.shortReleaseWait) + 1), "\(sim.handOffs) hand-offs in 120 s")
        #expect(sim.led[2].isEmpty)

        var quiet = Simulation([[0, 1], [2, 3]])
        quiet.join(standsBy: false, canTake: false)
        for _ in 0..<120 { quiet.step() }
        #expect(quiet.handOffs == 0 && quiet.led.map(\.count) == [2, 2, 0])
    }

    /// The dispatch waits at `route` (queued for an offline target).
    func waiting(at route: RoutingTable.Route) -> DispatchKnowledge {
        var m = DispatchMachine(record: routedRecord(), policy: policy)!
        if route != m.route {
            _ = m.rerouteRequested(
                project: .init(id: route.project, name: route.project, glyph: "AC"), target: .init(id: route.target, name: route.target),
                now: at(1), targetOnline: false)
        } else {
            _ = m.received(now: at(1), targetOnline: false)
        }
        let copy = m.parked
        return DispatchKnowledge(lastSeq: copy.lastSeq, copySeq: copy.lastSeq, waiting: copy)
    }

    /// Board-prep is partition 0, legal partition 1 (of two, say).
    func partitionOf(_ r: RoutingTable.Route) -> Int { r == board ? 0 : 1 }

    func decide(_ command: SenderCommand, _ known: DispatchKnowledge?, in partition: Int) -> SenderDecisions.CommandOutcome {
        SenderDecisions.command(
            command, known: known, held: false, policy: policy, partition: partition, partitionOf: partitionOf, sameRouteIsNoOp: true)
    }

    @Test func onlyThePartitionWhereTheDispatchWaitsActsAnotherPassesItOnOneThatKnowsNothingRemembers() {
        let known = waiting(at: board)
        let mine: (RoutingTable.Route) -> Bool = { $0 == self.board }
        let notMine: (RoutingTable.Route) -> Bool = { $0 != self.board }
        for command in [SenderCommand.cancel(id: "d-1", reason: "user"), .reroute(id: "d-1", route: legal)] {
            if case .actOnCopy = decide(command, known, in: 0) {} else { Issue.record("the owning partition must act on \(command)") }
            // Partition 1 may see it first, before a reroute moves it there: it passes it on to 0.
            if case .elsewhere(let k) = decide(command, known, in: 1) { #expect(k == 0) } else {
                Issue.record("another partition must pass \(command) on")
            }
            // Nothing known of it: every partition remembers it.
            if case .remember = decide(command, nil, in: 1) {} else { Issue.record("an unknown dispatch's command must be remembered") }
            // In flight in partition 0 (its events' route): partition 1 passes it on, remembers nothing.
            let inFlight = DispatchKnowledge(lastSeq: 3, copySeq: 0, ended: false, accepted: false, waitingBody: nil, partition: 0)
            if case .elsewhere(let k) = decide(command, inFlight, in: 1) { #expect(k == 0) } else {
                Issue.record("a dispatch in flight elsewhere: \(command) must be passed on, not remembered")
            }
        }
        // Its expiry too.
        if case .ignore = SenderDecisions.expiry(known: known, policy: policy, owns: notMine) {} else { Issue.record("expiry acted elsewhere") }
        if case .actOnCopy = SenderDecisions.expiry(known: known, policy: policy, owns: mine) {} else { Issue.record("expiry not acted") }
    }

    @Test func withPartitionsARerouteToWhereItAlreadyWaitsChangesNothing() {
        // The partition it was moved to gets the same reroute (every partition does).
        let known = waiting(at: legal)
        if case .ignore = decide(.reroute(id: "d-1", route: legal), known, in: 1) {} else {
            Issue.record("a reroute to the route it has must change nothing")
        }
        // With one partition it re-parks it, as before.
        if case .actOnCopy = SenderDecisions.command(.reroute(id: "d-1", route: legal), known: known, held: false, policy: policy) {} else {
            Issue.record("one partition: a reroute to the route it has re-parks it")
        }
        // Remembered, then its copy surfaces there: delivered as it is, not moved again.
        var pending = PendingCommands()
        pending.add(.reroute(id: "d-1", route: legal), at: at(2))
        let outcome = SenderDecisions.surfaced(
            known.waiting!, .parked, queueRoute: legal, deliveryCount: 0, known: known, held: false, pending: &pending,
            target: { _ in TargetView(online: true) }, parts: { _ in nil }, policy: policy, now: at(3), sameRouteIsNoOp: true)
        guard case .take(_, let actions) = outcome else {
            Issue.record("not taken: \(outcome)")
            return
        }
        #expect(actions.first?.deliveredAttempt == 1)
    }
}
