import Foundation

/// What the sender's leader knows of one dispatch: from the status log at
/// takeover (events and waiting records of every earlier leader) and its own
/// events and copies since.
public struct DispatchKnowledge: Sendable, Equatable {
    /// The highest seq published for it.
    public var lastSeq: Int
    /// The seq of its current waiting copy (park or delay queue); a copy
    /// with a lower seq was superseded.
    public var copySeq: Int
    /// A terminal event was published (or this term finished it).
    public var ended: Bool
    /// This term took a hand-off of it: another hand-off is a duplicate.
    public var accepted: Bool
    /// Its current waiting copy as encoded, while it waits and has not
    /// ended: kept as bytes (a fraction of the decoded value's memory, for
    /// every waiting dispatch) and decoded only when a command needs it.
    public var waitingBody: Data?
    /// The partition it was last seen in (its latest event's or copy's route), with several.
    public var partition: Int?
    /// The partition that wrote its current waiting copy (the one that moved it, after a reroute).
    public var copyWriter: Int?

    /// The current waiting copy, decoded.
    public var waiting: ParkedDispatch? {
        get { waitingBody.flatMap { try? ParkedDispatch(jsonData: $0) } }
        set { waitingBody = newValue?.jsonData() }
    }

    public init(lastSeq: Int = 0, copySeq: Int = 0, ended: Bool = false, accepted: Bool = false, waiting: ParkedDispatch? = nil) {
        self.lastSeq = lastSeq
        self.copySeq = copySeq
        self.ended = ended
        self.accepted = accepted
        self.waitingBody = waiting?.jsonData()
    }

    public init(lastSeq: Int, copySeq: Int, ended: Bool, accepted: Bool, waitingBody: Data?, partition: Int? = nil, copyWriter: Int? = nil) {
        self.lastSeq = lastSeq
        self.copySeq = copySeq
        self.ended = ended
        self.accepted = accepted
        self.waitingBody = waitingBody
        self.partition = partition
        self.copyWriter = copyWriter
    }
}

/// How the slots of one of the sender's shared consumer windows (inbox,
/// retry) are shared out among the targets' dispatches with agents, each of
/// which holds a slot until it ends. A target may hold its share, half the
/// window split over the targets, so that silent or slow agents of any
/// number of targets leave room for the others (no minimum: with more
/// targets than half a window has slots, their dispatches wait in their own
/// park queues). It may hold more while the whole window holds less than
/// its spare, a quarter: a lone busy target is not parked behind a share
/// sized for all of them, and with every share used too, a quarter of the
/// window stays free for commands and for dispatches on their way to a park
/// queue.
public struct WindowShare: Sendable, Equatable {
    public var prefetch: Int
    public var targets: Int

    public init(prefetch: Int, targets: Int) {
        self.prefetch = prefetch
        self.targets = targets
    }

    public var share: Int { prefetch / (2 * max(1, targets)) }
    public var spare: Int { prefetch / 4 }

    /// Whether a target holding `held` slots may take one more while the
    /// window holds `windowHeld` over every target.
    public func hasRoom(held: Int, windowHeld: Int) -> Bool {
        held < share || windowHeld < spare
    }
}

/// A target as the leader sees it when it decides.
public struct TargetView: Sendable, Equatable {
    /// An agent consumes its queue.
    public var online: Bool
    /// Dispatches waiting in its park queue (older ones go first).
    public var parked: Int
    /// It may take one more slot of the window the dispatch's lease is in.
    public var hasRoom: Bool

    public init(online: Bool, parked: Int = 0, hasRoom: Bool = true) {
        self.online = online
        self.parked = parked
        self.hasRoom = hasRoom
    }

    /// A new dispatch goes straight to an agent: one is there, none older
    /// waits before it, and the target has room.
    public var takesNew: Bool { online && parked == 0 && hasRoom }
}

