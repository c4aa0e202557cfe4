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
    /// Declares its queue again before a restart on the same connection
    /// (one that goes with its consumer: exclusive, auto-delete). Without
    /// it, a restart waits until a passive declare finds the queue.
    public var redeclare: (@Sendable (AMQPChannel) async throws -> Void)?

    public init(
        queue: String, prefetchCount: UInt16 = 50, exclusive: Bool = false, arguments: FieldTable? = nil,
        argumentsOnStart: (@Sendable () -> FieldTable?)? = nil, redeclare: (@Sendable (AMQPChannel) async throws -> Void)? = nil
    ) {
        self.queue = queue
        self.prefetchCount = prefetchCount
        self.exclusive = exclusive
        self.arguments = arguments
        self.argumentsOnStart = argumentsOnStart
        self.redeclare = redeclare
    }
}

/// One consumer of the client, alive across reconnects.
final class ConsumerRegistration: Sendable {
    let specification: ConsumerSpecification
    /// Runs on the connection thread for every delivery.
    let deliver: @Sendable (AMQPDelivery) -> Void
    /// Runs once the consumer is stopped or the client shut down.
    private let ended: @Sendable () -> Void
    /// The connection, channel and tag it consumes with now, and whether a
    /// stop cancelled it (then it ends after what it holds: never closed).
    private let active = Mutex<(connection: AMQPConnection, channel: AMQPChannel, tag: String, cancelled: Bool)?>(nil)
    /// Set once `ended` ran: a delivery after it (to a start that raced the
    /// stop, whose channel is then closed) is not handed over, and goes back.
    private let hasEnded = Atomic<Bool>(false)
    /// Restarts in a row (each within a minute of the last): a consumer the
    /// broker ends again right after each start is tried less and less often.
    private let restarts = Mutex<(count: Int, last: ContinuousClock.Instant?)>((0, nil))

