import Foundation

/// One push to send for a dispatch: its payload, priority, and the status
/// event delivery it answers (acked once the push is done or superseded).
public struct PushUpdate: Sendable, Equatable {
    public var dispatchId: String
    public var seq: Int
    public var payload: Data
    public var priority: Int
    public var isEnd: Bool
    /// The delivery tag of the status event: acked when this update is sent, superseded or given up.
    public var tag: UInt64
    /// When the status event was published (for the push latency).
    public var eventAt: Date
    /// Set by the scheduler when it sends: the completion names it, so a late
    /// answer to an earlier send never settles a later one.
    public var sendID: UInt64 = 0

    public init(dispatchId: String, seq: Int, payload: Data, priority: Int, isEnd: Bool, tag: UInt64, eventAt: Date) {
        self.dispatchId = dispatchId
        self.seq = seq
        self.payload = payload
        self.priority = priority
        self.isEnd = isEnd
        self.tag = tag
        self.eventAt = eventAt
    }
}

/// Which pushes go out when, per dispatch: one in flight at a time, only the
/// newest pending update is kept (the older ones are acked as superseded),
/// preview-only updates (priority 5) at most one per `lowPriorityInterval`,
/// and after a 429, a 5xx or a network failure a jittered exponential back-off
/// before the newest update is tried again. A dispatch whose pushes have
/// failed for `giveUpAfter` in a row while other dispatches' pushes went
/// through (its token's trouble, not an outage: after one, the newest update
/// still goes out) is let go: what it holds is acked, so that a token APNs
/// never takes does not hold its status events, and the queue's log behind
/// them, for ever. Pure: the caller passes the time and the jitter, and
/// carries out the actions.
public struct PushScheduler: Sendable {
    public enum Outcome: Sendable, Equatable {
        /// 200.
        case delivered
        /// 410: the token is no longer valid.
        case gone
        /// 400, 403, …: this push will never be taken; logged and counted, not retried.
        case rejected
        /// 429, 5xx, no answer: back off and try the newest update again (after `after`, when APNs said).
        case retry(after: TimeInterval?)
    }

    public enum Action: Sendable, Equatable {
        case send(PushUpdate)
        case ack([UInt64])
        /// The token of this dispatch is gone (410): forget it.
        case dropToken(String)
        /// The activity ended and its end was delivered: nothing more to push for it.
        case finished(String)
        /// Every push of this dispatch failed for `giveUpAfter`: its updates were let go
        /// (acked in the same actions); a later status event is tried afresh.
        case gaveUp(String)
    }

    struct Slot: Sendable {
        var inFlight: PushUpdate?
        var pending: PushUpdate?
        var notBefore: Date = .distantPast
        var failures = 0
        /// The first failure of the current run of failures (nil: the last push was answered).
        var failingSince: Date?
        var lastLowPriority: Date = .distantPast
        var lastSeq = 0
        var lastState: DispatchState?
        var lastRoute: String?
        var touched: Date = .distantPast

        /// What the slot holds once the push `sent` has left it: its tag, and the pending one's.
        func tags(with sent: PushUpdate) -> [UInt64] { [sent.tag] + (pending.map { [$0.tag] } ?? []) }

        /// A push was answered (or the token changed): the run of failures is over.
        mutating func endFailures() {
            failures = 0
            failingSince = nil
        }
    }

    private var slots: [String: Slot] = [:]
    private var sends: UInt64 = 0
    /// The last time any push was delivered.
    private var lastDelivered: Date = .distantPast
    public let lowPriorityInterval: TimeInterval
    public let maxBackoff: TimeInterval
    public let giveUpAfter: TimeInterval
    /// 25 minutes of failures in a row (`FRONTDESK_APNS_GIVE_UP_S`): far past any outage a back-off
    /// rides out, well inside a Live Activity's eight hours, and inside RabbitMQ's default
    /// `consumer_timeout` (30 minutes), past which the broker closes a channel that holds a
    /// delivery unacked, and with it every other dispatch's held events.
    public static let defaultGiveUpSeconds = 1500

    public init(lowPriorityInterval: TimeInterval = 2, maxBackoff: TimeInterval = 60, giveUpAfter: TimeInterval = TimeInterval(defaultGiveUpSeconds)) {
        self.lowPriorityInterval = lowPriorityInterval
        self.maxBackoff = maxBackoff
        self.giveUpAfter = giveUpAfter
    }

    public var inFlightCount: Int { slots.values.filter { $0.inFlight != nil }.count }

    /// The state last submitted for the dispatch (for the priority of the next update).
    public func lastState(_ id: String) -> DispatchState? { slots[id]?.lastState }
    /// The route last submitted for the dispatch (`ActivityPush.route(of:)`).
    public func lastRoute(_ id: String) -> String? { slots[id]?.lastRoute }

    public mutating func submit(_ update: PushUpdate, state: DispatchState, route: String? = nil, now: Date) -> [Action] {
        var slot = slots[update.dispatchId] ?? Slot()
        slot.touched = now
        // The same event again (redelivered after a reconnect, or published twice): the hold moves to the
        // newest delivery of it, so that the broker's live copy is acked only once its push is done.
        if var held = slot.inFlight, held.seq == update.seq {
            let old = held.tag
            held.tag = update.tag
            slot.inFlight = held
            slots[update.dispatchId] = slot
            return [.ack([old])]
        }
        if var held = slot.pending, held.seq == update.seq {
            let old = held.tag
            held.tag = update.tag
            slot.pending = held
            slots[update.dispatchId] = slot
            return [.ack([old])]
        }
        guard update.seq > slot.lastSeq else {  // older than what was sent
            slots[update.dispatchId] = slot
            return [.ack([update.tag])]
        }
        slot.lastSeq = update.seq
        slot.lastState = state
        slot.lastRoute = route
        var actions: [Action] = []
        var update = update
        if let superseded = slot.pending {
            actions.append(.ack([superseded.tag]))
            // A change of state not yet delivered keeps its priority in the update that replaces it.
            update.priority = max(update.priority, superseded.priority)
        }
        slot.pending = update
        slots[update.dispatchId] = slot
        return actions + start(update.dispatchId, now: now)
    }

