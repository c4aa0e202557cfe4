import Foundation

/// How the sender retries (CONTRACT.md, Sender behaviour).
public struct RetryPolicy: Sendable, Equatable {
    public var baseMs: Int
    public var maxMs: Int
    public var maxAttempts: Int
    public var replyTimeoutSeconds: Int
    /// How long the sender remembers finished dispatches (the lifetime window).
    public var lifetimeSeconds: Int

    public init(baseMs: Int = 1000, maxMs: Int = 60_000, maxAttempts: Int = 5, replyTimeoutSeconds: Int = 600, lifetimeSeconds: Int = 14_400) {
        self.baseMs = baseMs
        self.maxMs = maxMs
        self.maxAttempts = maxAttempts
        self.replyTimeoutSeconds = replyTimeoutSeconds
        self.lifetimeSeconds = lifetimeSeconds
    }

    /// Delay before attempt n+1: min(max, base × 2^(n−1)), jittered down to no
    /// less than half; `unit` in [0, 1) picks the point.
    public func delayMs(afterAttempt n: Int, unit: Double) -> Int {
        let exponent = min(max(n - 1, 0), 40)
        let (product, overflow) = baseMs.multipliedReportingOverflow(by: 1 << exponent)
        let ceiling = overflow ? maxMs : min(maxMs, product)
        let floor = (ceiling + 1) / 2
        return floor + Int((Double(ceiling - floor) * min(max(unit, 0), 0.999_999_999)).rounded(.down))
    }
}

/// One dispatch in the sender, as a value: inputs are methods named after
/// what happened, each returns the actions the sender must carry out, in
/// order. It knows nothing of messages or sockets; times come in as
/// arguments, so tests drive it with any clock.
public struct DispatchMachine: Sendable {
    public enum Phase: Sendable, Equatable {
        /// Waiting for an agent of the target (or its retry time has passed).
        case parked
        /// Delivered to an agent as `attempt`, waiting for its replies.
        case inFlight(deliveredAt: Date)
        /// A retry waits until `retryAt`.
        case retryWait(retryAt: Date)
        case finished(DispatchState)
    }

    /// Complete: carrying one out needs nothing read back from the machine.
    public enum Action: Sendable, Equatable {
        /// Publish this task to its target's agent queue (before the event that follows).
        case deliver(AgentTask)
        case publish(StatusEvent)
        /// Arm (or re-arm) the one timer of this dispatch for `at`; `nil` disarms it.
        case setTimer(Date?)
        /// Keep the dispatch parked durably at its target, as this copy, until its lifetime ends.
        case park(ParkedDispatch, until: Date)
        /// A retry waits durably, as this copy, until `until` (when it is due,
        /// or when the lifetime ends if that is sooner).
        case delay(ParkedDispatch, until: Date)
        /// The dispatch ended in this state: release whatever holds it.
        case finish(DispatchState)
    }

    /// The router's record; a reroute replaces its route (kept in the parked copy).
    public private(set) var record: DispatchRecord
    public let policy: RetryPolicy
    public private(set) var project: StatusEvent.Project
    public private(set) var target: StatusEvent.Target
    public private(set) var phase: Phase
    /// The current attempt once delivered; in `parked` or `retryWait`, the next one.
    public private(set) var attempt = 1
    public private(set) var everDelivered = false
    public private(set) var lastSeq: Int
    private var stepReached = 1
    private var latestActivity: String?
    private var latestEtaMs: Int?
    private var latestText = ""
    let expiresAt: Date
    let startedAt: Date

    /// A dispatch handed over by the router. `seqFloor` lets a sender that
    /// takes over after a crash number its events above anything published before.
    public init?(record: DispatchRecord, policy: RetryPolicy, seqFloor: Int = 0) {
        guard record.outcome == .routed, let project = record.project, let target = record.target,
            let started = RFC3339.parse(record.startedAt), let expires = RFC3339.parse(record.expiresAt)
        else { return nil }
        self.record = record
        self.policy = policy
        self.project = project
        self.target = target
        self.phase = .parked
        self.lastSeq = max(record.lastSeq, seqFloor)
        self.startedAt = started
        self.expiresAt = expires
    }

    public var isFinished: Bool { if case .finished = phase { true } else { false } }

    var stepReachedValue: Int { stepReached }

    /// When the dispatch's lifetime ends.
    public var expiresAtDate: Date { expiresAt }

    mutating func waitForRetry(until at: Date) { phase = .retryWait(retryAt: at) }

