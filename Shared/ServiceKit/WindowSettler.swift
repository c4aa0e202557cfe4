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

    private let order = InOrderSettlement()
    private let state = Mutex<(inFlight: Int, failure: (any Error)?, waits: ConfirmWait)>((0, nil, ConfirmWait()))
    private let failed: @Sendable () -> Void

    public init(failed: @escaping @Sendable () -> Void) { self.failed = failed }

    /// Publishes a window on `publisher`; once all of it is confirmed, runs
    /// `confirmed` and acks `acks`. Waits while too many windows are in flight.
    public func publish(
        _ messages: [OutboundMessage], on publisher: AMQPChannel, acks: [AMQPDelivery],
        confirmed: (@Sendable () -> Void)? = nil
    ) async throws {
        let number = order.issue()
        let inFlight = state.withLock { s -> Int in
            s.inFlight += 1
            s.waits.published(at: .now)
            return s.inFlight
        }
        publisher.publishWithoutWaiting(messages) { [self] outcome in
            order.complete(number, .now { [self] in settle(outcome, acks: acks, confirmed: confirmed) })
        }
        if inFlight > Self.maxInFlight { try await settled() }
    }

    private func settle(_ outcome: Result<PublishConfirms.Results, any Error>, acks: [AMQPDelivery], confirmed: (@Sendable () -> Void)?) {
        defer {
            state.withLock { s in
                s.inFlight -= 1
                s.waits.settledOldest()
            }
        }
        guard state.withLock({ $0.failure == nil }) else { return }
        do {
            for result in try outcome.get() { try result.get() }
            confirmed?()
            for delivery in acks { try delivery.ack() }
        } catch {
            state.withLock { $0.failure = error }
            failed()
        }
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
