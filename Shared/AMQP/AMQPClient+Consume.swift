import Foundation
import Synchronization

/// What a consumer of an `AMQPClient` asks for; replayed on every connection.
public struct ConsumerSpecification: Sendable {
    public var queue: String
    public var prefetchCount: UInt16
    public var exclusive: Bool
    /// e.g. `x-stream-offset` for a stream, `x-priority`.
    public var arguments: FieldTable?

    public init(queue: String, prefetchCount: UInt16 = 50, exclusive: Bool = false, arguments: FieldTable? = nil) {
        self.queue = queue
        self.prefetchCount = prefetchCount
        self.exclusive = exclusive
        self.arguments = arguments
    }
}

/// One consumer of the client, alive across reconnects.
final class ConsumerRegistration: Sendable {
    let specification: ConsumerSpecification
    let continuation: AsyncStream<AMQPDelivery>.Continuation
    /// The channel and tag it consumes with on the current connection.
    private let active = Mutex<(channel: AMQPChannel, tag: String)?>(nil)

    init(specification: ConsumerSpecification, continuation: AsyncStream<AMQPDelivery>.Continuation) {
        self.specification = specification
        self.continuation = continuation
    }

    func start(on connection: AMQPConnection, onBrokerCancel: @escaping @Sendable (AMQPError) -> Void) async throws {
        let channel = try await connection.openChannel()
        do {
            try await channel.qos(prefetchCount: specification.prefetchCount)
            let continuation = continuation
            let sink = ConsumerSink(
                deliver: { continuation.yield($0) },
                finish: { error in
                    if let error, error.code == .consumerCancelled { onBrokerCancel(error) }
                })
            let tag = try await channel.consume(
                queue: specification.queue, consumerTag: "", noAck: false, exclusive: specification.exclusive,
                arguments: specification.arguments, sink: sink)
            active.withLock { $0 = (channel, tag) }
        } catch {
            await channel.close()
            throw error
        }
    }

    /// basic.cancel, then the sequence ends after what it already holds.
    func stop() async {
        if let a = active.withLock({ $0 }) {
            try? await a.channel.cancel(consumerTag: a.tag)
        }
        continuation.finish()
    }

    func finish() { continuation.finish() }
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
        let registration = ConsumerRegistration(specification: specification, continuation: continuation)
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
        return ClientConsumer(stream: stream) { [weak self] in
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
