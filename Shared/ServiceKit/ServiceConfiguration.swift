import AMQP
import Foundation
import FrontDeskModel

/// The settings of CONTRACT.md's configuration table, shared by both services.
public struct ServiceConfiguration: Sendable {
    public struct Retry: Sendable, Equatable {
        public var baseMs = 1000
        public var maxMs = 60_000
        public var maxAttempts = 5

        public init(baseMs: Int = 1000, maxMs: Int = 60_000, maxAttempts: Int = 5) {
            self.baseMs = baseMs
            self.maxMs = maxMs
            self.maxAttempts = maxAttempts
        }
    }

    public var service: String
    public var amqp: AMQPConnectionConfiguration
    /// nil: the example table shipped with the project.
    public var routesPath: String?
    public var lifetimeSeconds = 14_400
    public var retry = Retry()
    public var replyTimeoutSeconds = 600
    /// 0 turns the HTTP listener off.
    public var httpPort: Int
    public var logLevel: LogLevel = .info
    /// The router's login: the sender takes hand-offs only from it (and itself).
    public var routerUser = "router"
    /// How the sender's work is split by route; the router and every sender must agree.
    public var senderPartitions = SenderPartitions.one
    /// How long the router lets a small batch of requests wait for more
    /// while they come often enough that more are expected (`BatchLinger`); 0: never.
    public var intakeLingerMs = Self.defaultIntakeLingerMs
    public static let defaultIntakeLingerMs = 5

    /// This service's login on the broker: the `user_id` of its internal messages.
    public var login: String { amqp.url.user }

    public static let defaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/%2f"

    public static func options(defaultHTTPPort: Int) -> [OptionSpecification] {
        [
            .init("AMQP_URL", flag: "--amqp-url", default: defaultAMQPURL, help: "broker URL (amqps:// for TLS)"),
            .init("AMQP_CA_FILE", flag: "--amqp-ca-file", default: "", help: "CA certificate (PEM) that signed the broker's"),
            .init("AMQP_CERT_FILE", flag: "--amqp-cert-file", default: "", help: "client certificate (PEM)"),
            .init("AMQP_KEY_FILE", flag: "--amqp-key-file", default: "", help: "client key (PEM)"),
            .init("FRONTDESK_ROUTES", default: "the shipped example table", help: "routing table (JSON)"),
            .init("FRONTDESK_LIFETIME_S", default: "14400", help: "a dispatch's lifetime, seconds"),
            .init("FRONTDESK_RETRY_BASE_MS", default: "1000", help: "delay before the 2nd attempt, ms"),
            .init("FRONTDESK_RETRY_MAX_MS", default: "60000", help: "longest delay between attempts, ms"),
            .init("FRONTDESK_MAX_ATTEMPTS", default: "5", help: "delivery attempts before failing"),
            .init("FRONTDESK_REPLY_TIMEOUT_S", default: "600", help: "wait for an agent's final reply, seconds"),
            .init("FRONTDESK_HTTP_PORT", default: "\(defaultHTTPPort)", help: "port of /healthz, /readyz, /metrics; 0 turns it off"),
            .init("FRONTDESK_LOG_LEVEL", default: "info", help: "debug, info, warning or error"),
            .init("FRONTDESK_ROUTER_USER", default: "router", help: "the router's broker login; the sender takes hand-offs only from it"),
            .init(
                "FRONTDESK_INTAKE_LINGER_MS", default: "\(defaultIntakeLingerMs)",
                help: "router: how long a small batch of requests may wait for more while more are expected, ms; 0: never"),
            .init(
                "FRONTDESK_SENDER_PARTITIONS", default: "1",
                help: "the sender's work split by route into this many partitions (1-\(SenderPartitions.maxCount)); the same for the router and every sender"),
        ]
    }

    /// The nodes of `AMQP_URL`: one URL, or several of one cluster
    /// comma-separated, with the same user and vhost (one login, one place).
    public static func nodes(_ text: String) throws(UsageError) -> [AMQPURL] {
        var nodes: [AMQPURL] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let trimmed = part.trimmingCharacters(in: .whitespaces)
            guard !trimmed.isEmpty else { throw UsageError("AMQP_URL has an empty entry; separate the nodes' URLs with single commas") }
            do {
                nodes.append(try AMQPURL(parsing: trimmed))
            } catch {
                throw UsageError("AMQP_URL: \(error.message)")
            }
        }
        guard let first = nodes.first else { throw UsageError("AMQP_URL is empty") }
        for n in nodes.dropFirst() where n.user != first.user || n.vhost != first.vhost {
            throw UsageError("AMQP_URL: every node must have the same user and vhost (\(n) differs from \(first))")
        }
        return nodes
    }

    /// Builds the configuration from read option values.
    public init(service: String, values: OptionValues, defaultHTTPPort: Int, hostName: String = ProcessInfo.processInfo.hostName) throws(UsageError) {
        self.service = service
        let urlText = values.string("AMQP_URL", default: Self.defaultAMQPURL)
        let nodes = try Self.nodes(urlText)
        let url = nodes[0]
        var tls = AMQPConnectionConfiguration.TLS(
            caFile: values["AMQP_CA_FILE"], certificateFile: values["AMQP_CERT_FILE"], keyFile: values["AMQP_KEY_FILE"])
        tls.verifyPeer = true
        tls.verifyHostname = true
        if (tls.certificateFile == nil) != (tls.keyFile == nil) {
            throw UsageError("AMQP_CERT_FILE and AMQP_KEY_FILE go together: give both or neither")
        }
        amqp = AMQPConnectionConfiguration(url: url, tls: tls, connectionName: "\(service)@\(hostName)")
        amqp.alternates = Array(nodes.dropFirst())
        routesPath = values["FRONTDESK_ROUTES"]
        lifetimeSeconds = try values.int("FRONTDESK_LIFETIME_S", default: 14_400, in: 1...31_536_000)
        retry.baseMs = try values.int("FRONTDESK_RETRY_BASE_MS", default: 1000, in: 1...86_400_000)
        retry.maxMs = try values.int("FRONTDESK_RETRY_MAX_MS", default: 60_000, in: 1...86_400_000)
        retry.maxAttempts = try values.int("FRONTDESK_MAX_ATTEMPTS", default: 5, in: 1...1000)
        replyTimeoutSeconds = try values.int("FRONTDESK_REPLY_TIMEOUT_S", default: 600, in: 1...31_536_000)
        httpPort = try values.int("FRONTDESK_HTTP_PORT", default: defaultHTTPPort, in: 0...65535)
        let level = values.string("FRONTDESK_LOG_LEVEL", default: "info")
        guard let parsed = LogLevel(rawValue: level.lowercased()) else {
            throw UsageError("FRONTDESK_LOG_LEVEL must be debug, info, warning or error, not '\(level)'")
        }
        logLevel = parsed
        routerUser = values.string("FRONTDESK_ROUTER_USER", default: routerUser)
        intakeLingerMs = try values.int("FRONTDESK_INTAKE_LINGER_MS", default: Self.defaultIntakeLingerMs, in: 0...1000)
        senderPartitions = SenderPartitions(count: try values.int("FRONTDESK_SENDER_PARTITIONS", default: 1, in: 1...SenderPartitions.maxCount))
    }
}
