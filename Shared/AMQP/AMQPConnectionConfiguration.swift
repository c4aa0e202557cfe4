/// How to reach and identify to the broker.
public struct AMQPConnectionConfiguration: Sendable, CustomStringConvertible {
    public struct TLS: Sendable, Equatable {
        /// PEM file of the CA that signed the broker's certificate.
        public var caFile: String?
        /// PEM client certificate and key, for brokers that ask for one.
        public var certificateFile: String?
        public var keyFile: String?
        /// Both on by default; turn off only for a test against a throwaway broker.
        public var verifyPeer = true
        public var verifyHostname = true

        public init(caFile: String? = nil, certificateFile: String? = nil, keyFile: String? = nil) {
            self.caFile = caFile
            self.certificateFile = certificateFile
            self.keyFile = keyFile
        }
    }

    public var url: AMQPURL
    /// The other nodes of the same cluster (CONTRACT.md: AMQP_URL may list
    /// several, comma-separated). `AMQPClient` connects to a reachable one and
    /// moves to another when its node goes away.
    public var alternates: [AMQPURL] = []
    public var tls: TLS
    /// Shown in the management UI: e.g. "frontdesk-router@host-1".
    public var connectionName: String
    /// How long a synchronous AMQP method (declare, bind, consume ...) may take.
    public var rpcTimeoutMs: Int
    /// How long a published message may wait for its confirm before the
    /// publish fails with `.timeout`.
    public var confirmTimeoutMs: Int
    /// How long a repeatable message (`OutboundMessage.repeatable`) waits for
    /// its confirm before it is published once more (once); either copy's
    /// ack settles it, and it still fails `confirmTimeoutMs` after its first
    /// publish. At or above `confirmTimeoutMs`, nothing is published again.
    public var republishAfterMs: Int

    public init(
        url: AMQPURL, tls: TLS = TLS(), connectionName: String, rpcTimeoutMs: Int = 30_000,
        confirmTimeoutMs: Int = 30_000, republishAfterMs: Int = 5_000
    ) {
        self.url = url
        self.tls = tls
        self.connectionName = connectionName
        self.rpcTimeoutMs = rpcTimeoutMs
        self.confirmTimeoutMs = confirmTimeoutMs
        self.republishAfterMs = republishAfterMs
    }

    /// Every node: `url` first, then the alternates.
    public var nodes: [AMQPURL] { [url] + alternates }

    /// The same settings, connecting to `node`.
    public func to(_ node: AMQPURL) -> AMQPConnectionConfiguration {
        var c = self
        c.url = node
        return c
    }

    public var description: String { "\(connectionName) → \(url)" }
}