    mutating func restore(project: StatusEvent.Project, target: StatusEvent.Target, attempt: Int, everDelivered: Bool, stepReached: Int) {
        self.project = project
        self.target = target
        self.attempt = attempt
        self.everDelivered = everDelivered
        self.stepReached = stepReached
    }

    public var route: RoutingTable.Route { .init(project: project.id, target: target.id) }

    // MARK: Inputs

    /// The sender took the dispatch: deliver at once if an agent is there, else park.
    public mutating func received(now: Date, targetOnline: Bool) -> [Action] {
        guard case .parked = phase else { return [] }
        if now >= expiresAt { return expire(now: now) }
        if targetOnline { return deliver(now: now) }
        return parkAndQueue(now: now)
    }

    public mutating func agentCameOnline(now: Date) -> [Action] {
        guard case .parked = phase else { return [] }
        if now >= expiresAt { return expire(now: now) }
        return deliver(now: now)
    }

    /// The target has no agent any more: a dispatch in flight goes back to
    /// queued until one returns, as the next attempt.
    public mutating func agentWentOffline(now: Date) -> [Action] {
        guard case .inFlight = phase else { return [] }
        // The failed event shows the last attempt made, never one above the maximum.
        if attempt >= policy.maxAttempts { return fail(now: now, "retries_exhausted", "no final reply after \(policy.maxAttempts) attempts") }
        attempt += 1
        phase = .parked
        latestEtaMs = nil
        return parkAndQueue(now: now)
    }

    /// The one timer fired: a retry is due, the reply timed out, or the dispatch
    /// expired. `jitter` in [0, 1) picks a retry delay.
    public mutating func timerFired(now: Date, targetOnline: Bool, jitter: Double) -> [Action] {
        if isFinished { return [] }
        if now >= expiresAt { return expire(now: now) }
        switch phase {
        case .retryWait(let retryAt) where now >= retryAt:
            phase = .parked
            if targetOnline { return deliver(now: now) }
            // queued → queued: the retry wait became a wait for an agent.
            return parkAndQueue(now: now)
        case .inFlight(let deliveredAt) where now >= deliveredAt.addingTimeInterval(TimeInterval(policy.replyTimeoutSeconds)):
            return retryOrFail(now: now, unit: jitter, reason: "no final reply within \(policy.replyTimeoutSeconds) s")
        default:
            return [.setTimer(nextDeadline)]
        }
    }

    /// A reply from an agent; `jitter` in [0, 1) picks the retry delay.
    public mutating func replyReceived(_ reply: AgentReply, now: Date, jitter: Double) -> [Action] {
        guard case .inFlight = phase, reply.attempt == attempt, reply.dispatchId == record.id else { return [] }
        if let text = reply.text { latestText = text }
        if let activity = reply.activity, !activity.isEmpty { latestActivity = activity }
        switch reply.kind {
        case .accepted, .progress:
            latestEtaMs = reply.etaMs
            return [event(.sending, now: now)]
        case .final:
            latestEtaMs = nil
            phase = .finished(.replied)
            stepReached = 3
            return [event(.replied, now: now), .setTimer(nil), .finish(.replied)]
        case .error:
            latestEtaMs = nil
            guard reply.retryable else {
                let e = reply.error ?? .init(code: "agent_error", message: "the agent failed")
                return fail(now: now, "agent_error", e.message.isEmpty ? "the agent failed: \(e.code)" : e.message)
            }
            return retryOrFail(now: now, unit: jitter, reason: reply.error?.message ?? "a retryable agent error")
        }
    }

    /// The broker refused attempt `attempt`'s task (its agent queue nacked it,
    /// full with a length limit, or it was returned: the queue is gone). The
    /// agent never got it: as a retryable error, the next attempt waits its
    /// backoff, and after the last one the dispatch fails.
    public mutating func taskRefused(attempt refused: Int, reason: String, now: Date, jitter: Double) -> [Action] {
        guard case .inFlight = phase, refused == attempt else { return [] }
        latestEtaMs = nil
        return retryOrFail(now: now, unit: jitter, reason: reason)
    }

    public mutating func cancelRequested(reason: String, now: Date) -> [Action] {
        guard !isFinished else { return [] }
        phase = .finished(.cancelled)
        latestEtaMs = nil
        var e = makeEvent(.cancelled, now: now)
        e.cancel = .init(reason: reason)
        return [.publish(e), .setTimer(nil), .finish(.cancelled)]
    }

    public enum RerouteOutcome: Sendable, Equatable {
        case moved([Action])
        /// Delivered once already (or finished): a reroute changes nothing.
        case refused
    }

