import AMQP
import Foundation
import FrontDeskModel

/// What every Front Desk service starts with: its configuration read from
/// the environment and flags, a logger, metrics, a recovering AMQP client
/// and the probe listener.
public struct ServiceBootstrap: Sendable {
    public let configuration: ServiceConfiguration
    public let logger: Logger
    public let metrics: MetricsRegistry
    public let client: AMQPClient
    /// With the probes on: a resource alarm, learned by publishing now and
    /// then on a connection of its own, makes `/readyz` 503 (run it with the
    /// services: `lifecycleServices`).
    public let alarmProbe: ResourceAlarmProbe?

    /// Reads the configuration; prints help and exits 0 for `--help`, and
    /// exits 2 with one sentence on stderr for a usage mistake.
    public static func configurationOrExit(
        service: String, summary: String, defaultHTTPPort: Int,
        arguments: [String] = Array(CommandLine.arguments.dropFirst()),
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> ServiceConfiguration {
        configurationOrExit(
            service: service, summary: summary, defaultHTTPPort: defaultHTTPPort, extra: [], arguments: arguments,
            environment: environment
        ).configuration
    }

    /// As above, with the service's own options besides the shared ones.
    public static func configurationOrExit(
        service: String, summary: String, defaultHTTPPort: Int, extra: [OptionSpecification],
        arguments: [String] = Array(CommandLine.arguments.dropFirst()),
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> (configuration: ServiceConfiguration, values: OptionValues) {
        do {
            let options = ServiceConfiguration.options(defaultHTTPPort: defaultHTTPPort) + extra
            switch try OptionReader.read(options, arguments: arguments, environment: environment, program: service, summary: summary) {
            case .help(let text):
                print(text)
                exit(0)
            case .values(let values):
                return (try ServiceConfiguration(service: service, values: values, defaultHTTPPort: defaultHTTPPort), values)
            }
        } catch {
            FileHandle.standardError.write(Data("\(service): \(error.message)\n".utf8))
            exit(2)
        }
    }

    /// Loads the routing table (or the shipped example); a bad table exits 2
    /// with one sentence naming the problem.
    public static func routingTableOrExit(_ configuration: ServiceConfiguration) -> RoutingTable {
        do {
            return try RoutingTable.load(path: configuration.routesPath)
        } catch {
            FileHandle.standardError.write(Data("\(configuration.service): \(error.message)\n".utf8))
            exit(2)
        }
    }

    public init(configuration: ServiceConfiguration, topology: @escaping AMQPClient.Topology) {
        self.configuration = configuration
        let logger = Logger(service: configuration.service, level: configuration.logLevel)
        self.logger = logger
        metrics = MetricsRegistry()
        alarmProbe = configuration.alarmProbe()
        let connected = metrics.gauge("frontdesk_amqp_connected", "1 while connected with the topology declared")
        let reconnects = metrics.counter("frontdesk_amqp_reconnects_total", "connection attempts that failed or connections lost")
        client = AMQPClient(
            configuration: AMQPClient.Configuration(connection: configuration.amqp), topology: topology,
            onEvent: { event in
                switch event {
                case .connected(let attempt):
                    connected.set(1)
                    logger.info("connected", [("broker", .string("\(configuration.amqp.url)")), ("attempt", .int(attempt))])
                case .connectFailed(let error, let retryInMs):
                    connected.set(0)
                    reconnects.increment()
                    logger.warning("cannot connect; retrying", [("error", .string(error.description)), ("retry_in_ms", .int(retryInMs))])
                case .connectionLost(let error):
                    connected.set(0)
                    reconnects.increment()
                    logger.warning("connection lost; reconnecting", [("error", .string(error?.description ?? "closed"))])
                case .consumerRestartFailed(let queue, let error):
                    logger.warning("consumer stopped; restarting", [("queue", .string(queue)), ("error", .string(error.description))])
                }
            })
    }

    /// Starts /healthz, /readyz and /metrics unless the port is 0. Ready:
    /// `isReady`, by default while the client is connected with its topology.
    public func startProbes(isReady: (@Sendable () -> Bool)? = nil) -> HTTPServer? {
        guard configuration.httpPort != 0 else { return nil }
        let client = client
        let alarm = alarmProbe
        let ready = isReady ?? { client.isReady }
        do {
            let server = try HTTPServer(
                port: configuration.httpPort,
                handler: ProbeRoutes.handler(isReady: { ready() && alarm?.blockedReason == nil }, metrics: metrics))
            logger.info("serving probes", [("port", .int(server.port))])
            return server
        } catch {
            logger.error("cannot serve probes", [("error", .string("\(error)"))])
            exit(1)
        }
    }
}

extension ServiceBootstrap {
    /// `services` with what the bootstrap runs besides: the alarm probe.
    public func lifecycleServices(_ services: [any Service]) -> [any Service] {
        services + (alarmProbe.map { [$0] } ?? [])
    }
}

extension ResourceAlarmProbe: Service {}

extension ServiceConfiguration {
    /// The alarm probe `/readyz` needs: with the probes on, else none.
    public func alarmProbe() -> ResourceAlarmProbe? {
        httpPort == 0 ? nil : ResourceAlarmProbe(configuration: amqp)
    }
}

/// Runs an `AMQPClient` as a service: connect and reconnect until shutdown.
public struct AMQPClientService: Service {
    public let client: AMQPClient
    public init(client: AMQPClient) { self.client = client }
    public func run() async throws { await client.run() }
    public func shutdown() async { await client.shutdown() }
}
