import AMQP
import Foundation
import FrontDeskModel

/// `frontdesk watch [PATTERN] [--format json|lines|apns]`: every dispatch
/// in flight, as it moves (`apns`: the ActivityKit push for each event). It
/// reads the status log stream from the lifetime window's start, so a
/// dispatch begun before watch started shows up with its current state.
func watchCommand(_ args: Arguments) async throws -> Int32 {
    let pattern = TopicPattern(args.positionals.first ?? "status.#")
    let format = args.options["format"] ?? (args.switches.contains("json") || !stdoutIsTerminal ? "json" : "lines")
    guard ["json", "lines", "apns"].contains(format) else { throw CLIUsageError("--format takes json, lines or apns") }
    let lifetime = UInt64(clamping: try args.int("lifetime-s", default: 14_400))
    let connection = try await connect(args, name: "watch")
    let channel = try await connection.openChannel()
    try await channel.qos(prefetchCount: 500)
    let since = UInt64(Date().timeIntervalSince1970).subtractingClamped(lifetime)
    let consumer: AMQPConsumer
    do {
        consumer = try await channel.consume(queue: "frontdesk.status.log", arguments: ["x-stream-offset": .timestamp(since)])
    } catch let error as AMQPError where error.replyCode == 404 {
        throw CLIRuntimeError("the status log frontdesk.status.log does not exist yet: start frontdesk-sender once")
    }
    var states: [String: LiveActivityState] = [:]
    for try await d in consumer {
        try? d.ack()
        // The log also holds the sender's own records (markers, waiting dispatches): status events only.
        guard d.properties.type == StatusEvent.type, pattern.matches(d.routingKey), let event = try? JSONDecoder().decode(StatusEvent.self, from: d.body) else { continue }
        guard states[event.dispatchId, default: LiveActivityState()].apply(event) else { continue }
        guard let view = states[event.dispatchId]?.view(now: Date()) else { continue }
        switch format {
        case "json": emit(String(decoding: d.body, as: UTF8.self))
        case "apns": emit(String(decoding: ActivityPush.payload(for: event, view: view), as: UTF8.self))
        default: emit("\(event.dispatchId.prefix(8)) " + Render.watchLine(view))
        }
    }
    return 0
}
