import Foundation

/// Acks, nacks or rejects on the channel a delivery came from. After that
/// channel or connection has gone, the broker has already requeued the
/// message, so the call throws `.channelClosed` and changes nothing.
struct DeliveryAcknowledger: Sendable {
    let core: ConnectionCore
    let channel: UInt16
    let epoch: UInt64

    func send(_ tag: UInt64, _ kind: AcknowledgementKind) async throws {
        let channel = channel, epoch = epoch
        try await core.perform { loop in
            try loop.acknowledge(try loop.channel(channel, epoch: epoch), tag: tag, kind: kind)
        }
    }
}

/// A message from a consumer. Unless consumed with `noAck`, settle it once
/// with `ack`, `nack` or `reject`.
public struct AMQPDelivery: Sendable {
    public let body: Data
    public let properties: AMQPProperties
    public let exchange: String
    public let routingKey: String
    /// True when the broker delivered it before (to this or another consumer) without an ack.
    public let redelivered: Bool
    public let deliveryTag: UInt64
    public let consumerTag: String
    let acknowledger: DeliveryAcknowledger

    public func ack(multiple: Bool = false) async throws {
        try await acknowledger.send(deliveryTag, .ack(multiple: multiple))
    }

    public func nack(requeue: Bool, multiple: Bool = false) async throws {
        try await acknowledger.send(deliveryTag, .nack(multiple: multiple, requeue: requeue))
    }

    public func reject(requeue: Bool) async throws {
        try await acknowledger.send(deliveryTag, .reject(requeue: requeue))
    }
}
