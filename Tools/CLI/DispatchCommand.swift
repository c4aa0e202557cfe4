import AMQP
import Foundation
import FrontDeskModel

/// `frontdesk dispatch "text"`: publishes a request and follows it to its
/// end. Exit 0 when the agent replied, 1 when it failed or was cancelled.
func dispatchCommand(_ args: Arguments) async throws -> Int32 {
    guard args.positionals.count == 1, let input = args.positionals.first else {
        throw CLIUsageError("dispatch takes the request text as one argument")
    }
    let id = args.options["id"] ?? UUID().uuidString.lowercased()
    let json = args.switches.contains("json") || !stdoutIsTerminal
    let connection = try await connect(args, name: "dispatch")
    defer { Task { await connection.close() } }
    // A queue of our own on the status exchange, bound before the request goes out.
    let channel = try await connection.openChannel()
    let queue = try await channel.queueDeclare("", durable: false, exclusive: true, autoDelete: true)
    // The services declare the exchanges; a producer's user may not (least privilege).
    do {
        try await channel.queueBind(queue.name, exchange: "frontdesk.status", routingKey: "status.#")
    } catch let error as AMQPError where error.replyCode == 404 {
        throw CLIRuntimeError("the exchange frontdesk.status does not exist yet: start frontdesk-router or frontdesk-sender once")
    }
    var body: [String: Any] = ["id": id, "input": input, "createdAt": RFC3339.format(Date())]
    for (flag, field) in [("project", "project"), ("target", "target"), ("thread", "threadId"), ("user", "user")] {
        if let v = args.options[flag] { body[field] = v }
    }
    try await publishCommand(connection, routingKey: "dispatch.request", body: body)
    var state = LiveActivityState()
    for try await d in try await channel.consume(queue: queue.name, noAck: true) {
        guard d.properties.correlationID == id, let event = try? JSONDecoder().decode(StatusEvent.self, from: d.body) else { continue }
        guard state.apply(event) else { continue }
        if json {
            emit(String(decoding: d.body, as: UTF8.self))
        } else if let view = state.view(now: Date()) {
            emit(Render.line(view))
        }
        if event.state.isTerminal { return event.state == .replied ? 0 : 1 }
    }
    throw CLIRuntimeError("the connection to the broker ended before the dispatch did")
}

/// `frontdesk cancel ID [--reason R]` and `frontdesk reroute ID PROJECT/TARGET`.
func controlCommand(_ command: String, _ args: Arguments) async throws -> Int32 {
    if command == "cancel" {
        guard args.positionals.count == 1 else { throw CLIUsageError("cancel takes a dispatch id") }
        let connection = try await connect(args, name: "cancel")
        try await publishCommand(connection, routingKey: "dispatch.cancel", body: ["id": args.positionals[0], "reason": args.options["reason"] ?? "user"])
        await connection.close()
    } else {
        guard args.positionals.count == 2, case let parts = args.positionals[1].split(separator: "/"), parts.count == 2 else {
            throw CLIUsageError("reroute takes a dispatch id and PROJECT/TARGET")
        }
        let connection = try await connect(args, name: "reroute")
        try await publishCommand(connection, routingKey: "dispatch.reroute", body: ["id": args.positionals[0], "project": String(parts[0]), "target": String(parts[1])])
        await connection.close()
    }
    return 0
}
