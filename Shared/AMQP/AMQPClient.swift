import Foundation
import Synchronization

/// A connection that recovers: when it drops (a broker restart, the network),
/// `run()` reconnects with capped exponential backoff and jitter, declares
/// the topology again and resumes every consumer. Consumers are async
/// sequences that outlive the connections under them.
///
/// Deliveries from a connection that has since dropped cannot be acked (the
/// broker has requeued them already); their `ack` throws and changes nothing.
public final class AMQPClient: Sendable {
    public struct Configuration: Sendable {
        public var connection: AMQPConnectionConfiguration
        /// Delay before reconnect attempt n+1.
        public var reconnectBackoff = Backoff.reconnect
        /// A connection lost sooner than this after it was up counts as a
        /// failed attempt: the next waits `reconnectBackoff`, longer each time
        /// in a row. Something that ends every connection at once (a delivery
        /// that fails it, a broker that drops it) is not met with a reconnect
        /// storm. One that lived longer is followed at once.
        public var briefConnection = Duration.seconds(5)

        public init(connection: AMQPConnectionConfiguration) {
            self.connection = connection
        }
    }

    /// Declares what the client's users need; runs on every (re)connect.
    public typealias Topology = @Sendable (AMQPChannel) async throws -> Void
    /// Told of every connection failure, for logs.
    public typealias EventHandler = @Sendable (ClientEvent) -> Void

    public enum ClientEvent: Sendable {
        case connected(attempt: Int)
        case connectFailed(AMQPError, retryInMs: Int)
        case connectionLost(AMQPError?)
        case consumerRestartFailed(queue: String, AMQPError)
    }

    struct Live {
        let connection: AMQPConnection
        var publishChannel: AMQPChannel?
        /// When a nack last retired the publish channel (see `retireIfNacked`).
        var retiredAt: ContinuousClock.Instant?
    }

    struct State {
        var live: Live?
        var connectionState: ConnectionState = .connecting
        var stateSubscribers: [UUID: AsyncStream<ConnectionState>.Continuation] = [:]
        var consumers: [UUID: ConsumerRegistration] = [:]
        var shuttingDown = false
        /// `abandonBlockedConnections()` was called: every connection is told so.
        var abandonsBlocked = false
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
        var lostHandlers: [@Sendable () -> Void] = []
    }

    public let configuration: Configuration
    let topology: Topology
    let onEvent: EventHandler
    let state = Mutex(State())

    public init(
        configuration: Configuration, topology: @escaping Topology = { _ in },
        onEvent: @escaping EventHandler = { _ in }
    ) {
        self.configuration = configuration
        self.topology = topology
        self.onEvent = onEvent
    }

    /// Runs tasks on the current connection's thread (see `ConnectionTaskExecutor`).
    public var executor: ConnectionTaskExecutor {
        ConnectionTaskExecutor { [weak self] in self?.state.withLock { $0.live?.connection.core } }
    }

    /// Pauses for `duration`, timed by the current connection's thread (see
    /// `AMQPConnection.sleep`); with no connection, by the global pool's
    /// timer. Ends early when the connection ends (with none, when the
    /// task is cancelled): for short pauses that may be cut short.
    public func sleep(for duration: Duration) async {
        if let core = state.withLock({ $0.live?.connection.core }) {
            await core.sleep(for: duration)
        } else {
            try? await Task.sleep(for: duration)
        }
    }

    // MARK: State

    public var connectionState: ConnectionState { state.withLock { $0.connectionState } }

    /// Why the broker blocks the current connection's publishes (a resource
    /// alarm), or nil.
    public var blockedReason: String? { state.withLock { $0.live?.connection.blockedReason } }

    /// Connected, and the broker takes its publishes: what `/readyz` reports.
    public var isReady: Bool { connectionState.isReady && blockedReason == nil }

