import Foundation
@testable import FrontDeskModel
import Testing

/// The sender term's decisions, driven with a manual clock (`at`): the races
/// between cancels, reroutes, copies that surface from queues, and leader
/// changes, as the leader knows them.
@Suite("Sender decisions")
struct SenderDecisionsTests {
    let policy = RetryPolicy(baseMs: 1000, maxMs: 60_000, maxAttempts: 3, replyTimeoutSeconds: 600)
    let board = RoutingTable.Route(project: "yemaya", target: "board-prep")
    let legal = RoutingTable.Route(project: "acme", target: "legal")

    func parts(_ r: RoutingTable.Route) -> (project: StatusEvent.Project, target: StatusEvent.Target)? {
        switch r.target {
        case "board-prep": (.init(id: "yemaya", name: "Yemaya", glyph: "YE"), .init(id: "board-prep", name: "Board Prep"))
        case "legal": (.init(id: "acme", name: "Acme Corp", glyph: "AC"), .init(id: "legal", name: "Legal"))
        default: nil
        }
    }

    /// Every target offline, or every one online with room.
    func targets(online: Bool, parked: Int = 0, hasRoom: Bool = true) -> (RoutingTable.Route) -> TargetView {
        { _ in TargetView(online: online, parked: parked, hasRoom: hasRoom) }
    }

    /// The dispatch as it waits after being queued for an offline target at `at(1)`: its copy and what the log knows.
    func queuedCopy() -> (ParkedDispatch, DispatchKnowledge) {
        var m = DispatchMachine(record: routedRecord(), policy: policy)!
        _ = m.received(now: at(1), targetOnline: false)
        let copy = m.parked
        return (copy, DispatchKnowledge(lastSeq: copy.lastSeq, copySeq: copy.lastSeq, waiting: copy))
    }

    /// The dispatch waiting for a retry after a retryable error at `at(2)`.
    func retryWaitCopy() -> (ParkedDispatch, DispatchKnowledge) {
        var m = DispatchMachine(record: routedRecord(), policy: policy)!
        _ = m.received(now: at(1), targetOnline: true)
        _ = m.replyReceived(reply(.error, retryable: true), now: at(2), jitter: 0.5)
        let copy = m.parked
        return (copy, DispatchKnowledge(lastSeq: copy.lastSeq, copySeq: copy.lastSeq, waiting: copy))
    }

    func actions(_ outcome: SenderDecisions.Outcome) -> [DispatchMachine.Action]? {
        if case .take(_, let a) = outcome { return a }
        return nil
    }

    func dropped(_ outcome: SenderDecisions.Outcome) -> SenderDecisions.Drop? {
        if case .drop(let why) = outcome { return why }
        return nil
    }

    /// Applies a command the way the term does, returning the actions.
    func apply(_ command: SenderCommand, known: DispatchKnowledge?) -> [DispatchMachine.Action]? {
        guard case .actOnCopy(var m) = SenderDecisions.command(command, known: known, held: false, policy: policy) else { return nil }
        switch command {
        case .cancel(_, let reason): return m.cancelRequested(reason: reason, now: at(3))
        case .reroute(_, let route):
            let p = parts(route)!
            if case .moved(let a) = m.rerouteRequested(project: p.project, target: p.target, now: at(3), targetOnline: false) { return a }
            return []
        }
    }

    @Test func aCancelRightAfterQueuedEndsTheWaitingDispatchAtOnce() throws {
        let (copy, known) = queuedCopy()
        let a = try #require(apply(.cancel(id: "d-1", reason: "user"), known: known))
        #expect(a.states == [.cancelled])
        #expect(a.events.first?.seq == copy.lastSeq + 1 && a.events.first?.cancel?.reason == "user")
        #expect(a.last == .finish(.cancelled))
    }

    @Test func aCancelDuringARetryWaitEndsItAtOnce() throws {
        let (copy, known) = retryWaitCopy()
        #expect(copy.retryAt != nil)
        let a = try #require(apply(.cancel(id: "d-1", reason: "user"), known: known))
        #expect(a.states == [.cancelled] && a.events.first?.step == 2)
    }

