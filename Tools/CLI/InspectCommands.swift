import AMQP
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

// show, list, targets, dead: what an operator asks of a running system.

/// Reads the status log from the start of the lifetime window until it has
/// been quiet for `quiet` (a stream has no end to wait for): every status event.
func readStatusLog(_ args: Arguments, name: String, quiet: Duration = .milliseconds(400)) async throws -> [StatusEvent] {
    let lifetime = UInt64(clamping: try args.int("lifetime-s", default: 14_400))
    let connection = try await connect(args, name: name)
    defer { Task { await connection.close() } }
    let channel = try await connection.openChannel()
    try await channel.qos(prefetchCount: 1000)
    let since = UInt64(Date().timeIntervalSince1970).subtractingClamped(lifetime)
    let consumer: AMQPConsumer
    do {
        consumer = try await channel.consume(queue: SharedTopology.statusLog, arguments: ["x-stream-offset": .timestamp(since)])
    } catch let error as AMQPError where error.replyCode == 404 {
        throw CLIRuntimeError("the status log \(SharedTopology.statusLog) does not exist yet: start frontdesk-sender once")
    }
    let deliveries = try await collect(consumer, quiet: quiet, each: { try? $0.ack() })
    return deliveries.compactMap { d in
        d.properties.type == StatusEvent.type ? try? JSONDecoder().decode(StatusEvent.self, from: d.body) : nil
    }
}

/// Takes deliveries from `consumer` (running `each` on every one) until
/// `done` holds for what was taken, or none has come for `quiet`: a stream or
/// a queue read by a client has no end to wait for.
func collect(
    _ consumer: AMQPConsumer, quiet: Duration = .milliseconds(400), each: @escaping @Sendable (AMQPDelivery) -> Void = { _ in },
    until done: ([AMQPDelivery]) -> Bool = { _ in false }
) async throws -> [AMQPDelivery] {
    let taken = Mutex<(deliveries: [AMQPDelivery], last: ContinuousClock.Instant)>(([], .now))
    let reader = Task {
        for try await d in consumer {
            each(d)
            taken.withLock {
                $0.deliveries.append(d)
                $0.last = .now
            }
        }
    }
    defer { reader.cancel() }
    let started = ContinuousClock.now
    while true {
        try await Task.sleep(for: .milliseconds(50))
        let (deliveries, last) = taken.withLock { ($0.deliveries, $0.last) }
        if done(deliveries) { return deliveries }
        if ContinuousClock.now - last > quiet, ContinuousClock.now - started > quiet + .milliseconds(200) { return deliveries }
    }
}

/// The latest event of each dispatch, in the order they started.
func latestByDispatch(_ events: [StatusEvent]) -> [StatusEvent] {
    var latest: [String: StatusEvent] = [:]
    var order: [String] = []
    for e in events {
        if let known = latest[e.dispatchId] {
            if e.seq > known.seq { latest[e.dispatchId] = e }
        } else {
            latest[e.dispatchId] = e
            order.append(e.dispatchId)
        }
    }
    return order.compactMap { latest[$0] }
}

func requireID(_ text: String, _ what: String) throws -> String {
    guard Identifiers.isValidDispatchID(text) else {
        throw CLIUsageError("'\(text.prefix(140))' is no \(what) (1–128 of A–Z a–z 0–9 . _ : -)")
    }
    return text
}

func jsonText(_ object: Any) -> String {
    let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("null".utf8)
    return String(decoding: data, as: UTF8.self)
}

func eventObject(_ e: StatusEvent) -> Any { (try? JSONSerialization.jsonObject(with: e.jsonData())) ?? [:] }

/// `frontdesk show ID`.
func showCommand(_ args: Arguments) async throws -> Int32 {
    guard args.positionals.count == 1 else { throw CLIUsageError("show takes a dispatch id") }
    let id = try requireID(args.positionals[0], "dispatch id")
    var events = try await readStatusLog(args, name: "show").filter { $0.dispatchId == id }
    var seen = Set<Int>()
    events = events.sorted { $0.seq < $1.seq }.filter { seen.insert($0.seq).inserted }
    guard let latest = events.last else {
        if args.switches.contains("json") { emit(jsonText(["error": ["code": "not_found", "message": "no events of \(id)"]])) }
        FileHandle.standardError.write(Data("frontdesk: no events of \(id) in the status log\n".utf8))
        return 1
    }
    if args.switches.contains("json") {
        emit(jsonText(["id": id, "latest": eventObject(latest), "events": events.map(eventObject)]))
        return 0
    }
    var state = LiveActivityState()
    state.apply(latest)
    if let view = state.view(now: Date()) { emit(Render.line(view)) }
    for e in events {
        let route = e.target.map { " → \(e.project?.id ?? "?")/\($0.id)" } ?? ""
        emit("  \(String(e.seq).leftPad(3))  \(e.at)  \(e.state.rawValue.padding(toLength: 9, withPad: " ", startingAt: 0)) \(e.activity)\(route)")
    }
    return 0
}

