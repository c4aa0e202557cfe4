import Foundation

/// What queue.declare answered.
public struct QueueDeclareResult: Sendable, Equatable {
    public var name: String
    public var messageCount: UInt32
    public var consumerCount: UInt32
}

/// An AMQP channel. A channel that the broker closes (404, 406 ...) stays
/// closed: every later call throws that error; open a new one.
public struct AMQPChannel: Sendable {
    let core: ConnectionCore
    public let id: UInt16
    let epoch: UInt64

    private func run<T: Sendable>(_ body: @escaping @Sendable (ConnectionLoop, ChannelState) throws -> T) async throws -> T {
        let id = id, epoch = epoch
        return try await core.perform { loop in try body(loop, try loop.channel(id, epoch: epoch)) }
    }

    /// A new channel on the same connection: for going on after the broker
    /// closed this one (a 404 or 406 of a declare).
    public func reopened() async throws -> AMQPChannel {
        try await core.openChannel()
    }

    // MARK: Exchanges

    public func exchangeDeclare(
        _ name: String, type: String, durable: Bool = true, autoDelete: Bool = false,
        isInternal: Bool = false, passive: Bool = false, arguments: FieldTable? = nil
    ) async throws {
        try await run {
            try $0.exchangeDeclare(
                $1, name: name, type: type, passive: passive, durable: durable, autoDelete: autoDelete,
                internal: isInternal, arguments: arguments)
        }
    }

    public func exchangeDelete(_ name: String, ifUnused: Bool = false) async throws {
        try await run { try $0.exchangeDelete($1, name: name, ifUnused: ifUnused) }
    }

    public func exchangeBind(destination: String, source: String, routingKey: String, arguments: FieldTable? = nil) async throws {
        try await run { try $0.exchangeBind($1, destination: destination, source: source, routingKey: routingKey, arguments: arguments) }
    }

    // MARK: Queues

    /// Declares a queue; with `passive` only checks it exists and reads its
    /// message and consumer counts.
    @discardableResult
    public func queueDeclare(
        _ name: String, durable: Bool = true, exclusive: Bool = false, autoDelete: Bool = false,
        passive: Bool = false, arguments: FieldTable? = nil
    ) async throws -> QueueDeclareResult {
        try await run {
            try $0.queueDeclare(
                $1, name: name, passive: passive, durable: durable, exclusive: exclusive,
                autoDelete: autoDelete, arguments: arguments)
        }
    }

    public func queueBind(_ queue: String, exchange: String, routingKey: String, arguments: FieldTable? = nil) async throws {
        try await run { try $0.queueBind($1, queue: queue, exchange: exchange, routingKey: routingKey, arguments: arguments, bind: true) }
    }

    public func queueUnbind(_ queue: String, exchange: String, routingKey: String, arguments: FieldTable? = nil) async throws {
        try await run { try $0.queueBind($1, queue: queue, exchange: exchange, routingKey: routingKey, arguments: arguments, bind: false) }
    }

    /// Deletes a queue and returns how many messages it held.
    @discardableResult
    public func queueDelete(_ name: String, ifUnused: Bool = false, ifEmpty: Bool = false) async throws -> UInt32 {
        try await run { try $0.queueDelete($1, name: name, ifUnused: ifUnused, ifEmpty: ifEmpty) }
    }

    @discardableResult
    public func queuePurge(_ name: String) async throws -> UInt32 {
        try await run { try $0.queuePurge($1, name: name) }
    }

    // MARK: Publishing

    /// Turns on publisher confirms: from now on `publish` returns when the broker has the message.
    public func confirmSelect() async throws {
        try await run { try $0.confirmSelect($1) }
    }

    /// Publishes one message. In confirm mode, returns once the broker acked
    /// it; throws `.returned` for an unroutable mandatory message and `.nacked` for a nack.
    public func publish(_ message: OutboundMessage) async throws {
        try await publish([message])[0].get()
    }

    public func publish(
        exchange: String, routingKey: String, body: Data, properties: AMQPProperties = AMQPProperties(),
        mandatory: Bool = false
    ) async throws {
        try await publish(OutboundMessage(
            exchange: exchange, routingKey: routingKey, body: body, properties: properties, mandatory: mandatory))
    }

    /// Publishes a window of messages in one hop and waits for all their
    /// confirms; the result of each, in order.
    public func publish(_ messages: [OutboundMessage]) async throws -> [Result<Void, AMQPError>] {
        guard !messages.isEmpty else { return [] }
        let id = id, epoch = epoch
        return try await core.performDeferred { loop, continuation in
            let batch = PublishBatch(count: messages.count) { continuation.resume(with: $0) }
            do {
                let ch = try loop.channel(id, epoch: epoch)
                loop.publish(ch, messages, batch: batch)
            } catch {
                continuation.resume(throwing: error)
            }
        }
    }

    /// Hands a window of messages to the connection now, in call order, and
    /// returns at once: `PublishConfirms.results()` waits for the confirms.
    /// Lets a caller publish its next window before the last one is
    /// confirmed (confirms on a channel arrive in publish order).
    public func publishWithoutWaiting(_ messages: [OutboundMessage]) -> PublishConfirms {
        publishWithoutWaiting(messages, then: nil)
    }