    /// The copy in the broker, surfacing after the dispatch ended — under this leader or a later one, which
    /// learns of the end from the log.
    @Test(arguments: [SenderDecisions.Wait.parked, .retryDue, .expired])
    func aCopyThatSurfacesAfterACancelIsDropped(_ wait: SenderDecisions.Wait) {
        let (copy, known) = wait == .retryDue ? retryWaitCopy() : queuedCopy()
        var ended = known
        ended.ended = true
        ended.lastSeq += 1
        ended.waiting = nil
        var pending = PendingCommands()
        for deliveryCount in [0, 3] {
            let outcome = SenderDecisions.surfaced(
                copy, wait, deliveryCount: deliveryCount, known: ended, held: false, pending: &pending,
                target: targets(online: true), parts: parts, policy: policy, now: at(10))
            #expect(dropped(outcome) == .ended)
        }
    }

    @Test func aRerouteMovesTheCopyAndTheOldOneIsDroppedThenACancelEndsTheNewOne() throws {
        let (old, known) = queuedCopy()
        let moved = try #require(apply(.reroute(id: "d-1", route: legal), known: known))
        #expect(moved.first?.isPark == true && moved.states == [.queued])
        let queued = try #require(moved.events.first)
        #expect(queued.target?.id == "legal" && queued.seq == old.lastSeq + 1 && queued.queue?.reason == "agent_offline")
        // What the leader knows once the new copy is parked.
        var m = DispatchMachine(parked: old, policy: policy)!
        _ = m.rerouteRequested(project: parts(legal)!.project, target: parts(legal)!.target, now: at(3), targetOnline: false)
        let new = m.parked
        let after = DispatchKnowledge(lastSeq: new.lastSeq, copySeq: new.lastSeq, waiting: new)
        var pending = PendingCommands()
        // The old copy surfaces when the old target comes online: superseded.
        let oldOutcome = SenderDecisions.surfaced(
            old, .parked, deliveryCount: 0, known: after, held: false, pending: &pending,
            target: targets(online: true), parts: parts, policy: policy, now: at(4))
        #expect(dropped(oldOutcome) == .superseded)
        // A cancel now acts on the new copy.
        let cancelled = try #require(apply(.cancel(id: "d-1", reason: "user"), known: after))
        #expect(cancelled.states == [.cancelled] && cancelled.events.first?.seq == new.lastSeq + 1)
        #expect(cancelled.events.first?.target?.id == "legal")
        // Without the cancel, the new copy is delivered at the new target.
        let newOutcome = SenderDecisions.surfaced(
            new, .parked, deliveryCount: 0, known: after, held: false, pending: &pending,
            target: targets(online: true), parts: parts, policy: policy, now: at(5))
        let delivered = try #require(actions(newOutcome))
        #expect(delivered.first?.deliveredAttempt == 1 && delivered.events.first?.target?.id == "legal")
    }

    /// Cases of a command, by what the leader knows.
    static let commandCases: [(String, DispatchKnowledge?, Bool, String)] = [
        ("not seen yet", nil, false, "remember"),
        ("ended", DispatchKnowledge(lastSeq: 5, ended: true), false, "ignore"),
        ("held in flight", DispatchKnowledge(lastSeq: 3), true, "applyToHeld"),
        ("handed to the sender, never waiting", DispatchKnowledge(lastSeq: 2, accepted: true), false, "remember"),
    ]

    @Test(arguments: 0..<commandCases.count)
    func whereACommandActs(_ i: Int) {
        let (name, known, held, expected) = Self.commandCases[i]
        let outcome = SenderDecisions.command(.cancel(id: "d-1", reason: "user"), known: known, held: held, policy: policy)
        let got: String = switch outcome {
        case .ignore: "ignore"
        case .applyToHeld: "applyToHeld"
        case .actOnCopy: "actOnCopy"
        case .remember: "remember"
        case .elsewhere(let k): "elsewhere \(k)"
        }
        #expect(got == expected, "\(name)")
    }

