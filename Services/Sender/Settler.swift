import AMQP
import Synchronization

/// Settles a term's published windows in publish order, off the term loop:
/// waits for a window's confirms, notes its status events in the status log,
/// then acks the leases it settled. The term publishes its next window
/// without waiting, so an input that arrives while a window is in flight is
/// handled at once (confirms on one channel come back in publish order).
/// The first failure stops all later acks and ends the term.
final class Settler: Sendable {
    private enum Item: Sendable {
        case window(PublishConfirms, events: [OutboundMessage], acks: [AMQPDelivery])
        case barrier(CheckedContinuation<Void, Never>)
    }

    /// Windows in flight before `settle(_:)` waits for the oldest.
    static let maxInFlight = 4

    private let items = AsyncStream<Item>.makeStream()
    private let state = Mutex<(inFlight: Int, failure: Error?)>((0, nil))

    /// Runs until `finish()`; on a failure calls `failed` once.
    func run(statusLog: StatusLog, failed: @Sendable () -> Void) async {
        for await item in items.stream {
            switch item {
            case .barrier(let c):
                c.resume()
            case .window(let confirms, let events, let acks):
                defer { state.withLock { $0.inFlight -= 1 } }
                guard state.withLock({ $0.failure == nil }) else { continue }
                do {
                    for result in try await confirms.results() { try result.get() }
                    for m in events { statusLog.note(properties: m.properties, routingKey: m.routingKey) }
                    for lease in acks { try lease.ack() }
                } catch {
                    state.withLock { $0.failure = error }
                    failed()
                }
            }
        }
    }

    /// Queues a published window; waits while too many are in flight.
    func settle(_ confirms: PublishConfirms, events: [OutboundMessage], acks: [AMQPDelivery]) async throws {
        let inFlight = state.withLock { s -> Int in
            s.inFlight += 1
            return s.inFlight
        }
        items.continuation.yield(.window(confirms, events: events, acks: acks))
        if inFlight > Self.maxInFlight { try await settled() }
    }

    /// Waits until every window queued so far is settled; throws the failure if one failed.
    func settled() async throws {
        await withCheckedContinuation { items.continuation.yield(.barrier($0)) }
        try check()
    }

    /// Throws the failure that stopped settling, if any.
    func check() throws {
        if let failure = state.withLock({ $0.failure }) { throw failure }
    }

    func finish() { items.continuation.finish() }
}
