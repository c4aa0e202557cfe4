import AMQP
import Synchronization

/// Settles published windows in publish order, off the publisher's loop:
/// once a window's confirms are in, runs its `confirmed` work and acks the
/// deliveries it settled — on the connection thread where the confirms
/// arrive, without a task in between. The loop publishes its next window
/// without waiting, so an input that arrives while a window is in flight is
/// handled at once. The first failure stops all later acks and calls
/// `failed` once.
public final class WindowSettler: Sendable {
    /// Windows in flight before `publish` waits for them.
    public static let maxInFlight = 4

    private struct State {
        var inFlight = 0
        /// Windows whose confirms have not all come yet (settled or not).
        var unconfirmed = 0
        var failure: (any Error)?
        var waits = ConfirmWait()
        /// Repeatable messages the broker nacked or did not confirm in time,
        /// as their confirms came: `publishFailedAgain` publishes them once more.
        var again: [OutboundMessage] = []
    }

    private let order = InOrderSettlement()
    private let state = Mutex(State())
    private let failed: @Sendable () -> Void
    private let tolerates: (@Sendable (OutboundMessage, AMQPError) -> Bool)?

    /// `tolerates` (on the connection thread, once for each message that
    /// failed) says whether a failure is the caller's to handle, not the
    /// window's: the window then settles as if that message went through.
    public init(
        tolerates: (@Sendable (OutboundMessage, AMQPError) -> Bool)? = nil, failed: @escaping @Sendable () -> Void
    ) {
        self.tolerates = tolerates
        self.failed = failed
    }

    /// Publishes a window on `publisher`; once all of it is confirmed, runs
    /// `confirmed` and acks `acks`. Waits while too many windows are in flight.
    public func publish(
        _ messages: [OutboundMessage], on publisher: AMQPChannel, acks: [AMQPDelivery],
        confirmed: (@Sendable () -> Void)? = nil
    ) async throws {
        let number = order.issue()
        let inFlight = state.withLock { s -> Int in
            s.inFlight += 1
            s.unconfirmed += 1
            s.waits.published(at: .now)
            return s.inFlight
        }
        publisher.publishWithoutWaiting(messages) { [self] outcome in
            keepFailed(outcome, messages)
            order.complete(number, .now { [self] in settle(outcome, messages, acks: acks, confirmed: confirmed) })
        }
        if inFlight > Self.maxInFlight { try await settled() }
    }

    /// A nack does not unroute: a status event the broker nacked because one
    /// of its queues refused it may be in the others (the status log a new
    /// leader reads). Such messages are kept to be published again — as
    /// their confirms come, not in window order, so that a window still
    /// waiting holds none of them back.
    private func keepFailed(_ outcome: Result<PublishConfirms.Results, any Error>, _ messages: [OutboundMessage]) {
        var again: [OutboundMessage] = []
        if case .success(let results) = outcome, results.contains(where: { if case .failure = $0 { true } else { false } }) {
            again = zip(messages, results).compactMap { m, r -> OutboundMessage? in
                guard m.repeatable, case .failure(let e) = r, e.code == .nacked || e.code == .timeout else { return nil }
                return m
            }
        }
        state.withLock { s in
            s.unconfirmed -= 1
            s.again += again
        }
    }

    private func settle(
        _ outcome: Result<PublishConfirms.Results, any Error>, _ messages: [OutboundMessage], acks: [AMQPDelivery],
        confirmed: (@Sendable () -> Void)?
    ) {
        defer {
            state.withLock { s in
                s.inFlight -= 1
                s.waits.settledOldest()
            }
        }
        guard state.withLock({ $0.failure == nil }) else { return }
        do {
            for (message, result) in zip(messages, try outcome.get()) {
                if case .failure(let error) = result, !(tolerates?(message, error) ?? false) { throw error }
            }
            confirmed?()
            for delivery in acks { try delivery.ack() }
        } catch {
            state.withLock { $0.failure = error }
            failed()
        }
    }

    /// After a failure, before the leases go back: publishes the repeatable
    /// messages the broker nacked or did not confirm (those `include` takes)
    /// once more, each round on a new channel of `connection` (on RabbitMQ
    /// 3.10 a channel can keep nacking every publish to a quorum queue whose
    /// leader moved), as the confirms of the windows still in flight come,
    /// until all are confirmed, `within` has passed, or `maxRefusedRounds`
    /// rounds in a row got none through (a queue that refuses for good).
    /// Returns how many were published again and how many could not be.
    public func publishFailedAgain(
        on connection: AMQPConnection, within: Duration, only include: (OutboundMessage) -> Bool
    ) async -> (published: Int, left: Int) {
        let deadline = ContinuousClock.now + within
        var left: [OutboundMessage] = []
        var total = 0, refused = 0
        var pause = Duration.milliseconds(100)
        while connection.isOpen, !Task.isCancelled, ContinuousClock.now < deadline, refused < Self.maxRefusedRounds {
            let (more, waiting) = state.withLock { s in
                defer { s.again = [] }
                return (s.again.filter(include), s.unconfirmed > 0)
            }
            total += more.count
            left += more
            if left.isEmpty {
                guard waiting else { break }
                try? await Task.sleep(for: .milliseconds(20))
                continue
            }
            let before = left.count
            left = await publishOnce(left, on: connection, until: deadline)
            if left.isEmpty { continue }  // (windows may still be in flight)
            refused = left.count == before ? refused + 1 : 0
            try? await Task.sleep(for: max(.zero, min(pause, deadline - ContinuousClock.now)))
            pause = min(pause * 2, .seconds(1))
        }
        let late = state.withLock { s in
            defer { s.again = [] }
            return s.again.filter(include).count
        }
        return (total - left.count, left.count + late)
    }

    /// Rounds in a row with nothing published before `publishFailedAgain` gives up.
    public static let maxRefusedRounds = 3

    /// Publishes `messages` on a new confirming channel; returns those not confirmed.
    private func publishOnce(_ messages: [OutboundMessage], on connection: AMQPConnection, until deadline: ContinuousClock.Instant) async -> [OutboundMessage] {
        guard let channel = try? await connection.openChannel() else { return messages }
        // Closing the channel at the deadline ends the wait for its confirms.
        let closer = Task {
            guard (try? await Task.sleep(for: max(.zero, deadline - ContinuousClock.now))) != nil else { return }
            await channel.close()
        }
        defer { closer.cancel() }
        var left = messages
        if (try? await channel.confirmSelect()) != nil, let results = try? await channel.publish(messages) {
            left = zip(messages, results).compactMap { m, r in if case .failure = r { m } else { nil } }
        }
        await channel.close()
        return left
    }

    /// Waits until every window published so far is settled; throws the failure if one failed.
    public func settled() async throws {
        await order.idle()
        try check()
    }

    /// How long the oldest window in flight has waited for its confirms, once
    /// per window, when that is at least `after` (a caller's warning: every
    /// later window's acks wait behind it).
    public func overdueWindow(after: Duration) -> Duration? {
        state.withLock { $0.waits.overdue(after: after, now: .now) }
    }

    /// Throws the failure that stopped settling, if any.
    public func check() throws {
        if let failure = state.withLock({ $0.failure }) { throw failure }
    }
}