/// The sender term's decisions, as pure functions of what it knows: which
/// hand-off or surfacing copy is a duplicate, what a pending cancel or
/// reroute does to it, where a command acts. The term carries out the
/// outcome (publishes, acks, timers); `DispatchMachine` decides each
/// dispatch's own steps. Times come in as arguments, so the tests drive
/// every race with a manual clock.
public enum SenderDecisions {
    /// What to do with a hand-off or a copy that came out of a queue.
    public enum Outcome: Sendable {
        /// A duplicate, a late copy, or unreadable: ack it and do nothing.
        case drop(Drop)
        /// Not now (its target has no agent): back to the head of its queue.
        case requeue
        /// Hold it with this machine and carry out these actions.
        case take(DispatchMachine, [DispatchMachine.Action])
    }

    /// Why a message is dropped.
    public enum Drop: String, Sendable, Equatable {
        case unreadable = "unreadable"
        case duplicateHandOff = "a hand-off of a dispatch already taken"
        case secondCopy = "a second copy of a dispatch held"
        case ended = "its dispatch ended"
        case superseded = "superseded by a newer copy"
        case misplaced = "a copy in another target's park queue"
    }

    /// Where a cancel or reroute acts.
    public enum CommandOutcome: Sendable {
        /// The dispatch ended: nothing to do.
        case ignore
        /// The term holds it (in flight): apply it to the held machine.
        case applyToHeld
        /// It waits in a queue and nothing was published since its copy:
        /// act on this machine, made from the copy the log keeps (the copy
        /// in the broker is dropped when it surfaces).
        case actOnCopy(DispatchMachine)
        /// Not seen yet (or taken up by a leader that died with it):
        /// remember it until the dispatch or its copy shows up.
        case remember
        /// With several partitions: it waits in, or was last seen by, this
        /// other partition (which gets every command too, but may have seen
        /// it before the dispatch moved there): pass the command on to it.
        case elsewhere(partition: Int)
    }

    /// Which kind of waiting copy surfaced.
    public enum Wait: Sendable, Equatable {
        /// From the target's park queue, taken because an agent came.
        case parked
        /// Its retry wait ended in its delay queue.
        case retryDue
        /// Its TTL ran out in a park queue: the lifetime ended.
        case expired
    }

    /// Runs `step` on the machine first, then takes the machine as it is
    /// after it: `.take(machine, machine.step())` would hold the machine as
    /// it was before (arguments are evaluated left to right).
    static func take(_ machine: DispatchMachine, _ step: (inout DispatchMachine) -> [DispatchMachine.Action]) -> Outcome {
        var m = machine
        let actions = step(&m)
        return .take(m, actions)
    }

    /// The seq to number above: what is known, and for a message handed
    /// back by a dead leader (`deliveryCount` > 0) a margin of 1,000 a time
    /// above anything it may have published that is not known yet. Clamped:
    /// a header value, however large, cannot overflow it.
    public static func seqFloor(base: Int, known: DispatchKnowledge?, deliveryCount: Int) -> Int {
        let count = min(max(deliveryCount, 0), 1000)
        return max(base, known?.lastSeq ?? 0) + count * 1000
    }

    /// When the dispatch's request came (the router's decision), for the
    /// commands kept before it: one is applied if it came within the lifetime
    /// window before the request, however late the hand-off or copy is
    /// handled (a takeover, a redelivery, hours parked).
    static func requestCame(_ record: DispatchRecord, now: Date) -> Date {
        min(now, RFC3339.parse(record.decidedAt) ?? now)
    }

