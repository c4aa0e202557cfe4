import Synchronization

/// The confirms of one window published by `AMQPChannel.publishWithoutWaiting`:
/// completed once by the connection, awaited by anyone.
public final class PublishConfirms: Sendable {
    public typealias Results = [Result<Void, AMQPError>]

    private enum State {
        case waiting([CheckedContinuation<Results, Error>])
        case done(Result<Results, Error>)
    }

    private let state = Mutex(State.waiting([]))
    /// Runs once, right after completion (on the connection thread).
    private let then: (@Sendable (Result<Results, Error>) -> Void)?

    init(then: (@Sendable (Result<Results, Error>) -> Void)? = nil) { self.then = then }

    func complete(_ result: Result<Results, Error>) {
        // Only the first completion counts: a window can be ended by its
        // last confirm and again by its channel's close, and `then` (which
        // settles the caller's deliveries) must see one result.
        let waiters = state.withLock { s -> [CheckedContinuation<Results, Error>]? in
            guard case .waiting(let waiters) = s else { return nil }
            s = .done(result)
            return waiters
        }
        guard let waiters else { return }
        for w in waiters { w.resume(with: result) }
        then?(result)
    }

    /// The result of each message, in order, once all are confirmed; throws
    /// if the channel or connection ended first.
    public func results() async throws -> Results {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Results, Error>) in
            let done = state.withLock { s -> Result<Results, Error>? in
                switch s {
                case .done(let result): return result
                case .waiting(var waiters):
                    waiters.append(c)
                    s = .waiting(waiters)
                    return nil
                }
            }
            if let done { c.resume(with: done) }
        }
    }
}