    /// Moves a never-delivered dispatch to another target.
    public mutating func rerouteRequested(
        project: StatusEvent.Project, target: StatusEvent.Target, now: Date, targetOnline: Bool
    ) -> RerouteOutcome {
        guard !everDelivered, case .parked = phase else { return .refused }
        self.project = project
        self.target = target
        // The route is the one asked for now: the resolver's guess, its confidence and alternatives no longer apply.
        let names = (project.name.isEmpty ? project.id : project.name, target.name.isEmpty ? target.id : target.name)
        record.route = .init(confidence: 1, reason: "rerouted to \(names.0) / \(names.1)", alternatives: [])
        if targetOnline { return .moved(deliver(now: now)) }
        return .moved(parkAndQueue(now: now))
    }

    // MARK: Steps

    /// queued (agent_offline) with the copy that holds it durably.
    private mutating func parkAndQueue(now: Date) -> [Action] {
        let queued = event(.queued, now: now, queue: .init(reason: "agent_offline"))
        return [.park(parked, until: expiresAt), queued, .setTimer(expiresAt)]
    }

    private var nextDeadline: Date {
        switch phase {
        case .retryWait(let at): min(at, expiresAt)
        case .inFlight(let deliveredAt): min(deliveredAt.addingTimeInterval(TimeInterval(policy.replyTimeoutSeconds)), expiresAt)
        default: expiresAt
        }
    }

    private mutating func deliver(now: Date) -> [Action] {
        phase = .inFlight(deliveredAt: now)
        everDelivered = true
        stepReached = 2
        latestEtaMs = nil
        latestText = ""
        latestActivity = nil
        let sending = event(.sending, now: now)
        return [.deliver(AgentTask(self, attempt: attempt)), sending, .setTimer(nextDeadline)]
    }

    private mutating func retryOrFail(now: Date, unit: Double, reason: String) -> [Action] {
        guard attempt < policy.maxAttempts else {
            return fail(now: now, "retries_exhausted", "\(reason); gave up after \(policy.maxAttempts) attempts")
        }
        let delay = policy.delayMs(afterAttempt: attempt, unit: unit)
        let retryAt = now.addingTimeInterval(Double(delay) / 1000)
        attempt += 1
        phase = .retryWait(retryAt: retryAt)
        let queued = event(.queued, now: now, queue: .init(reason: "retry_wait", retryAt: RFC3339.format(retryAt)))
        return [.delay(parked, until: min(retryAt, expiresAt)), queued, .setTimer(nextDeadline)]
    }

    private mutating func expire(now: Date) -> [Action] {
        fail(now: now, "expired", "not finished within its lifetime (expired at \(record.expiresAt))")
    }

    private mutating func fail(now: Date, _ code: String, _ message: String) -> [Action] {
        phase = .finished(.failed)
        latestEtaMs = nil
        var e = makeEvent(.failed, now: now)
        e.error = .init(code: code, message: message)
        return [.publish(e), .setTimer(nil), .finish(.failed)]
    }

    // MARK: Events

    private mutating func event(_ state: DispatchState, now: Date, queue: StatusEvent.QueueInfo? = nil) -> Action {
        var e = makeEvent(state, now: now)
        e.queue = queue
        return .publish(e)
    }

    /// The next event, numbered and filled as CONTRACT.md's field rules say.
    private mutating func makeEvent(_ state: DispatchState, now: Date) -> StatusEvent {
        lastSeq += 1
        let preview = AgentReply.preview(of: latestText)
        var e = StatusEvent(
            dispatchId: record.id, seq: lastSeq, state: state, step: state.step ?? stepReached,
            activity: activity(for: state), input: record.input, project: project, target: target, route: record.route,
            attempt: attempt, startedAt: record.startedAt, at: RFC3339.format(now),
            elapsedMs: max(0, Int((now.timeIntervalSince(startedAt) * 1000).rounded())), expiresAt: record.expiresAt,
            threadId: record.threadId, user: record.user)
        if state == .sending || state == .replied { e.preview = preview }
        if state == .sending { e.etaMs = latestEtaMs }
        if state == .replied { e.reply = latestText }
        return e
    }

    private func activity(for state: DispatchState) -> String {
        switch state {
        case .sending: latestActivity ?? "Sending to \(target.name)"
        case .queued: "Queued — will dispatch on reconnect"
        case .replied: "Agent replied"
        case .failed: "Failed"
        case .cancelled: "Cancelled"
        case .drafted: "Drafted"
        case .routing: "Routing"
        }
    }
}
