import Foundation

/// A parked dispatch, as it waits in its target's park queue: everything a
/// sender needs to take it up again, on any replica.
public struct ParkedDispatch: Sendable, Codable, Equatable {
    public var record: DispatchRecord
    public var project: StatusEvent.Project
    public var target: StatusEvent.Target
    public var attempt: Int
    public var everDelivered: Bool
    public var lastSeq: Int
    public var stepReached: Int
    /// Set while a retry waits (in a delay queue): when the next attempt is due.
    public var retryAt: String?

    public static let type = "frontdesk.sender.parked.v1"

    /// The route it waits for.
    public var route: RoutingTable.Route { .init(project: project.id, target: target.id) }

    /// Its message id in the park queue: one per park (each follows a new
    /// `queued` event, so `lastSeq` differs), the same after it expires or
    /// is passed on to another partition, since the body is.
    public var parkKey: String { "\(record.id)/parked/\(lastSeq)" }
}

extension DispatchMachine {
    /// What goes into the park queue.
    public var parked: ParkedDispatch {
        ParkedDispatch(
            record: record, project: project, target: target, attempt: attempt, everDelivered: everDelivered,
            lastSeq: lastSeq, stepReached: stepReachedValue, retryAt: retryAtDate.map(RFC3339.format))
    }

    /// When the waiting retry is due, while one waits.
    public var retryAtDate: Date? {
        if case .retryWait(let at) = phase { return at }
        return nil
    }

    /// A parked dispatch taken up again; `seqFloor` as in `init(record:)`.
    public init?(parked p: ParkedDispatch, policy: RetryPolicy, seqFloor: Int = 0) {
        guard var m = DispatchMachine(record: p.record, policy: policy, seqFloor: max(p.lastSeq, seqFloor)) else { return nil }
        m.restore(project: p.project, target: p.target, attempt: p.attempt, everDelivered: p.everDelivered, stepReached: p.stepReached)
        if let text = p.retryAt, let at = RFC3339.parse(text) { m.waitForRetry(until: at) }
        self = m
    }
}

/// The task body of the agent protocol.
public struct AgentTask: Sendable, Codable, Equatable {
    public var dispatchId: String
    public var attempt: Int
    public var input: String
    public var project: StatusEvent.Project
    public var target: StatusEvent.Target
    public var user: String?
    public var threadId: String?
    public var deadline: String

    public static let type = "frontdesk.agent.task.v1"

    public init(
        dispatchId: String, attempt: Int, input: String, project: StatusEvent.Project, target: StatusEvent.Target,
        user: String?, threadId: String?, deadline: String
    ) {
        self.dispatchId = dispatchId
        self.attempt = attempt
        self.input = input
        self.project = project
        self.target = target
        self.user = user
        self.threadId = threadId
        self.deadline = deadline
    }

    public init(_ m: DispatchMachine, attempt: Int) {
        dispatchId = m.record.id
        self.attempt = attempt
        input = m.record.input ?? ""
        project = m.project
        target = m.target
        user = m.record.user
        threadId = m.record.threadId
        deadline = m.record.expiresAt
    }

    public var messageID: String { "\(dispatchId)/\(attempt)" }
}