    /// A leader died with the dispatch in flight: the log shows a `sending`
    /// after its waiting copy. The copy is out of date, so a reroute is kept
    /// for when the copy comes back — and then changes nothing, since the
    /// dispatch was delivered.
    @Test func aRerouteAfterATakeoverOfADeliveredDispatchChangesNothing() throws {
        let (copy, known) = queuedCopy()
        var afterDelivery = known
        afterDelivery.lastSeq = copy.lastSeq + 1  // the dead leader's sending
        guard case .remember = SenderDecisions.command(.reroute(id: "d-1", route: legal), known: afterDelivery, held: false, policy: policy)
        else {
            Issue.record("acted on an out-of-date copy")
            return
        }
        var pending = PendingCommands()
        pending.add(.reroute(id: "d-1", route: legal), at: at(3))
        let outcome = SenderDecisions.surfaced(
            copy, .parked, deliveryCount: 1, known: afterDelivery, held: false, pending: &pending,
            target: targets(online: true), parts: parts, policy: policy, now: at(4))
        let a = try #require(actions(outcome))
        #expect(a.first?.deliveredAttempt == 1 && a.events.first?.target?.id == "board-prep")
        // Numbered above anything the dead leader may have published.
        #expect((a.events.first?.seq ?? 0) > afterDelivery.lastSeq + 1000 - 1)

        // A cancel does not wait for the copy: it ends the dispatch at once, numbered above the log.
        guard case .actOnCopy(var m) = SenderDecisions.command(.cancel(id: "d-1", reason: "user"), known: afterDelivery, held: false, policy: policy)
        else {
            Issue.record("a cancel waited for an out-of-date copy")
            return
        }
        let cancelled = m.cancelRequested(reason: "user", now: at(5)).events
        #expect(cancelled.map(\.state) == [.cancelled] && cancelled.first?.seq == afterDelivery.lastSeq + 1)
        #expect(cancelled.first?.step == 2)  // the step the delivery reached, not the copy's
        // So does the end of its lifetime.
        guard case .actOnCopy = SenderDecisions.expiry(known: afterDelivery, policy: policy) else {
            Issue.record("an expiry waited for an out-of-date copy")
            return
        }
    }