    /// A hand-off from the router.
    public static func handOff(
        _ record: DispatchRecord, redelivered: Bool, deliveryCount: Int, known: DispatchKnowledge?, held: Bool,
        pending: inout PendingCommands, target: (RoutingTable.Route) -> TargetView,
        parts: (RoutingTable.Route) -> (project: StatusEvent.Project, target: StatusEvent.Target)?,
        policy: RetryPolicy, now: Date, sameRouteIsNoOp: Bool = false, owns: (RoutingTable.Route) -> Bool = { _ in true }
    ) -> Outcome {
        guard var machine = DispatchMachine(record: record, policy: policy, seqFloor: seqFloor(base: 2, known: known, deliveryCount: deliveryCount))
        else { return .drop(.unreadable) }
        // Sent again by a router that died before its ack: the sender has
        // published for it already. A redelivered one is a lease to resume,
        // unless the dispatch ended.
        let publishedBefore = (known?.lastSeq ?? 0) > 2
        guard !held, known?.accepted != true, known?.ended != true, redelivered || !publishedBefore else {
            return .drop(.duplicateHandOff)
        }
        let came = requestCame(record, now: now)
        // Moved to another target (below): parked there, also when it is online (its copy
        // surfaces at once), as a reroute of a waiting dispatch is. Delivered straight from
        // here, the dispatch's lease would stay this hand-off, which names the old route, and
        // a leader after a takeover would deliver it there ("never to the old one").
        var moved = false
        // Handed back after the dispatch was parked at another target than the router's (a
        // kept reroute; its leader died before this ack): this lease, which names the
        // router's route, is spent. Only where that copy may be missing (its waiting record
        // is in the log, but the copy's own confirm may have failed) and nothing was
        // published since it, and this partition owns its target, is it parked there again,
        // above it (a copy that is there is then dropped as superseded when it surfaces);
        // a copy taken up since, or another partition's, holds the dispatch.
        if redelivered, let known, known.copySeq > 0, let copy = known.waiting, copy.route != machine.route {
            guard known.lastSeq <= known.copySeq, !copy.everDelivered, copy.retryAt == nil, owns(copy.route), let p = parts(copy.route) else {
                return .drop(.superseded)
            }
            _ = machine.rerouteRequested(project: p.project, target: p.target, now: now, targetOnline: false)
            moved = true
        }
        if let reason = pending.cancelReason(record.id, now: came, window: policy.lifetimeSeconds) {
            return take(machine) { $0.cancelRequested(reason: reason, now: now) }
        }
        if !moved, let route = pending.takeReroute(record.id, now: came, window: policy.lifetimeSeconds), !(sameRouteIsNoOp && route == machine.route), let p = parts(route) {
            _ = machine.rerouteRequested(project: p.project, target: p.target, now: now, targetOnline: false)
            moved = true
        }
        if moved { return take(machine) { $0.received(now: now, targetOnline: false) } }
        let takesNew = target(machine.route).takesNew
        return take(machine) { $0.received(now: now, targetOnline: takesNew) }
    }

    /// A copy that surfaced from a park, delay or expiry queue.
    public static func surfaced(
        _ copy: ParkedDispatch, _ wait: Wait, queueRoute: RoutingTable.Route? = nil, deliveryCount: Int, known: DispatchKnowledge?, held: Bool,
        pending: inout PendingCommands, target: (RoutingTable.Route) -> TargetView,
        parts: (RoutingTable.Route) -> (project: StatusEvent.Project, target: StatusEvent.Target)?,
        policy: RetryPolicy, now: Date, sameRouteIsNoOp: Bool = false
    ) -> Outcome {
        let id = copy.record.id
        guard var machine = DispatchMachine(parked: copy, policy: policy, seqFloor: seqFloor(base: copy.lastSeq, known: known, deliveryCount: deliveryCount))
        else { return .drop(.unreadable) }
        if held { return .drop(.secondCopy) }
        if known?.ended == true { return .drop(.ended) }
        if copy.lastSeq < (known?.copySeq ?? 0) { return .drop(.superseded) }
        let came = requestCame(copy.record, now: now)
        if let reason = pending.cancelReason(id, now: came, window: policy.lifetimeSeconds) {
            return take(machine) { $0.cancelRequested(reason: reason, now: now) }
        }
        switch wait {
        case .expired:
            // A TTL can run out a little early; the machine fails it at expiresAt.
            return take(machine) { $0.timerFired(now: max(now, $0.expiresAtDate), targetOnline: false, jitter: 0) }
        case .retryDue:
            let due = min(machine.retryAtDate ?? now, machine.expiresAtDate)
            let view = target(machine.route)
            return take(machine) { $0.timerFired(now: max(now, due), targetOnline: view.online && view.hasRoom, jitter: 0) }
        case .parked:
            if let queueRoute, queueRoute != machine.route { return .drop(.misplaced) }
            guard target(machine.route).online else { return .requeue }  // the agent left again
            // Events published after this copy mean it was taken up and
            // delivered (by a leader that died with it in flight): a reroute
            // then changes nothing.
            let deliveredSince = (known?.lastSeq ?? 0) > copy.lastSeq
            if let to = pending.takeReroute(id, now: came, window: policy.lifetimeSeconds), !(sameRouteIsNoOp && to == machine.route), !deliveredSince, let p = parts(to) {
                // Parked at the new target, as at a hand-off: a new copy there supersedes this
                // one, which a leader after a takeover would otherwise deliver at the old target.
                _ = machine.rerouteRequested(project: p.project, target: p.target, now: now, targetOnline: false)
                return take(machine) { $0.received(now: now, targetOnline: false) }
            }
            return take(machine) { $0.agentCameOnline(now: now) }
        }
    }

