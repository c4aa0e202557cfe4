import AMQP
import Foundation
import ServiceKit

// frontdesk-sender: delivers dispatches to agents, watches presence, queues,
// retries, cancels, reroutes and expires them (CONTRACT.md).
// This shell wires the service kit; delivery comes with their own change.

let configuration = ServiceBootstrap.configurationOrExit(
    service: "frontdesk-sender",
    summary: "delivers Front Desk dispatches to agents",
    defaultHTTPPort: 9102)
let bootstrap = ServiceBootstrap(configuration: configuration) { channel in
    try await SharedTopology.declare(on: channel)
}
let probes = bootstrap.startProbes()
bootstrap.logger.info("starting", [("broker", .string("\(configuration.amqp.url)"))])
let status = await ServiceLifecycle.run([AMQPClientService(client: bootstrap.client)], logger: bootstrap.logger)
probes?.stop()
bootstrap.logger.info("stopped", [("status", .int(Int(status)))])
exit(status)