    /// A reroute kept from before its request, applied to the hand-off or to
    /// a parked copy as it surfaces, parks a new copy at the new target even
    /// when that target is online: the lease it leaves behind (the hand-off,
    /// the old copy) names the old route, and after a takeover it must be
    /// superseded, not delivered there.
    @Test func aKeptRerouteParksAtTheNewTargetSoThatNoLeaseNamesTheOldOne() throws {
        var pending = PendingCommands()
        pending.add(.reroute(id: "d-1", route: legal), at: at(-1))
        let handedOff = try #require(actions(SenderDecisions.handOff(
            routedRecord(), redelivered: false, deliveryCount: 0, known: nil, held: false, pending: &pending,
            target: targets(online: true), parts: parts, policy: policy, now: at(1))))
        /// The copy the actions park, once they show `queued` at Legal and deliver nothing.
        func parkedAtLegal(_ a: [DispatchMachine.Action]) -> ParkedDispatch? {
            #expect(a.states == [.queued] && a.events.first?.target?.id == "legal")
            #expect(!a.contains { $0.deliveredAttempt != nil })
            guard case .park(let copy, _)? = a.first(where: \.isPark) else { return nil }
            return copy
        }
        let copy = try #require(parkedAtLegal(handedOff))
        #expect(copy.route == legal)
        // The same for a copy that surfaces at the old target with a reroute kept for it.
        let (old, known) = queuedCopy()
        var kept = PendingCommands()
        kept.add(.reroute(id: "d-1", route: legal), at: at(2))
        let surfaced = try #require(actions(SenderDecisions.surfaced(
            old, .parked, deliveryCount: 0, known: known, held: false, pending: &kept,
            target: targets(online: true), parts: parts, policy: policy, now: at(3))))
        let moved = try #require(parkedAtLegal(surfaced))
        #expect(moved.route == legal && moved.lastSeq > old.lastSeq)
        // The hand-off handed back to a new leader after that copy's record was written (its
        // leader died before the ack; the copy itself may or may not be in the broker): parked
        // at the new target again, above that copy, not delivered or parked at the old one.
        let afterPark = DispatchKnowledge(lastSeq: copy.lastSeq, copySeq: copy.lastSeq, waiting: copy)
        var none = PendingCommands()
        let again = try #require(actions(SenderDecisions.handOff(
            routedRecord(), redelivered: true, deliveryCount: 1, known: afterPark, held: false, pending: &none,
            target: targets(online: true), parts: parts, policy: policy, now: at(2))))
        let parkedAgain = try #require(parkedAtLegal(again))
        #expect(parkedAgain.route == legal && parkedAgain.lastSeq > copy.lastSeq)
        // Its record in the log but not its queued event (a crash cut the window there): the
        // copy may be missing too, so parked again as well.
        var recordOnly = afterPark
        recordOnly.lastSeq = copy.lastSeq - 1
        #expect(actions(SenderDecisions.handOff(
            routedRecord(), redelivered: true, deliveryCount: 1, known: recordOnly, held: false, pending: &none,
            target: targets(online: true), parts: parts, policy: policy, now: at(2))).flatMap(parkedAtLegal)?.route == legal)
        // That copy taken up since (events after it), or another partition's: it holds the
        // dispatch; the hand-off is spent.
        var takenUp = afterPark
        takenUp.lastSeq = copy.lastSeq + 1
        #expect(dropped(SenderDecisions.handOff(
            routedRecord(), redelivered: true, deliveryCount: 1, known: takenUp, held: false, pending: &none,
            target: targets(online: true), parts: parts, policy: policy, now: at(2))) == .superseded)
        #expect(dropped(SenderDecisions.handOff(
            routedRecord(), redelivered: true, deliveryCount: 1, known: afterPark, held: false, pending: &none,
            target: targets(online: true), parts: parts, policy: policy, now: at(2), owns: { $0 != self.legal })) == .superseded)
        // A cancel kept for it ends it where it was moved.
        var cancel = PendingCommands()
        cancel.add(.cancel(id: "d-1", reason: "user"), at: at(-1))
        let cancelled = try #require(actions(SenderDecisions.handOff(
            routedRecord(), redelivered: true, deliveryCount: 1, known: afterPark, held: false, pending: &cancel,
            target: targets(online: true), parts: parts, policy: policy, now: at(2))))
        #expect(cancelled.states == [.cancelled] && cancelled.events.first?.target?.id == "legal")
        // Parked at the router's own target: resumed as a lease, as before (delivered, the target online).
        let (atBoard, boardKnown) = queuedCopy()
        #expect(atBoard.route == board)
        #expect(actions(SenderDecisions.handOff(
            routedRecord(), redelivered: true, deliveryCount: 1, known: boardKnown, held: false, pending: &none,
            target: targets(online: true), parts: parts, policy: policy, now: at(2)))?.first?.deliveredAttempt == 1)
    }

    /// "Remembered for the lifetime window": a cancel or reroute that came
    /// more than the window before its request no longer applies to it, each
    /// counted from its own arrival (a later reroute does not keep an older
    /// cancel alive); one within it applies however late the hand-off is
    /// handled (a takeover, a redelivery). The request came at `at(0.01)`.
    @Test func aCommandKeptLongerThanTheLifetimeWindowIsNoLongerApplied() throws {
        let short = RetryPolicy(baseMs: 1000, maxMs: 60_000, maxAttempts: 3, replyTimeoutSeconds: 600, lifetimeSeconds: 60)
        func handOff(_ pending: inout PendingCommands, now: Date) -> [DispatchMachine.Action]? {
            actions(SenderDecisions.handOff(
                routedRecord(), redelivered: false, deliveryCount: 0, known: nil, held: false, pending: &pending,
                target: targets(online: true), parts: parts, policy: short, now: now))
        }
        var within = PendingCommands()
        within.add(.cancel(id: "d-1", reason: "user"), at: at(-59))
        var handledAtOnce = within, handledLate = within
        #expect(try #require(handOff(&handledAtOnce, now: at(1))).states == [.cancelled])
        #expect(try #require(handOff(&handledLate, now: at(3_600))).states == [.cancelled])
        // A cancel past its window, a reroute within its own: delivered, at the new target.
        var mixed = PendingCommands()
        mixed.add(.cancel(id: "d-1", reason: "user"), at: at(-61))
        mixed.add(.reroute(id: "d-1", route: legal), at: at(-30))
        let moved = try #require(handOff(&mixed, now: at(1)))
        #expect(moved.states == [.queued] && moved.events.last?.target?.id == "legal" && moved.contains(where: \.isPark), "\(moved.states)")
        // Both past: delivered where the router sent it.
        var old = PendingCommands()
        old.add(.cancel(id: "d-1", reason: "user"), at: at(-100))
        old.add(.reroute(id: "d-1", route: legal), at: at(-90))
        var handled = old
        let plain = try #require(handOff(&handled, now: at(1)))
        #expect(plain.states.last == .sending && plain.events.last?.target?.id == "board-prep", "\(plain.states)")
        // A cancel again for the same id: within the first one's window, the first reason with the newest
        // time; after it, the new cancel alone.
        var twice = PendingCommands()
        twice.add(.cancel(id: "d-1", reason: "first"), at: at(-100), window: 60)
        twice.add(.cancel(id: "d-1", reason: "second"), at: at(-50), window: 60)
        let first = try #require(handOff(&twice, now: at(1)))
        #expect(first.states == [.cancelled] && first.events.first?.cancel?.reason == "first")
        var again = PendingCommands()
        again.add(.cancel(id: "d-1", reason: "stale"), at: at(-200), window: 60)
        again.add(.cancel(id: "d-1", reason: "new"), at: at(-10), window: 60)
        let cancelled = try #require(handOff(&again, now: at(1)))
        #expect(cancelled.states == [.cancelled] && cancelled.events.first?.cancel?.reason == "new")
        // A pruned window forgets them; a command from the future counts as now.
        old.prune(olderThan: 60, now: at(1))
        #expect(old.count == 0)
        var future = PendingCommands()
        future.add(.cancel(id: "d-1", reason: "user"), at: at(1_000))
        #expect(try #require(handOff(&future, now: at(1))).states == [.cancelled])
    }

    @Test func aCancelKeptBeforeTheRequestEndsTheHandOffAndAParkedCopyWaitsForAnAgent() throws {
        var pending = PendingCommands()
        pending.add(.cancel(id: "d-1", reason: "changed my mind"), at: at(0))
        let handOff = SenderDecisions.handOff(
            routedRecord(), redelivered: false, deliveryCount: 0, known: nil, held: false, pending: &pending,
            target: targets(online: true), parts: parts, policy: policy, now: at(1))
        let a = try #require(actions(handOff))
        #expect(a.states == [.cancelled] && a.events.first?.cancel?.reason == "changed my mind" && a.events.first?.seq == 3)
        // A parked copy with no agent goes back to the head of its queue.
        let (copy, known) = queuedCopy()
        var none = PendingCommands()
        let outcome = SenderDecisions.surfaced(
            copy, .parked, deliveryCount: 0, known: known, held: false, pending: &none,
            target: targets(online: false), parts: parts, policy: policy, now: at(2))
        guard case .requeue = outcome else {
            Issue.record("expected requeue")
            return
        }
    }

    @Test func aTargetHoldsItsShareOrMoreWhileTheWindowHoldsLessThanItsSpare() {
        let ten = WindowShare(prefetch: 500, targets: 10)
        #expect(ten.share == 25 && ten.spare == 125)
        #expect(ten.hasRoom(held: 24, windowHeld: 400), "within its share, however full the window")
        #expect(!ten.hasRoom(held: 25, windowHeld: 125), "past its share with the spare used up")
        #expect(ten.hasRoom(held: 124, windowHeld: 124), "a lone busy target takes the spare")
        #expect(!ten.hasRoom(held: 125, windowHeld: 125))
        // Held at most: the spare, then every other target's share: three quarters of the window.
        var held = Array(repeating: 0, count: 10)
        func take(_ t: Int) -> Bool {
            guard ten.hasRoom(held: held[t], windowHeld: held.reduce(0, +)) else { return false }
            held[t] += 1
            return true
        }
        while take(0) {}
        for t in 1..<10 { while take(t) {} }
        #expect(held[0] == 125 && held.dropFirst().allSatisfy { $0 == 25 } && held.reduce(0, +) == 350)
        // One target: half the window; more targets than half a window's slots: no share, the spare still.
        #expect(WindowShare(prefetch: 500, targets: 1).share == 250)
        let many = WindowShare(prefetch: 500, targets: 300)
        #expect(many.share == 0 && many.hasRoom(held: 0, windowHeld: 124) && !many.hasRoom(held: 0, windowHeld: 125))
        #expect(WindowShare(prefetch: 100, targets: 10).share == 5 && WindowShare(prefetch: 100, targets: 10).spare == 25)
    }

    /// Hand-offs, by what is known and how the target stands.
    static let handOffCases: [(String, DispatchKnowledge?, Bool, Int, TargetView, String)] = [
        ("new, agent there", nil, false, 0, .init(online: true), "deliver"),
        ("new, older ones wait (first in, first out)", nil, false, 0, .init(online: true, parked: 3), "park"),
        ("new, the target used its share of the window", nil, false, 0, .init(online: true, hasRoom: false), "park"),
        ("new, no agent", nil, false, 0, .init(online: false), "park"),
        ("a second hand-off in this term", DispatchKnowledge(lastSeq: 3, accepted: true), false, 0, .init(online: true), "drop"),
        ("sent again after the sender published", DispatchKnowledge(lastSeq: 4), false, 0, .init(online: true), "drop"),
        ("a lease handed back, not ended", DispatchKnowledge(lastSeq: 4), true, 1, .init(online: true), "deliver"),
        ("a lease handed back, ended", DispatchKnowledge(lastSeq: 5, ended: true), true, 1, .init(online: true), "drop"),
    ]

    @Test(arguments: 0..<handOffCases.count)
    func handOffs(_ i: Int) {
        let (name, known, redelivered, count, view, expected) = Self.handOffCases[i]
        var pending = PendingCommands()
        let outcome = SenderDecisions.handOff(
            routedRecord(), redelivered: redelivered, deliveryCount: count, known: known, held: false, pending: &pending,
            target: { _ in view }, parts: parts, policy: policy, now: at(1))
        let got: String = switch outcome {
        case .drop: "drop"
        case .requeue: "requeue"
        case .take(_, let a): a.first?.isPark == true ? "park" : (a.contains { $0.deliveredAttempt == 1 } ? "deliver" : "other")
        }
        #expect(got == expected, "\(name)")
        if case .take(let m, let a) = outcome, redelivered {
            #expect(a.events.allSatisfy { $0.seq > (known?.lastSeq ?? 0) + 999 } && m.lastSeq == a.events.last?.seq, "\(name)")
        }
    }

    @Test func aRetryDueWithoutRoomWaitsForAnAgentInsteadOfTakingASlot() throws {
        let (copy, known) = retryWaitCopy()
        var pending = PendingCommands()
        let retryAt = try #require(copy.retryAt.flatMap(RFC3339.parse))
        let full = SenderDecisions.surfaced(
            copy, .retryDue, deliveryCount: 0, known: known, held: false, pending: &pending,
            target: targets(online: true, hasRoom: false), parts: parts, policy: policy, now: retryAt)
        let a = try #require(actions(full))
        #expect(a.first?.isPark == true && a.events.first?.queue?.reason == "agent_offline")
        let room = SenderDecisions.surfaced(
            copy, .retryDue, deliveryCount: 0, known: known, held: false, pending: &pending,
            target: targets(online: true), parts: parts, policy: policy, now: retryAt)
        #expect(try #require(actions(room)).first?.deliveredAttempt == 2)
    }

    /// A copy sits in its own target's park queue; one found in another's
    /// was put there by hand, and going round the queue would spin.
    @Test func aCopyInAnotherTargetsParkQueueIsDropped() {
        let (copy, known) = queuedCopy()
        var pending = PendingCommands()
        let outcome = SenderDecisions.surfaced(
            copy, .parked, queueRoute: legal, deliveryCount: 0, known: known, held: false, pending: &pending,
            target: targets(online: false), parts: parts, policy: policy, now: at(2))
        #expect(dropped(outcome) == .misplaced)
    }

    @Test func seqFloorsAreClampedAgainstHugeDeliveryCounts() {
        #expect(SenderDecisions.seqFloor(base: 3, known: nil, deliveryCount: 0) == 3)
        #expect(SenderDecisions.seqFloor(base: 3, known: DispatchKnowledge(lastSeq: 7), deliveryCount: 2) == 2007)
        #expect(SenderDecisions.seqFloor(base: 3, known: nil, deliveryCount: Int.max) == 3 + 1_000_000)
        #expect(SenderDecisions.seqFloor(base: 3, known: nil, deliveryCount: -5) == 3)
    }
}
