import Foundation
import Synchronization

/// What a consumer of an `AMQPClient` asks for; replayed on every connection.
public struct ConsumerSpecification: Sendable {
    public var queue: String
    public var prefetchCount: UInt16
    public var exclusive: Bool
    /// e.g. `x-stream-offset` for a stream, `x-priority`.
    public var arguments: FieldTable?
    /// When set, the arguments are asked for at each start (every
    /// connection, every restart after the broker cancelled it) instead:
    /// a stream consumer resumes where it left off, not where it began.
    public var argumentsOnStart: (@Sendable () -> FieldTable?)?

    public init(
        queue: String, prefetchCount: UInt16 = 50, exclusive: Bool = false, arguments: FieldTable? = nil,
        argumentsOnStart: (@Sendable () -> FieldTable?)? = nil
    ) {
        self.queue = queue
        self.prefetchCount = prefetchCount
        self.exclusive = exclusive
        self.arguments = arguments
        self.argumentsOnStart = argumentsOnStart
    }
}

/// One consumer of the client, alive across reconnects.
final class ConsumerRegistration: Sendable {
    let specification: ConsumerSpecification
    /// Runs on the connection thread for every delivery.
    let deliver: @Sendable (AMQPDelivery) -> Void
    /// Runs once the consumer is stopped or the client shut down.
    private let ended: @Sendable () -> Void
    /// The channel and tag it consumes with on the current connection.
    private let active = Mutex<(channel: AMQPChannel, tag: String)?>(nil)

    init(specification: ConsumerSpecification, deliver: @escaping @Sendable (AMQPDelivery) -> Void, ended: @escaping @Sendable () -> Void) {
        self.specification = specification
        self.deliver = deliver
        self.ended = ended
    }

    func start(on connection: AMQPConnection, onBrokerCancel: @escaping @Sendable (AMQPError) -> Void) async throws {
        let channel = try await connection.openChannel()
        do {
            try await channel.qos(prefetchCount: specification.prefetchCount)
            let sink = ConsumerSink(
                deliver: deliver,
                finish: { error in
                    if let error, error.code == .consumerCancelled { onBrokerCancel(error) }
                })
            let tag = try await channel.consume(
                queue: specification.queue, consumerTag: "", noAck: false, exclusive: specification.exclusive,
                arguments: specification.argumentsOnStart?() ?? specification.arguments, sink: sink)
            active.withLock { $0 = (channel, tag) }
        } catch {
            await channel.close()
            throw error
        }
    }

    /// basic.cancel, then the consumer ends after what it already holds.
    func stop() async {
        if let a = active.withLock({ $0 }) {
            try? await a.channel.cancel(consumerTag: a.tag)
        }
        ended()
    }

    func finish() { ended() }
}

/// The deliveries of one `AMQPClient` consumer, across reconnects.
public struct ClientConsumer: AsyncSequence, Sendable {
    public typealias Element = AMQPDelivery
    let stream: AsyncStream<AMQPDelivery>
    let stopAction: @Sendable () async -> Void

    public func makeAsyncIterator() -> AsyncStream<AMQPDelivery>.AsyncIterator { stream.makeAsyncIterator() }

    /// Stops this consumer alone (basic.cancel); the sequence yields what it
    /// already received, then ends.
    public func stop() async { await stopAction() }
}

extension AMQPClient {
    /// Consumes `queue` now and on every later connection. The sequence ends
    /// after `stop()`, `stopConsuming()` or `shutdown()`.
    public func consume(_ specification: ConsumerSpecification) async -> ClientConsumer {
        let (stream, continuation) = AsyncStream<AMQPDelivery>.makeStream()
        let stop = await consume(specification, deliver: { continuation.yield($0) }, ended: { continuation.finish() })
        return ClientConsumer(stream: stream, stopAction: stop)
    }

    /// Consumes `queue` now and on every later connection, handing each
    /// delivery to `deliver` on the connection's own thread (for callers
    /// that only queue them: no task in between). `ended` runs once after
    /// the returned stop action, `stopConsuming()` or `shutdown()`.
    public func consume(
        _ specification: ConsumerSpecification, deliver: @escaping @Sendable (AMQPDelivery) -> Void,
        ended: @escaping @Sendable () -> Void
    ) async -> @Sendable () async -> Void {
        let registration = ConsumerRegistration(specification: specification, deliver: deliver, ended: ended)
        let key = UUID()
        let connection = state.withLock { s -> AMQPConnection? in
            s.consumers[key] = registration
            return s.live?.connection
        }
        if let connection {
            do {
                try await start(registration, on: connection)
            } catch {
                // The connection is failing; the next connection starts it.
                onEvent(.consumerRestartFailed(queue: specification.queue, error as? AMQPError ?? AMQPError(.library, "\(error)")))
            }
        }
        return { [weak self] in
            _ = self?.state.withLock { $0.consumers.removeValue(forKey: key) }
            await registration.stop()
        }
    }

    func startAllConsumers(on connection: AMQPConnection) async throws {
        let registrations = state.withLock { Array($0.consumers.values) }
        for r in registrations { try await start(r, on: connection) }
    }

    private func start(_ registration: ConsumerRegistration, on connection: AMQPConnection) async throws {
        try await registration.start(on: connection) { [weak self] error in
            // The broker cancelled it (queue deleted, leader moved): try again shortly on the same connection.
            guard let self else { return }
            self.onEvent(.consumerRestartFailed(queue: registration.specification.queue, error))
            Task {
                try? await Task.sleep(for: .seconds(1))
                let stillCurrent = self.state.withLock { s in
                    s.live?.connection === connection && s.consumers.values.contains { $0 === registration }
                }
                if stillCurrent { try? await self.start(registration, on: connection) }
            }
        }
    }
}
