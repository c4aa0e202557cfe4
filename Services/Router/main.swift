import AMQP
import Foundation
import ServiceKit

// frontdesk-router: consumes dispatch requests, validates, de-duplicates,
// resolves the route and hands the dispatch to the sender (CONTRACT.md).
// This shell wires the service kit; intake and routing come with their own change.

let configuration = ServiceBootstrap.configurationOrExit(
    service: "frontdesk-router",
    summary: "validates and routes Front Desk dispatch requests",
    defaultHTTPPort: 9101)
let bootstrap = ServiceBootstrap(configuration: configuration) { channel in
    try await SharedTopology.declare(on: channel)
}
let probes = bootstrap.startProbes()
bootstrap.logger.info("starting", [("broker", .string("\(configuration.amqp.url)"))])
let status = await ServiceLifecycle.run([AMQPClientService(client: bootstrap.client)], logger: bootstrap.logger)
probes?.stop()
bootstrap.logger.info("stopped", [("status", .int(Int(status)))])
exit(status)
