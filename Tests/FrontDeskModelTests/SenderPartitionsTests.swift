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

    /// Four partitions on three replicas led 2, 2 and 0: nobody is above
    /// ⌈4 / 3⌉ = 2, and the third has nothing unclaimed to try. A leader above
    /// ⌊4 / 3⌋ = 1 gives its highest up while another leads fewer than 1.
    @Test func aReplicaLeadingNothingWhileOthersLeadMoreThanTheFloorGetsOne() {
        let b = PartitionBalance(partitions: SenderPartitions(count: 4))
        #expect(b.floorShare(replicas: 3) == 1 && b.floorShare(replicas: 0) == 4 && b.floorShare(replicas: 9) == 0)
        #expect(b.release(led: [1, 3], replicas: 3, fewestElsewhere: 0, sinceLastChange: 3, sinceOverTake: 600) == [3])
        // Not before it settled, nor soon after it took one beyond its share.
        #expect(b.release(led: [1, 3], replicas: 3, fewestElsewhere: 0, sinceLastChange: 1, sinceOverTake: 600) == [])
        #expect(b.release(led: [1, 3], replicas: 3, fewestElsewhere: 0, sinceLastChange: 60, sinceOverTake: 5) == [])
        // The others lead at least the floor, or nobody else is known: it keeps them.
        #expect(b.release(led: [1, 3], replicas: 3, fewestElsewhere: 1, sinceLastChange: 60, sinceOverTake: 600) == [])
        #expect(b.release(led: [1, 3], replicas: 3, sinceLastChange: 60, sinceOverTake: 600) == [])
        // At the floor itself it keeps its one: giving it up would only move the gap.
        #expect(b.release(led: [2], replicas: 3, fewestElsewhere: 0, sinceLastChange: 60, sinceOverTake: 600) == [])
        // Seven on three, led 3, 3, 1: the floor is 2, so the one at 3 gives one up.
        let seven = PartitionBalance(partitions: SenderPartitions(count: 7))
        #expect(seven.release(led: [0, 1, 2], replicas: 3, fewestElsewhere: 1, sinceLastChange: 3, sinceOverTake: 600) == [2])
        // One partition: a standby (0) is at the floor of two replicas (0).
        let one = PartitionBalance(partitions: .one)
        #expect(one.release(led: [0], replicas: 2, fewestElsewhere: 0, sinceLastChange: 60, sinceOverTake: 600) == [])
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
        // Three replicas, one leading nothing: one at the floor (1) waits and
        // leaves a partition given up to the one below it; that one tries at once.
        #expect(!b.mayTry(led: 1, replicas: 3, unclaimedFor: 0, fewestElsewhere: 0))
        #expect(b.mayTry(led: 1, replicas: 3, unclaimedFor: PartitionBalance.overShareWait, fewestElsewhere: 0))
        #expect(b.mayTry(led: 0, replicas: 3, unclaimedFor: 0, fewestElsewhere: 1))
        #expect(b.mayTry(led: 1, replicas: 3, unclaimedFor: 0, fewestElsewhere: 1))
    }

    /// Four replicas, joining one by one, each deciding on its own: every
    /// replica leads one or two while there are three, one each with four,
    /// and none is ever without a leader for longer than a try of a replica
    /// below its share.
    @Test func replicasJoiningOneByOneEndUpWithOnePartitionEach() {
        let b = PartitionBalance(partitions: SenderPartitions(count: 4))
        var led: [Set<Int>] = [[0, 1, 2, 3]]
        var lastChange: [Double] = [0]
        var t = 0.0
        for _ in 1...3 {
            led.append([])
            lastChange.append(t)
            // A second of simulated time per step: releases, then takes by replicas below their share.
            for _ in 0..<60 {
                t += 1
                let n = led.count
                let counts = led.map(\.count)
                for r in led.indices {
                    let others = counts.indices.filter { $0 != r }.map { counts[$0] }
                    let give = b.release(
                        led: led[r], replicas: n, fewestElsewhere: others.min(),
                        sinceLastChange: t - lastChange[r], sinceOverTake: 600)
                    if !give.isEmpty {
                        led[r].subtract(give)
                        lastChange[r] = t
                    }
                }
                let free = Set(0..<4).subtracting(led.reduce(into: Set<Int>()) { $0.formUnion($1) })
                for k in free.sorted() {
                    let fewest = { (r: Int) in led.indices.filter { $0 != r }.map { led[$0].count }.min() }
                    if let r = led.indices.first(where: {
                        b.mayTry(led: led[$0].count, replicas: n, unclaimedFor: 0, fewestElsewhere: fewest($0))
                    }) {
                        led[r].insert(k)
                        lastChange[r] = t
                    }
                }
                #expect(led.reduce(0) { $0 + $1.count } == 4)  // each partition led once
            }
            if led.count == 3 { #expect(led.map(\.count).sorted() == [1, 1, 2], "three replicas: \(led)") }
        }
        #expect(led.map(\.count) == [1, 1, 1, 1])
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
