import AMQP
import ServiceKit
import Synchronization

/// Settles a term's published windows in publish order, off the term loop:
/// once a window's confirms are in, notes its status events in the status
/// log and acks the leases it settled — on the connection thread where the
/// confirms arrive, without a task in between. The term publishes its next
/// window without waiting, so an input that arrives while a window is in
/// flight is handled at once. The first failure stops all later acks and
/// ends the term.
final class Settler: Sendable {
    /// Windows in flight before `settle(_:)` waits for them.
    static let maxInFlight = 4

    private let order = InOrderSettlement()
    private let state = Mutex<(inFlight: Int, failure: (any Error)?)>((0, nil))
    private let statusLog: StatusLog
    /// Called once, on the first failure.
    private let failed: @Sendable () -> Void

    init(statusLog: StatusLog, failed: @escaping @Sendable () -> Void) {
        self.statusLog = statusLog
        self.failed = failed
    }

    /// Publishes a window on `publisher` and settles it once confirmed;
    /// waits while too many are in flight.
    func publish(
        _ messages: [OutboundMessage], on publisher: AMQPChannel, events: [OutboundMessage], acks: [AMQPDelivery]
    ) async throws {
        let number = order.issue()
        let inFlight = state.withLock { s -> Int in
            s.inFlight += 1
            return s.inFlight
        }
        publisher.publishWithoutWaiting(messages) { [self] outcome in
            order.complete(number, .now { [self] in settle(outcome, events: events, acks: acks) })
        }
        if inFlight > Self.maxInFlight { try await settled() }
    }

    private func settle(_ outcome: Result<PublishConfirms.Results, any Error>, events: [OutboundMessage], acks: [AMQPDelivery]) {
        defer { state.withLock { $0.inFlight -= 1 } }
        guard state.withLock({ $0.failure == nil }) else { return }
        do {
            for result in try outcome.get() { try result.get() }
            for m in events { statusLog.note(properties: m.properties, routingKey: m.routingKey) }
            for lease in acks { try lease.ack() }
        } catch {
            state.withLock { $0.failure = error }
            failed()
        }
    }

    /// Waits until every window published so far is settled; throws the failure if one failed.
    func settled() async throws {
        await order.idle()
        try check()
    }

    /// Throws the failure that stopped settling, if any.
    func check() throws {
        if let failure = state.withLock({ $0.failure }) { throw failure }
    }
}