    /// The in-flight push of `id` (the send `sendID`; nil: whichever is in
    /// flight) ended with `outcome`; `jitter` in [0, 1).
    public mutating func completed(_ id: String, sendID: UInt64? = nil, _ outcome: Outcome, now: Date, jitter: Double) -> [Action] {
        guard var slot = slots[id], let sent = slot.inFlight, sendID == nil || sendID == sent.sendID else { return [] }
        slot.inFlight = nil
        switch outcome {
        case .delivered:
            slot.endFailures()
            lastDelivered = max(lastDelivered, now)
            if sent.priority == 5 { slot.lastLowPriority = now }
            if sent.isEnd {
                slots[id] = nil
                return [.ack(slot.tags(with: sent)), .finished(id)]
            }
            slots[id] = slot
            return [.ack([sent.tag])] + start(id, now: now)
        case .gone:
            slots[id] = nil
            return [.ack(slot.tags(with: sent)), .dropToken(id)]
        case .rejected:
            slot.endFailures()  // answered: APNs is there, this update will never do
            if sent.isEnd {  // nothing follows an end: the activity is done with
                slots[id] = nil
                return [.ack(slot.tags(with: sent)), .finished(id)]
            }
            slots[id] = slot
            return [.ack([sent.tag])] + start(id, now: now)
        case .retry(let after):
            let since = min(slot.failingSince ?? now, now)  // a clock set back does not stretch the run
            if now.timeIntervalSince(since) >= giveUpAfter, lastDelivered > since {
                let tags = slot.tags(with: sent)
                if sent.isEnd || slot.pending?.isEnd == true {  // nothing follows an end: done with
                    slots[id] = nil
                    return [.ack(tags), .gaveUp(id), .finished(id)]
                }
                // Kept (its last seq still tells a redelivered older event): nothing held, idle, forgotten in time.
                slot.pending = nil
                slot.endFailures()
                slot.notBefore = .distantPast
                slots[id] = slot
                return [.ack(tags), .gaveUp(id)]
            }
            slot.failingSince = since
            slot.failures += 1
            let exponential = min(maxBackoff, 0.5 * pow(2, Double(min(slot.failures - 1, 16))))
            // Jitter only shortens, to no less than half; APNs' own Retry-After wins when longer, spread
            // over a tenth more (so that activities it turned away together do not all come back at once).
            let spread = min(max(jitter, 0), 1)
            let wait = max(exponential * (0.5 + 0.5 * spread), min((after ?? 0) * (1 + 0.1 * spread), maxBackoff))
            slot.notBefore = now.addingTimeInterval(wait)
            var actions: [Action] = []
            if var newer = slot.pending {
                actions.append(.ack([sent.tag]))  // a newer update replaces it, keeping a change of state's priority
                newer.priority = max(newer.priority, sent.priority)
                slot.pending = newer
            } else {
                slot.pending = sent  // the newest is still this one: try it again
            }
            slots[id] = slot
            return actions
        }
    }

    /// A new token was registered for `id`: its failures were the old token's, and what waits goes now.
    public mutating func tokenChanged(_ id: String, now: Date) -> [Action] {
        guard var slot = slots[id] else { return [] }
        slot.endFailures()
        slot.notBefore = .distantPast
        slots[id] = slot
        return start(id, now: now)
    }

    /// Forgets every activity (the connection went: the broker has its events
    /// back), keeping the settings and the send counter, so that a late answer
    /// to a send from before never settles one made after.
    public mutating func reset() {
        slots = [:]
    }

    /// Sends what waited for a back-off or the low-priority interval to pass.
    public mutating func due(now: Date) -> [Action] {
        var actions: [Action] = []
        for id in slots.keys where slots[id]?.inFlight == nil && slots[id]?.pending != nil {
            actions += start(id, now: now)
        }
        return actions
    }

    /// The earliest time `due` has something to send, if anything waits.
    public func nextDue() -> Date? {
        slots.values.compactMap { s -> Date? in
            guard s.inFlight == nil, let p = s.pending else { return nil }
            return max(s.notBefore, p.priority == 5 ? s.lastLowPriority.addingTimeInterval(lowPriorityInterval) : .distantPast)
        }.min()
    }

    /// Forgets activities idle since `cutoff` (an end never delivered, a takeover): what they held is returned.
    public mutating func forget(idleSince cutoff: Date) -> [UInt64] {
        var tags: [UInt64] = []
        for (id, slot) in slots where slot.touched < cutoff && slot.inFlight == nil {
            if let p = slot.pending { tags.append(p.tag) }
            slots[id] = nil
        }
        return tags
    }

    /// Everything held (a shutdown): the tags not yet acked, to be returned to the broker.
    public func heldTags() -> [UInt64] {
        slots.values.flatMap { [$0.inFlight?.tag, $0.pending?.tag].compactMap { $0 } }
    }

    private mutating func start(_ id: String, now: Date) -> [Action] {
        guard var slot = slots[id], slot.inFlight == nil, var next = slot.pending, now >= slot.notBefore else { return [] }
        slot.touched = now
        if next.priority == 5, now < slot.lastLowPriority.addingTimeInterval(lowPriorityInterval) { return [] }
        slot.pending = nil
        sends += 1
        next.sendID = sends
        slot.inFlight = next
        slots[id] = slot
        return [.send(next)]
    }
}