/// `frontdesk list [--state S] [--target T]`.
func listCommand(_ args: Arguments) async throws -> Int32 {
    guard args.positionals.isEmpty else { throw CLIUsageError("list takes no arguments; filter with --state and --target") }
    let stateFilter = args.options["state"]
    if let s = stateFilter, s != "open", DispatchState(rawValue: s) == nil {
        throw CLIUsageError("--state takes one of drafted, routing, sending, queued, replied, failed, cancelled, open")
    }
    let targetFilter = args.options["target"]
    let rows = latestByDispatch(try await readStatusLog(args, name: "list")).filter { e in
        if let s = stateFilter {
            if s == "open" ? e.state.isTerminal : e.state.rawValue != s { return false }
        }
        if let t = targetFilter {
            guard let target = e.target?.id else { return false }
            let full = "\(e.project?.id ?? "")/\(target)"
            if t != target && t != full { return false }
        }
        return true
    }
    if args.switches.contains("json") {
        emit(jsonText(rows.map(eventObject)))
        return 0
    }
    if rows.isEmpty {
        emit("no dispatches\(stateFilter.map { " in state \($0)" } ?? "")\(targetFilter.map { " for \($0)" } ?? "") in the status log")
        return 0
    }
    emit("ID                                    STATE      ROUTE                      AGE      INPUT")
    for e in rows {
        let route = e.target.map { "\(e.project?.id ?? "?")/\($0.id)" } ?? "—"
        let age = RFC3339.parse(e.startedAt).map { Int(Date().timeIntervalSince($0)) } ?? 0
        let input = (e.input ?? "").replacingOccurrences(of: "\n", with: " ")
        emit("\(e.dispatchId.padding(toLength: 37, withPad: " ", startingAt: 0)) \(e.state.rawValue.padding(toLength: 10, withPad: " ", startingAt: 0)) \(route.padding(toLength: 26, withPad: " ", startingAt: 0)) \(formatAge(age).padding(toLength: 8, withPad: " ", startingAt: 0)) \(input.prefix(50))")
    }
    return 0
}

func formatAge(_ seconds: Int) -> String {
    seconds < 60 ? "\(seconds)s" : seconds < 3600 ? "\(seconds / 60)m" : "\(seconds / 3600)h\((seconds % 3600) / 60)m"
}

/// `frontdesk targets`: presence from the agent queues' consumers, parked from the park queues.
func targetsCommand(_ args: Arguments) async throws -> Int32 {
    guard args.positionals.isEmpty else { throw CLIUsageError("targets takes no arguments") }
    let table = try loadTable(args.options["routes"] ?? ProcessInfo.processInfo.environment["FRONTDESK_ROUTES"])
    let connection = try await connect(args, name: "targets")
    defer { Task { await connection.close() } }
    var rows: [[String: Any]] = []
    for p in table.projects {
        for t in p.targets {
            let route = RoutingTable.Route(project: p.id, target: t.id)
            // Passive declares; a missing queue closes its channel, so each gets its own.
            let agents = try? await connection.withChannel { try await $0.queueDeclare(SharedTopology.agentQueue(route), passive: true) }
            let park = try? await connection.withChannel { try await $0.queueDeclare(SharedTopology.parkQueue(route), passive: true) }
            rows.append([
                "project": p.id, "target": t.id, "name": "\(p.name) / \(t.name)",
                "agents": Int(agents?.consumerCount ?? 0), "online": (agents?.consumerCount ?? 0) > 0,
                "parked": Int(park?.messageCount ?? 0), "declared": agents != nil,
            ])
        }
    }
    if args.switches.contains("json") {
        emit(jsonText(rows))
        return 0
    }
    emit("TARGET                        NAME                          PRESENCE        PARKED")
    for r in rows {
        let agents = r["agents"] as? Int ?? 0
        let presence = r["declared"] as? Bool == false ? "not declared" : agents > 0 ? "online (\(agents))" : "offline"
        let target = "\(r["project"] as? String ?? "")/\(r["target"] as? String ?? "")"
        emit("\(target.padding(toLength: 29, withPad: " ", startingAt: 0)) \((r["name"] as? String ?? "").padding(toLength: 29, withPad: " ", startingAt: 0)) \(presence.padding(toLength: 15, withPad: " ", startingAt: 0)) \(r["parked"] as? Int ?? 0)")
    }
    return 0
}

