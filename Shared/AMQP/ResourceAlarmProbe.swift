import Foundation
import Synchronization

/// Tells whether the broker blocks publishing with a resource alarm, for a
/// service that may be idle. RabbitMQ sends `connection.blocked` only to a
/// connection that publishes during the alarm (one that has not is merely
/// "blocking"), so an idle service would never learn of it and its `/readyz`
/// would stay 200. The probe publishes an empty message every `interval` on a
/// connection of its own (blocking it blocks none of the service's work) to
/// a routing key the default exchange routes nowhere, and reports the
/// `connection.blocked` reason that comes back. A probe connection that ends
/// while blocked leaves the alarm standing until a new one has published and
/// stayed unblocked for an interval. Failures (a refused login or publish, a
/// broker away) are tried again after a back-off of up to a minute.
public final class ResourceAlarmProbe: Sendable {
    /// How often it publishes (and so how soon an alarm shows).
    public static let interval = Duration.seconds(2)
    /// Queue names that begin with "amq." are the broker's own: no client can
    /// declare one, so the default exchange never routes this key to a queue.
    public static let routingKey = "amq.frontdesk.alarm-probe"
    /// The longest wait before connecting again after failures in a row.
    static let maxBackoff = Duration.seconds(60)
    /// The probe's RPCs (connect, open, close) wait at most this: a blocked
    /// connection's close is never answered while the alarm lasts (the broker
    /// reads nothing from it), and a shutdown must not wait for it.
    static let rpcTimeoutMs = 2000

    private struct State {
        var connection: AMQPConnection?
        /// The alarm a probe connection that ended was blocked by, until a new one shows it cleared.
        var carried: String?
        var stopped = false
        /// The current pause, which `shutdown()` ends.
        var pause: Task<Void, Never>?
    }

    private let configuration: AMQPConnectionConfiguration
    private let state = Mutex(State())

    public init(configuration: AMQPConnectionConfiguration) {
        var configuration = configuration
        configuration.connectionName += " (alarm probe)"
        configuration.rpcTimeoutMs = Self.rpcTimeoutMs
        self.configuration = configuration
    }

    /// Why the broker blocks publishing, as the probe last learned; nil while
    /// it does not, or nothing is known (no probe connection has worked yet).
    public var blockedReason: String? { state.withLock { $0.connection?.blockedReason ?? $0.carried } }

    /// Probes until `shutdown()`.
    public func run() async {
        let nodes = configuration.nodes.shuffled()
        var next = 0
        var failures = 0
        while !isStopped {
            var connection: AMQPConnection?
            var published = false
            do {
                let c = try await AMQPConnection.connect(configuration.to(nodes[next % nodes.count]))
                connection = c
                let kept = state.withLock { s -> Bool in
                    guard !s.stopped else { return false }
                    s.connection = c
                    return true
                }
                guard kept else {
                    await c.close()
                    break
                }
                let channel = try await c.openChannel()
                while !isStopped, c.isOpen {
                    if c.blockedReason == nil {
                        do {
                            try await channel.publish(
                                exchange: "", routingKey: Self.routingKey, body: Data(), properties: AMQPProperties(deliveryMode: 1))
                        } catch let error as AMQPError where error.code == .connectionBlocked {
                            // Blocked between the look and the publish: the reason is on the connection now.
                        }
                    }
                    await pause(Self.interval)
                    if c.isOpen, c.blockedReason == nil {
                        // Published, and an interval on not blocked: whatever an earlier connection carried is over.
                        if published { state.withLock { $0.carried = nil } }
                        published = true
                        failures = 0
                    }
                }
            } catch {}
            state.withLock { s in
                s.connection = nil
                if let reason = connection?.blockedReason { s.carried = reason }
            }
            if let connection { await connection.close() }
            if isStopped { break }
            next += 1
            if !published { failures += 1 }
            await pause(min(Self.maxBackoff, Self.interval * (1 << min(failures, 5))))
        }
    }

    public func shutdown() async {
        state.withLock { s in
            s.stopped = true
            s.pause?.cancel()
        }
    }

    private var isStopped: Bool { state.withLock { $0.stopped } }

    /// Waits `duration`, or until `shutdown()`: one timer for the whole
    /// wait (steps of 250 ms woke the idle service four times a second,
    /// about 25 context switches).
    private func pause(_ duration: Duration) async {
        let pause = Task<Void, Never> { try? await Task.sleep(for: duration) }
        let stopped = state.withLock { s -> Bool in
            s.pause = pause
            return s.stopped
        }
        if stopped { pause.cancel() }
        await pause.value
        state.withLock { s in
            if s.pause == pause { s.pause = nil }
        }
    }
}
