/// The deliveries of one consumer, as an async sequence. It ends when the
/// consumer is cancelled, and throws when the broker cancels it or the
/// channel or connection goes away.
public struct AMQPConsumer: AsyncSequence, Sendable {
    public typealias Element = AMQPDelivery
    let stream: AsyncThrowingStream<AMQPDelivery, Error>
    public let consumerTag: String
    public let channel: AMQPChannel

    public func makeAsyncIterator() -> AsyncThrowingStream<AMQPDelivery, Error>.AsyncIterator {
        stream.makeAsyncIterator()
    }

    /// Stops the broker sending more; the sequence then ends.
    public func cancel() async throws {
        try await channel.cancel(consumerTag: consumerTag)
    }
}

/// RabbitMQ streams, as AMQP 0-9-1 sees them.
public enum AMQPStream {
    /// The consume argument that says where in a stream a consumer starts
    /// ("first", "last", "next", an offset or a timestamp), and the header
    /// on each delivery that says the message's own offset.
    public static let offsetArgument = "x-stream-offset"
}