    /// A waiting dispatch whose lifetime ended: acted on from the copy the
    /// log keeps while nothing was published since it was written (else it
    /// was taken up, and its own timers or its copy end it).
    public static func expiry(known: DispatchKnowledge?, policy: RetryPolicy, owns: (RoutingTable.Route) -> Bool = { _ in true }) -> CommandOutcome {
        guard let known, !known.ended, let machine = endingMachine(known, policy: policy), owns(machine.route) else { return .ignore }
        return .actOnCopy(machine)
    }

    /// A machine that can end the dispatch from the copy the log keeps, also
    /// when a leader that died took it up since (the log shows events after
    /// the copy): an end needs nothing of what happened since but the seq,
    /// and the events are numbered above it. Its lease — back in a queue no
    /// one may read for hours (the park queue of a target gone offline) — is
    /// dropped when it surfaces, as the dispatch has ended.
    static func endingMachine(_ known: DispatchKnowledge, policy: RetryPolicy) -> DispatchMachine? {
        guard var copy = known.waiting, copy.lastSeq == known.copySeq else { return nil }
        if known.lastSeq > copy.lastSeq {
            // What follows a waiting copy is its delivery: the end keeps the step reached (2).
            copy.stepReached = max(copy.stepReached, 2)
            copy.everDelivered = true
        }
        return DispatchMachine(parked: copy, policy: policy, seqFloor: max(copy.lastSeq, known.lastSeq))
    }

    /// A cancel or reroute. With the sender split into partitions, every
    /// partition gets every command: `partition` is the one deciding and
    /// `partitionOf` tells a route's. Only the partition where the dispatch
    /// waits acts on its copy; another that knows where it is passes the
    /// command on there (it may have been moved there a moment ago, after
    /// that partition saw the command); one that knows nothing remembers it.
    /// `sameRouteIsNoOp`: a reroute to where it already waits changes nothing
    /// (with several partitions, as every partition gets it, and the one it
    /// moved to may see it after the move).
    public static func command(
        _ command: SenderCommand, known: DispatchKnowledge?, held: Bool, policy: RetryPolicy,
        partition: Int = 0, partitionOf: (RoutingTable.Route) -> Int = { _ in 0 }, sameRouteIsNoOp: Bool = false
    ) -> CommandOutcome {
        if known?.ended == true { return .ignore }
        if held { return .applyToHeld }
        // The copy the log keeps is used only while nothing was published
        // since it was written: a dispatch taken up since (by a leader that
        // died with it in flight) is acted on when its copy comes back.
        if let known, known.lastSeq <= known.copySeq, let copy = known.waiting, copy.lastSeq == known.copySeq,
            let machine = DispatchMachine(parked: copy, policy: policy, seqFloor: copy.lastSeq)
        {
            let home = partitionOf(machine.route)
            guard home == partition else { return .elsewhere(partition: home) }
            if sameRouteIsNoOp, case .reroute(_, let to) = command, to == machine.route { return .ignore }
            return .actOnCopy(machine)
        }
        // Taken up since by a leader that died: a cancel still ends it at once
        // (the contract's 1 s holds in every state); a reroute changes nothing
        // once delivered, and waits for the copy, which tells.
        if case .cancel = command, let known, let machine = endingMachine(known, policy: policy) {
            let home = partitionOf(machine.route)
            return home == partition ? .actOnCopy(machine) : .elsewhere(partition: home)
        }
        if let p = known?.partition, p != partition { return .elsewhere(partition: p) }
        return .remember
    }
}
