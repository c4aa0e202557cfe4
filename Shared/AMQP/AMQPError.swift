/// Every failure of the AMQP layer: a code, a readable message, and the
/// broker's reply code where the broker gave one.
///
/// Messages never contain a password.
public struct AMQPError: Error, Sendable, Equatable, CustomStringConvertible {
    public struct Code: Sendable, Hashable, CustomStringConvertible {
        let name: String
        public var description: String { name }

        public static let invalidURL = Code(name: "invalid_url")
        public static let invalidConfiguration = Code(name: "invalid_configuration")
        /// TCP connect, DNS, or the socket failed.
        public static let connectionFailed = Code(name: "connection_failed")
        public static let tlsFailed = Code(name: "tls_failed")
        /// The broker refused the credentials or the vhost (403 ACCESS_REFUSED, 530 NOT_ALLOWED).
        public static let authenticationFailed = Code(name: "authentication_failed")
        /// The connection is gone (closed by us, the broker, or the network).
        public static let connectionClosed = Code(name: "connection_closed")
        /// The broker closed the channel (404, 406, 403 ...); `replyCode` says why.
        public static let channelClosed = Code(name: "channel_closed")
        /// The broker blocked publishing (connection.blocked, a resource alarm).
        public static let connectionBlocked = Code(name: "connection_blocked")
        /// A mandatory message could not be routed (basic.return).
        public static let returned = Code(name: "returned")
        /// The broker nacked a published message.
        public static let nacked = Code(name: "nacked")
        /// The broker cancelled a consumer (its queue was deleted, or a failover).
        public static let consumerCancelled = Code(name: "consumer_cancelled")
        public static let timeout = Code(name: "timeout")
        /// A message AMQP cannot carry (an exchange, routing key or property
        /// longer than 255 bytes, headers it cannot encode): refused alone,
        /// before any of it was written.
        public static let invalidMessage = Code(name: "invalid_message")
        /// An error inside rabbitmq-c that fits no other code.
        public static let library = Code(name: "library")
    }

    public var code: Code
    public var message: String
    /// The AMQP reply code (404 NOT_FOUND, 406 PRECONDITION_FAILED, 403 ACCESS_REFUSED ...).
    public var replyCode: UInt16?
    /// The rabbitmq-c status code, when the library reported the failure.
    public var libraryStatus: Int32?

    public init(_ code: Code, _ message: String, replyCode: UInt16? = nil, libraryStatus: Int32? = nil) {
        self.code = code
        self.message = message
        self.replyCode = replyCode
        self.libraryStatus = libraryStatus
    }

    /// `error` itself when it is one, else a library error that describes it.
    public static func from(_ error: any Error) -> AMQPError {
        error as? AMQPError ?? AMQPError(.library, "\(error)")
    }

    /// Whether trying again later (on a new channel or connection) can succeed.
    public var isRetryable: Bool {
        switch code {
        case .connectionFailed, .connectionClosed, .connectionBlocked, .timeout, .nacked, .tlsFailed:
            true
        case .channelClosed:
            // 320 CONNECTION_FORCED, 541 INTERNAL_ERROR and 505/506 frame errors are transient;
            // 404/406/403 are not until someone changes the topology.
            [320, 541, 505, 506].contains(replyCode ?? 0)
        default:
            false
        }
    }

    public var description: String {
        if let replyCode { return "\(code) (\(replyCode)): \(message)" }
        return "\(code): \(message)"
    }

    public static let notFound: UInt16 = 404
    public static let preconditionFailed: UInt16 = 406
    public static let accessRefused: UInt16 = 403
    public static let resourceLocked: UInt16 = 405
}