    /// As above; `then` runs once on the connection thread when the window is
    /// confirmed or has failed: for callers that only need to note the outcome.
    @discardableResult
    public func publishWithoutWaiting(
        _ messages: [OutboundMessage], then: (@Sendable (Result<PublishConfirms.Results, Error>) -> Void)?
    ) -> PublishConfirms {
        let confirms = PublishConfirms(then: then)
        guard !messages.isEmpty else {
            confirms.complete(.success([]))
            return confirms
        }
        let id = id, epoch = epoch
        let accepted = core.submit { loop in
            let batch = PublishBatch(count: messages.count) { confirms.complete($0) }
            do {
                let ch = try loop.channel(id, epoch: epoch)
                loop.publish(ch, messages, batch: batch)
            } catch {
                confirms.complete(.failure(error))
            }
        }
        if !accepted { confirms.complete(.failure(core.closedError)) }
        return confirms
    }

    // MARK: Consuming

    /// Limits unacknowledged deliveries on this channel (basic.qos).
    public func qos(prefetchCount: UInt16, global: Bool = false) async throws {
        try await run { try $0.qos($1, prefetchCount: prefetchCount, global: global) }
    }

    /// Starts a consumer; its deliveries arrive as an async sequence.
    public func consume(
        queue: String, consumerTag: String = "", noAck: Bool = false, exclusive: Bool = false,
        arguments: FieldTable? = nil
    ) async throws -> AMQPConsumer {
        let (stream, continuation) = AsyncThrowingStream<AMQPDelivery, Error>.makeStream()
        let sink = ConsumerSink(
            deliver: { continuation.yield($0) },
            finish: { error in
                if let error { continuation.finish(throwing: error) } else { continuation.finish() }
            })
        let tag = try await consume(
            queue: queue, consumerTag: consumerTag, noAck: noAck, exclusive: exclusive, arguments: arguments, sink: sink)
        let channel = self
        continuation.onTermination = { reason in
            // The reader stopped iterating: stop the broker sending more.
            if case .cancelled = reason { Task { try? await channel.cancel(consumerTag: tag) } }
        }
        return AMQPConsumer(stream: stream, consumerTag: tag, channel: self)
    }

    /// Starts a consumer whose deliveries are handed to `deliver` on the
    /// connection's own thread, with no task in between: for a caller that
    /// only queues them (it must not block or wait). `finished` runs once
    /// when the consumer ends: nil when cancelled by us, else the error.
    /// Returns the consumer tag.
    public func consume(
        queue: String, consumerTag: String = "", noAck: Bool = false, exclusive: Bool = false,
        arguments: FieldTable? = nil, deliver: @escaping @Sendable (AMQPDelivery) -> Void,
        finished: @escaping @Sendable (AMQPError?) -> Void
    ) async throws -> String {
        try await consume(
            queue: queue, consumerTag: consumerTag, noAck: noAck, exclusive: exclusive, arguments: arguments,
            sink: ConsumerSink(deliver: deliver, finish: finished))
    }

    func consume(
        queue: String, consumerTag: String, noAck: Bool, exclusive: Bool, arguments: FieldTable?, sink: ConsumerSink
    ) async throws -> String {
        try await run {
            try $0.consume(
                $1, queue: queue, consumerTag: consumerTag, noAck: noAck, exclusive: exclusive,
                arguments: arguments, sink: sink)
        }
    }

    /// Stops a consumer (basic.cancel); its sequence ends.
    public func cancel(consumerTag: String) async throws {
        try await run { try $0.cancel($1, consumerTag: consumerTag) }
    }

    /// Whether a nack on this channel was answered by publishing to the
    /// message's `ifNacked` way (the channel last to do so on its
    /// connection). Its caller saw no nack, but should publish on a new
    /// channel: on RabbitMQ 3.10 the refusing queue may be one this channel
    /// can no longer reach (see `AMQPClient.retireIfNacked`).
    public var hadRedirectedNack: Bool { core.lastRedirectedEpoch == epoch }

    /// The same channel of the same connection.
    func isSame(as other: AMQPChannel) -> Bool { core === other.core && id == other.id && epoch == other.epoch }

    /// Closes the channel once every publish on it has been confirmed or has
    /// failed (within the confirm timeout), without failing what waits: the
    /// connection's sweep closes it, no sooner than its next round (a
    /// publish handed over just before this call still gets out).
    public func closeWhenSettled() {
        let id = id, epoch = epoch
        _ = core.submit { loop in
            guard let ch = try? loop.channel(id, epoch: epoch), ch.closeWhenSettled == nil else { return }
            ch.closeWhenSettled = .now
        }
    }

    /// Closes the channel; unacknowledged deliveries go back to their queues.
    public func close() async {
        let id = id, epoch = epoch
        _ = try? await core.perform { loop in
            if let ch = try? loop.channel(id, epoch: epoch) { loop.closeChannel(ch) }
        }
    }
}

extension ConnectionCore {
    /// A new channel on this connection (`AMQPConnection.openChannel`, `AMQPChannel.reopened`).
    func openChannel() async throws -> AMQPChannel {
        let (id, epoch) = try await perform { loop in
            let ch = try loop.openChannel()
            return (ch.id, ch.epoch)
        }
        return AMQPChannel(core: self, id: id, epoch: epoch)
    }
}
