import Foundation

/// Acks, nacks or rejects on the channel a delivery came from.
///
/// Like a basic.ack on the wire, this does not wait for an answer: it queues
/// the ack for the connection's thread and returns. It throws when the
/// connection has already ended. An ack for a channel that has closed is
/// dropped: the broker has requeued that message already.
struct DeliveryAcknowledger: Sendable {
    let core: ConnectionCore
    let channel: UInt16
    let epoch: UInt64

    func send(_ tag: UInt64, _ kind: AcknowledgementKind) throws {
        let channel = channel, epoch = epoch
        let accepted = core.submit { loop in
            guard let ch = try? loop.channel(channel, epoch: epoch) else { return }
            try? loop.acknowledge(ch, tag: tag, kind: kind)
        }
        if !accepted { throw core.closedError }
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
    /// The largest frame the connection it came on carries, as negotiated
    /// with the broker: its properties fit in one, and so must those of a
    /// message made from it (a dead letter keeping its headers).
    public let frameMax: Int
    let acknowledger: DeliveryAcknowledger

    /// The routing key a message had before a queue dead-lettered it: the
    /// first of `x-death`'s first entry's `routing-keys` (the broker's own
    /// header; from anyone else it may be missing or odd: nil then).
    public var deadLetteredRoutingKey: String? {
        guard case .array(let deaths)? = properties.headers?["x-death"], let first = deaths.first?.tableValue,
            case .array(let keys)? = first["routing-keys"], let key = keys.first?.stringValue
        else { return nil }
        return key
    }

    /// Queues basic.ack; throws only when the connection has ended.
    public func ack(multiple: Bool = false) throws {
        try acknowledger.send(deliveryTag, .ack(multiple: multiple))
    }

    /// Queues basic.nack; with `requeue: false` the queue dead-letters the message (if it has a DLX).
    public func nack(requeue: Bool, multiple: Bool = false) throws {
        try acknowledger.send(deliveryTag, .nack(multiple: multiple, requeue: requeue))
    }

    public func reject(requeue: Bool) throws {
        try acknowledger.send(deliveryTag, .reject(requeue: requeue))
    }
}
