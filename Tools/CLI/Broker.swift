import AMQP
import Foundation
import ServiceKit

/// The broker the CLI talks to: `--amqp-url`, else AMQP_URL, else the contract's default.
func connect(_ args: Arguments, name: String) async throws -> AMQPConnection {
    let text = args.options["amqp-url"] ?? ProcessInfo.processInfo.environment["AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5672/%2f"
    // One URL, or several nodes of a cluster comma-separated: the first that answers, in a shuffled order.
    let nodes: [AMQPURL]
    do { nodes = try ServiceConfiguration.nodes(text) } catch { throw CLIUsageError(error.message) }
    var configuration = AMQPConnectionConfiguration(url: nodes[0], connectionName: "frontdesk \(name)@\(ProcessInfo.processInfo.hostName)")
    let env = ProcessInfo.processInfo.environment
    configuration.tls = .init(caFile: env["AMQP_CA_FILE"], certificateFile: env["AMQP_CERT_FILE"], keyFile: env["AMQP_KEY_FILE"])
    var failures: [String] = []
    for node in nodes.shuffled() {
        do {
            return try await AMQPConnection.connect(configuration.to(node))
        } catch let error as AMQPError {
            failures.append("\(node): \(error.message)")
        }
    }
    throw CLIRuntimeError("cannot reach the broker: \(failures.joined(separator: "; "))")
}

func publishCommand(_ connection: AMQPConnection, routingKey: String, body: [String: Any]) async throws {
    let channel = try await connection.openChannel()
    try await channel.confirmSelect()
    try await channel.publish(
        exchange: "frontdesk.commands", routingKey: routingKey, body: try JSONSerialization.data(withJSONObject: body),
        properties: .persistentJSON(messageID: UUID().uuidString, type: "frontdesk.\(routingKey).v1"), mandatory: true)
}

var stdoutIsTerminal: Bool { isatty(1) == 1 }

/// Writes one line to stdout at once (one write(2): no buffering to flush,
/// and a reader on a pipe sees each event as it happens).
func emit(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    bytes.withUnsafeBytes { _ = write(1, $0.baseAddress, $0.count) }
}