    /// The back-off attempt a new restart begins at.
    func nextRestartAttempt(now: ContinuousClock.Instant = .now) -> Int {
        restarts.withLock { r in
            r.count = r.last.map { now - $0 < .seconds(60) } == true ? r.count + 1 : 1
            r.last = now
            return r.count
        }
    }

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
                deliver: { [self] delivery in
                    if !hasEnded.load(ordering: .acquiring) { deliver(delivery) }
                },
                finish: { error in
                    // The broker cancelled it (its queue deleted, a leader moved) or closed its channel
                    // (a delivery held past the broker's `consumer_timeout`, an ack it did not know):
                    // started again. Our own closes carry no reply code; a connection's end is the
                    // reconnect's to mend.
                    guard let error else { return }
                    if error.code == .consumerCancelled || (error.code == .channelClosed && error.replyCode != nil) {
                        onBrokerCancel(error)
                    }
                })
            let tag = try await channel.consume(
                queue: specification.queue, consumerTag: "", noAck: false, exclusive: specification.exclusive,
                arguments: specification.argumentsOnStart?() ?? specification.arguments, sink: sink)
            // Its connection ended meanwhile (another may have started it
            // anew already): this start counts for nothing.
            guard connection.isOpen else {
                await channel.close()
                throw AMQPError(.connectionClosed, "the connection ended while consuming from '\(specification.queue)' started")
            }
            let replaced = active.withLock { a -> AMQPChannel? in
                defer { a = (connection, channel, tag, false) }
                return a.flatMap { $0.connection === connection ? $0.channel : nil }
            }
            // After a broker cancel, the old channel consumes nothing: closed
            // once what it delivered has had time to be acked (a later ack
            // fails, and the message comes again). Left open, each restart
            // kept one more channel. (One of an ended connection is closed already.)
            if let replaced {
                Task {
                    try? await Task.sleep(for: Self.replacedChannelGrace)
                    await replaced.close()
                }
            }
        } catch {
            await channel.close()
            throw error
        }
    }

    /// How long the channel of a consumer the broker cancelled stays open after its restart.
    static let replacedChannelGrace = Duration.seconds(5)

    /// basic.cancel, then the consumer ends after what it already holds.
    func stop() async {
        await cancelActive()
        end()
    }

    /// `ended` runs once, however many ways the consumer is stopped.
    private func end() {
        guard !hasEnded.exchange(true, ordering: .acquiringAndReleasing) else { return }
        ended()
    }

    /// basic.cancel of the current consumer, if any.
    func cancelActive() async {
        let a = active.withLock { a in
            a?.cancelled = true
            return a
        }
        if let a { try? await a.channel.cancel(consumerTag: a.tag) }
    }

    /// Closes the channel of a consumer that started after its stop: what
    /// it was sent goes back to the queue (its deliveries went to an end).
    /// Not one the stop found and cancelled: that one ends after what it
    /// already handed over, which is acked as usual.
    func closeActive(on connection: AMQPConnection) async {
        if let a = active.withLock({ $0 }), a.connection === connection, !a.cancelled {
            await a.channel.close()
        }
    }

    func finish() { end() }
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
        let (accepted, connection) = state.withLock { s -> (Bool, AMQPConnection?) in
            // After a shutdown nothing would ever start or end it: it ends now.
            guard !s.shuttingDown else { return (false, nil) }
            s.consumers[key] = registration
            return (true, s.live?.connection)
        }
        guard accepted else {
            registration.finish()
            return {}
        }
        if let connection {
            do {
                try await start(registration, on: connection)
            } catch {
                // The connection is failing; the next connection starts it.
                onEvent(.consumerRestartFailed(queue: specification.queue, AMQPError.from(error)))
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

    private func isConsuming(_ registration: ConsumerRegistration) -> Bool {
        state.withLock { s in s.consumers.values.contains { $0 === registration } }
    }

    private func start(_ registration: ConsumerRegistration, on connection: AMQPConnection) async throws {
        // Stopped since it was listed (or since its restart's queue check): not
        // started at all, so it asks for no arguments and takes no messages.
        guard isConsuming(registration) else { return }
        try await registration.start(on: connection) { [weak self] error in
            // The broker ended it (see the sink's `finish`): started again on the same connection.
            guard let self else { return }
            self.onEvent(.consumerRestartFailed(queue: registration.specification.queue, error))
            Task { await self.restart(registration, on: connection) }
        }
        // Stopped while it started (on a new connection, or after a broker's
        // cancel): its stop found nothing to cancel, so its channel is closed
        // and what it was sent goes back to the queue.
        if !isConsuming(registration) { await registration.closeActive(on: connection) }
    }

    /// How a consumer the broker cancelled is tried again: after about a
    /// second, then less often, up to every 15 s (each failed try is logged).
    static let consumerRestartBackoff = Backoff(baseMs: 1000, maxMs: 15_000)

    /// Starts a consumer the broker cancelled again, for as long as it
    /// takes (its queue deleted and declared again later, say), while the
    /// connection and the consumer last. One try that failed used to be the
    /// last: the consumer stayed silent until the next connection.
    private func restart(_ registration: ConsumerRegistration, on connection: AMQPConnection) async {
        func isCurrent() -> Bool {
            state.withLock { $0.live?.connection === connection } && isConsuming(registration)
        }
        var attempt = registration.nextRestartAttempt() - 1
        while true {
            attempt += 1
            try? await Task.sleep(for: .milliseconds(Self.consumerRestartBackoff.delayMs(afterAttempt: attempt)))
            guard isCurrent(), connection.isOpen else { return }
            do {
                // Only once its queue is there: a start asks the consumer for
                // its arguments, and that may begin work of its own (the
                // gateway holds its live events until its log catches up).
                // One that went with its consumer is declared again.
                let specification = registration.specification
                if let redeclare = specification.redeclare {
                    try await connection.withChannel { try await redeclare($0) }
                } else {
                    _ = try await connection.withChannel { try await $0.queueDeclare(specification.queue, passive: true) }
                }
                try await start(registration, on: connection)
                // Its connection was replaced while it started: the new one starts it.
                if !isCurrent() { await registration.closeActive(on: connection) }
                return
            } catch {
                onEvent(.consumerRestartFailed(queue: registration.specification.queue, AMQPError.from(error)))
            }
        }
    }
}
