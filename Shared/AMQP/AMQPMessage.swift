import Foundation

/// The basic properties of a message. `nil` leaves a property unset.
public struct AMQPProperties: Sendable, Equatable {
    public var contentType: String?
    public var contentEncoding: String?
    public var headers: FieldTable?
    /// 2 is persistent, 1 transient.
    public var deliveryMode: UInt8?
    public var priority: UInt8?
    public var correlationID: String?
    public var replyTo: String?
    /// Per-message TTL in milliseconds, as the decimal string AMQP wants.
    public var expiration: String?
    public var messageID: String?
    /// Seconds since 1970.
    public var timestamp: UInt64?
    public var type: String?
    public var userID: String?
    public var appID: String?

    public init(
        contentType: String? = nil, contentEncoding: String? = nil, headers: FieldTable? = nil,
        deliveryMode: UInt8? = nil, priority: UInt8? = nil, correlationID: String? = nil,
        replyTo: String? = nil, expiration: String? = nil, messageID: String? = nil,
        timestamp: UInt64? = nil, type: String? = nil, userID: String? = nil, appID: String? = nil
    ) {
        self.contentType = contentType
        self.contentEncoding = contentEncoding
        self.headers = headers
        self.deliveryMode = deliveryMode
        self.priority = priority
        self.correlationID = correlationID
        self.replyTo = replyTo
        self.expiration = expiration
        self.messageID = messageID
        self.timestamp = timestamp
        self.type = type
        self.userID = userID
        self.appID = appID
    }

    /// JSON, persistent: what every Front Desk message is.
    public static func persistentJSON(
        messageID: String? = nil, correlationID: String? = nil, type: String? = nil,
        headers: FieldTable? = nil
    ) -> AMQPProperties {
        AMQPProperties(
            contentType: "application/json", headers: headers, deliveryMode: 2,
            correlationID: correlationID, messageID: messageID,
            timestamp: UInt64(Date().timeIntervalSince1970), type: type)
    }
}

/// A message to publish.
public struct OutboundMessage: Sendable {
    public var exchange: String
    public var routingKey: String
    public var body: Data
    public var properties: AMQPProperties
    /// Ask the broker to return the message (an error for the publisher) when no queue takes it.
    public var mandatory: Bool
    /// Its queues may take it twice (their readers drop a repeat): should
    /// its confirm be overdue (`AMQPConnectionConfiguration.republishAfterMs`),
    /// the connection publishes it once more, and the first confirm of
    /// either copy counts. A broker that loses a message at a queue leader's
    /// change (RabbitMQ's streams can) neither confirms nor nacks it.
    /// Ignored for a mandatory message.
    public var repeatable: Bool
    /// Where the message goes should the broker nack it. A nack says only
    /// that some queue it was routed to refused it (one full with
    /// `x-overflow: reject-publish`, or whose leader is gone); the others took
    /// it. The connection then publishes it once more, on the same channel,
    /// to this exchange and routing key, mandatory, and that publish's
    /// confirm (or return) is the message's result. For a message whose
    /// essential queue can be reached on a way of its own that no one else
    /// binds to, while anyone may bind a queue to its usual exchange.
    /// Ignored for a mandatory message.
    public var ifNacked: Destination?

    /// An exchange and a routing key.
    public struct Destination: Sendable, Equatable {
        public var exchange: String
        public var routingKey: String
        public init(exchange: String, routingKey: String) {
            self.exchange = exchange
            self.routingKey = routingKey
        }
    }

    public init(
        exchange: String, routingKey: String, body: Data,
        properties: AMQPProperties = AMQPProperties(), mandatory: Bool = false, repeatable: Bool = false,
        ifNacked: Destination? = nil
    ) {
        self.exchange = exchange
        self.routingKey = routingKey
        self.body = body
        self.properties = properties
        self.mandatory = mandatory
        self.repeatable = repeatable
        self.ifNacked = ifNacked
    }

    /// This message sent to `ifNacked` instead (mandatory, with no further
    /// way of its own and no repeat), or nil if it has none.
    var redirected: OutboundMessage? {
        guard let to = ifNacked, !mandatory else { return nil }
        return OutboundMessage(exchange: to.exchange, routingKey: to.routingKey, body: body, properties: properties, mandatory: true)
    }
}

/// A message the broker returned to its publisher (basic.return).
public struct ReturnedMessage: Sendable {
    public var replyCode: UInt16
    public var replyText: String
    public var exchange: String
    public var routingKey: String
    public var body: Data
    public var properties: AMQPProperties
}

extension OutboundMessage {
    /// What makes this message one AMQP cannot carry (a short string, which
    /// names and most properties are, holds at most 255 bytes), or nil.
    /// Header values are not checked here: over plain TCP a whole window is
    /// encoded before anything is written, and a message that fails is
    /// refused alone. Header keys are: rabbitmq-c writes a longer key's length
    /// cut to one byte, and the broker would read a corrupt frame.
    var amqpCannotCarry: String? {
        let p = properties
        let shortStrings: [(String, String?)] = [
            ("exchange", exchange), ("routing key", routingKey), ("content type", p.contentType),
            ("content encoding", p.contentEncoding), ("correlation id", p.correlationID), ("reply-to", p.replyTo),
            ("expiration", p.expiration), ("message id", p.messageID), ("type", p.type), ("user id", p.userID),
            ("app id", p.appID),
        ]
        for (name, value) in shortStrings {
            if let value, value.utf8.count > FieldTable.maxShortStringBytes {
                return "its \(name) is \(value.utf8.count) bytes (at most \(FieldTable.maxShortStringBytes))"
            }
        }
        if let headers = p.headers, !headers.keysFit { return "a header key is over \(FieldTable.maxShortStringBytes) bytes" }
        return nil
    }
}

extension String {
    /// The longest start of the string of at most `maxBytes` bytes of UTF-8
    /// that ends between two scalars (the whole string if it fits).
    public func utf8Prefix(_ maxBytes: Int) -> String {
        guard utf8.count > maxBytes else { return self }
        var end = utf8.index(utf8.startIndex, offsetBy: max(0, maxBytes))
        while end > utf8.startIndex, UTF8.isContinuation(utf8[end]) { end = utf8.index(before: end) }
        return String(decoding: utf8[..<end], as: UTF8.self)
    }
}