/// `frontdesk dead list` and `frontdesk dead replay MESSAGE_ID`.
func deadCommand(_ args: Arguments) async throws -> Int32 {
    guard let action = args.positionals.first, ["list", "replay"].contains(action) else {
        throw CLIUsageError("usage: frontdesk dead list [--limit N] | dead replay MESSAGE_ID")
    }
    let limit = try args.int("limit", default: action == "list" ? 100 : 100_000)
    guard (1...100_000).contains(limit) else { throw CLIUsageError("--limit takes 1–100000") }
    var wanted: String? = nil
    if action == "replay" {
        guard args.positionals.count == 2, !args.positionals[1].isEmpty else { throw CLIUsageError("dead replay takes a dead letter's message id") }
        wanted = args.positionals[1]
    } else if args.positionals.count != 1 {
        throw CLIUsageError("dead list takes no more arguments")
    }
    let connection = try await connect(args, name: "dead")
    defer { Task { await connection.close() } }
    let channel = try await connection.openChannel()
    try await channel.qos(prefetchCount: UInt16(clamping: min(limit, 1000)))
    let consumer: AMQPConsumer
    do {
        consumer = try await channel.consume(queue: SharedTopology.deadLetterQueue)
    } catch let error as AMQPError where error.replyCode == 403 || error.replyCode == 404 {
        throw CLIRuntimeError("cannot read \(SharedTopology.deadLetterQueue): \(error.message) (an operator's user reads it)")
    }
    // Every dead letter taken is held unacked; closing the channel puts them back, in order.
    let held = try await collect(consumer, until: { deliveries in
        deliveries.count >= limit || wanted.map { w in deliveries.contains { $0.properties.messageID == w } } == true
    })
    let found = wanted.flatMap { w in held.first { $0.properties.messageID == w } }
    defer { Task { await channel.close() } }
    if action == "list" {
        let letters = Array(held.prefix(limit))
        let rows = letters.map(deadLetterObject)
        if args.switches.contains("json") {
            emit(jsonText(rows))
        } else if rows.isEmpty {
            emit("no dead letters")
        } else {
            for r in rows {
                emit("\(r["messageId"] as? String ?? "—")  \(r["code"] as? String ?? "?")  \(r["routingKey"] as? String ?? "?")  from \(r["service"] as? String ?? "?")  at \(r["at"] as? String ?? "?")")
                emit("    \(r["reason"] as? String ?? "")")
            }
        }
        return 0
    }
    guard let letter = found else {
        throw CLIRuntimeError("no dead letter with message id '\(wanted ?? "")' among the \(held.count) read")
    }
    let headers = letter.properties.headers ?? FieldTable()
    guard case .string(let key)? = headers["x-frontdesk-routing-key"], key.hasPrefix("dispatch.") else {
        throw CLIRuntimeError("the dead letter '\(wanted ?? "")' did not come from frontdesk.commands; it is left in place")
    }
    let replayer = connection.configuration.url.user
    let at = RFC3339.format(Date())
    var replayHeaders = FieldTable()
    replayHeaders["x-frontdesk-replayed-by"] = .string(replayer)
    replayHeaders["x-frontdesk-replayed-at"] = .string(at)
    let publisher = try await connection.openChannel()
    try await publisher.confirmSelect()
    try await publisher.publish(
        exchange: SharedTopology.commandsExchange, routingKey: key, body: letter.body,
        properties: AMQPProperties(
            contentType: "application/json", headers: replayHeaders, deliveryMode: 2, correlationID: letter.properties.correlationID,
            messageID: letter.properties.messageID, timestamp: UInt64(Date().timeIntervalSince1970), type: letter.properties.type),
        mandatory: true)
    try letter.ack()
    // The ack is only queued; closing the channel (an RPC behind it on the
    // connection's thread) makes sure the broker has it before the process exits,
    // or the letter would come back as a second copy.
    await channel.close()
    var audit = deadLetterObject(letter)
    audit["audit"] = "dead_replay"
    audit["by"] = replayer
    audit["replayedAt"] = at
    audit["body"] = nil
    FileHandle.standardError.write(Data((jsonText(audit) + "\n").utf8))
    if args.switches.contains("json") { emit(jsonText(["replayed": wanted ?? "", "routingKey": key])) } else { emit("replayed \(wanted ?? "") to \(key)") }
    return 0
}

func deadLetterObject(_ d: AMQPDelivery) -> [String: Any] {
    let h = d.properties.headers ?? FieldTable()
    func header(_ k: String) -> String? { if case .string(let s)? = h[k] { return s } else { return nil } }
    var o: [String: Any] = [
        "code": header("x-frontdesk-error") ?? "?", "reason": header("x-frontdesk-reason") ?? "",
        "service": header("x-frontdesk-service") ?? "?", "routingKey": header("x-frontdesk-routing-key") ?? d.routingKey,
        "bytes": d.body.count,
    ]
    if let id = d.properties.messageID { o["messageId"] = id }
    if let by = header("x-frontdesk-replayed-by") { o["replayedBy"] = by }
    if let t = d.properties.timestamp { o["at"] = RFC3339.format(Date(timeIntervalSince1970: Double(min(t, 253_402_300_799)))) }
    if let text = String(data: d.body.prefix(4096), encoding: .utf8) { o["body"] = text }
    return o
}

extension String {
    func leftPad(_ width: Int) -> String { count >= width ? self : String(repeating: " ", count: width - count) + self }
}
