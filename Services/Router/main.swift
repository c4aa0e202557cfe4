import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

// frontdesk-router: consumes dispatch requests, validates, de-duplicates,
// resolves the route and hands the dispatch to the sender (CONTRACT.md).

let configuration = ServiceBootstrap.configurationOrExit(
    service: "frontdesk-router",
    summary: "validates and routes Front Desk dispatch requests",
    defaultHTTPPort: 9101)
let table = ServiceBootstrap.routingTableOrExit(configuration)
let topologyLogger = Logger(service: configuration.service, level: configuration.logLevel)
let bootstrap = ServiceBootstrap(configuration: configuration) { channel in
    try await RouterTopology.declare(
        on: channel, partitions: configuration.senderPartitions,
        statusLogWayRefused: { error in SharedTopology.warnStatusLogWayRefused(topologyLogger, error) },
        intakeWithoutExpiredWay: { error in
            topologyLogger.warning(
                "\(RouterTopology.intakeQueue) was declared without its way for expired messages: a request a producer set to expire is lost if it waits that long; delete the queue while it is empty to have it declared anew",
                [("error", .string("\(error)"))])
        })
}
let service = RouterService(
    client: bootstrap.client,
    log: DecisionLog(
        client: bootstrap.client, windowSeconds: configuration.lifetimeSeconds, login: configuration.login, logger: bootstrap.logger),
    resolver: RouteResolver(table: table),
    configuration: configuration,
    logger: bootstrap.logger,
    metrics: RouterMetrics(bootstrap.metrics),
    intake: RouterService.IntakeHandle())
let probes = bootstrap.startProbes()
bootstrap.logger.info("starting", [
    ("broker", .string("\(configuration.amqp.url)")),
    ("routes", .string(configuration.routesPath ?? "example")),
    ("targets", .int(table.routes.count)),
])
let status = await ServiceLifecycle.run(bootstrap.lifecycleServices([AMQPClientService(client: bootstrap.client), service]), logger: bootstrap.logger)
probes?.stop()
bootstrap.logger.info("stopped", [("status", .int(Int(status)))])
exit(status)