    /// Calls `handler` each time a connection this client had ends (lost,
    /// or closed while starting), on the client's own task before it
    /// connects again: no delivery of the next connection has come yet, so
    /// what a consumer still holds from the last one (the broker requeued
    /// it) can be dropped without dropping anything new. A task following
    /// `stateUpdates()` may run only after the next connection's first
    /// deliveries.
    public func onConnectionLost(_ handler: @escaping @Sendable () -> Void) {
        state.withLock { $0.lostHandlers.append(handler) }
    }

    private func tellConnectionLost() {
        for handler in state.withLock({ $0.lostHandlers }) { handler() }
    }

    /// The current state, then every change, until the client closes.
    public func stateUpdates() -> AsyncStream<ConnectionState> {
        let (stream, continuation) = AsyncStream<ConnectionState>.makeStream(bufferingPolicy: .bufferingNewest(16))
        let id = UUID()
        let current: ConnectionState = state.withLock { s in
            s.stateSubscribers[id] = continuation
            return s.connectionState
        }
        continuation.yield(current)
        if current == .closed { continuation.finish() }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.stateSubscribers.removeValue(forKey: id) }
        }
        return stream
    }

    func setState(_ new: ConnectionState) {
        let subscribers = state.withLock { s -> [AsyncStream<ConnectionState>.Continuation] in
            guard s.connectionState != new else { return [] }
            s.connectionState = new
            return Array(s.stateSubscribers.values)
        }
        for c in subscribers {
            c.yield(new)
            if new == .closed { c.finish() }
        }
    }

    /// Waits until connected; throws after `timeout` or once the client closed.
    public func waitUntilConnected(timeout: Duration = .seconds(30)) async throws {
        let deadline = ContinuousClock.now + timeout
        for await s in stateUpdates() {
            if s == .connected { return }
            if s == .closed || ContinuousClock.now >= deadline { break }
        }
        throw AMQPError(.timeout, "not connected to \(configuration.connection.url) within \(timeout)")
    }

    // MARK: Running

    /// Connects and keeps connecting until `shutdown()` or cancellation.
    public func run() async {
        var attempt = 0
        var briefInARow = 0
        // Several nodes: tried in a shuffled order, one after another; a back-off
        // only once every node has failed in a row; after losing a node, the next.
        let nodes = configuration.connection.nodes.shuffled()
        var next = 0
        // Cancelled (a grace period over), it stops too: its back-off would
        // not wait, and each attempt would be logged with none between.
        while !isShuttingDown, !Task.isCancelled {
            attempt += 1
            let node = nodes[next % nodes.count]
            do {
                let connection = try await AMQPConnection.connect(configuration.connection.to(node))
                do {
                    try await connection.withChannel { try await self.topology($0) }
                    let publishChannel = try await connection.openChannel()
                    try await publishChannel.confirmSelect()
                    let accepted = state.withLock { s -> Bool in
                        guard !s.shuttingDown else { return false }
                        s.live = Live(connection: connection, publishChannel: publishChannel)
                        if s.abandonsBlocked { connection.abandonWhenBlocked() }
                        return true
                    }
                    guard accepted else {
                        await connection.close()
                        break
                    }
                    try await startAllConsumers(on: connection)
                } catch {
                    await connection.close()
                    tellConnectionLost()  // its consumers may have delivered already
                    throw error
                }
                setState(.connected)
                onEvent(.connected(attempt: attempt))
                attempt = 0
                let upSince = ContinuousClock.now
                let lost = await connection.waitForEnd()
                if endLive() { break }
                onEvent(.connectionLost(lost))
                tellConnectionLost()
                setState(.reconnecting(reason: lost?.description ?? "closed"))
                if nodes.count > 1 { next += 1 }  // that node may be gone: another first
                // As for failed attempts: with several nodes, a wait only once each was lost so in a row.
                briefInARow = ContinuousClock.now - upSince < configuration.briefConnection ? briefInARow + 1 : 0
                if briefInARow > 0, briefInARow % nodes.count == 0 {
                    await sleepUnlessShuttingDown(milliseconds: configuration.reconnectBackoff.delayMs(afterAttempt: briefInARow / nodes.count))
                }
            } catch {
                if endLive() { break }
                let error = AMQPError.from(error)
                next += 1
                let roundEnded = attempt % nodes.count == 0
                let delay = roundEnded ? configuration.reconnectBackoff.delayMs(afterAttempt: attempt / nodes.count) : 0
                onEvent(.connectFailed(error, retryInMs: delay))
                setState(attempt == 1 && connectionState == .connecting ? .connecting : .reconnecting(reason: error.description))
                if delay > 0 { await sleepUnlessShuttingDown(milliseconds: delay) }
            }
        }
        finishAll()
    }

    private var isShuttingDown: Bool { state.withLock { $0.shuttingDown } }

    /// Forgets the live connection, which ended (or failed while starting);
    /// true if the client stops instead of connecting again: it is shutting
    /// down, or a stop dropped a connection the broker blocks (a new one
    /// would be blocked too, and hold the stop up).
    private func endLive() -> Bool {
        state.withLock { s in
            let dropped = s.live?.connection.wasAbandoned ?? false
            s.live = nil
            return s.shuttingDown || dropped
        }
    }

    private func sleepUnlessShuttingDown(milliseconds: Int) async {
        let deadline = ContinuousClock.now + .milliseconds(milliseconds)
        while ContinuousClock.now < deadline, !isShuttingDown, !Task.isCancelled {
            try? await Task.sleep(for: min(.milliseconds(50), deadline - ContinuousClock.now))
        }
    }

    /// Stops every consumer (basic.cancel): each consumer's sequence yields
    /// what it already received, then ends. Publishing still works.
    public func stopConsuming() async {
        let registrations = state.withLock { s -> [ConsumerRegistration] in
            let r = Array(s.consumers.values)
            s.consumers.removeAll()
            return r
        }
        for r in registrations { await r.stop() }
    }

    /// Closes the current connection and connects again (to the next node,
    /// with several): the topology is declared again and every consumer
    /// starts again. For a connection that still works but serves no more
    /// (a stream consumer that hangs, `ReadBackWatch`). Nothing without one.
    public func reconnect() async {
        let live = state.withLock { s -> Live? in s.shuttingDown ? nil : s.live }
        await live?.connection.close()
    }

    /// For a stop, before its consumers are stopped: a connection the broker
    /// blocks is dropped rather than waited on (`AMQPConnection.abandonWhenBlocked`),
    /// and then the client stops as after `shutdown()` (its consumers end)
    /// instead of connecting again. `shutdown()` calls it.
    public func abandonBlockedConnections() {
        let live = state.withLock { s -> Live? in
            s.abandonsBlocked = true
            return s.live
        }
        live?.connection.abandonWhenBlocked()
    }

    /// Stops consuming, closes the connection cleanly and makes `run()` return.
    public func shutdown() async {
        abandonBlockedConnections()
        await stopConsuming()
        let live = state.withLock { s -> Live? in
            s.shuttingDown = true
            return s.live
        }
        await live?.connection.close()
    }

    private func finishAll() {
        let registrations = state.withLock { s -> [ConsumerRegistration] in
            s.shuttingDown = true
            let r = Array(s.consumers.values)
            s.consumers.removeAll()
            s.live = nil
            return r
        }
        for r in registrations { r.finish() }
        setState(.closed)
    }

    // MARK: Channels

    /// Runs `body` on a fresh channel of the current connection.
    @discardableResult
    public func withChannel<T: Sendable>(_ body: (AMQPChannel) async throws -> T) async throws -> T {
        guard let connection = state.withLock({ $0.live?.connection }) else {
            throw AMQPError(.connectionClosed, "not connected to \(configuration.connection.url)")
        }
        return try await connection.withChannel(body)
    }
}
