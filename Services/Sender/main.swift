import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

// frontdesk-sender: delivers dispatches to agents, watches presence, queues,
// retries, cancels, reroutes and expires them (CONTRACT.md).

let configuration = ServiceBootstrap.configurationOrExit(
    service: "frontdesk-sender",
    summary: "delivers Front Desk dispatches to agents",
    defaultHTTPPort: 9102)
let table = ServiceBootstrap.routingTableOrExit(configuration)
let logger = Logger(service: configuration.service, level: configuration.logLevel)
let registry = MetricsRegistry()
let service = SenderService(configuration: configuration, table: table, logger: logger, metrics: SenderMetrics(registry))
var probes: HTTPServer? = nil
// A resource alarm shows in /readyz while the sender is idle too (`ResourceAlarmProbe`).
let alarm = configuration.alarmProbe()
if configuration.httpPort != 0 {
    do {
        probes = try HTTPServer(
            port: configuration.httpPort,
            handler: ProbeRoutes.handler(isReady: { service.isReady && alarm?.blockedReason == nil }, metrics: registry))
    } catch {
        logger.error("cannot serve probes", [("error", .string("\(error)"))])
        exit(1)
    }
}
logger.info("starting", [("broker", .string("\(configuration.amqp.url)")), ("targets", .int(table.routes.count))])
let status = await ServiceLifecycle.run([service] + (alarm.map { [$0] } ?? []), logger: logger)
probes?.stop()
logger.info("stopped", [("status", .int(Int(status)))])
exit(status)
