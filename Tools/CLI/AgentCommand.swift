import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

/// `frontdesk agent --target PROJECT/TARGET`: a reference agent. It streams a
/// plausible reply in progress steps with an honest ETA (the time its
/// remaining steps take), then the final reply.
func agentCommand(_ args: Arguments) async throws -> Int32 {
    guard let target = args.options["target"], target.split(separator: "/").count == 2 else {
        throw CLIUsageError("agent needs --target PROJECT/TARGET")
    }
    let delayMs = try args.int("delay-ms", default: 300)
    var failRetryable = try args.int("fail-retryable", default: 0)
    let fail = args.switches.contains("fail"), noEta = args.switches.contains("no-eta")
    if args.switches.contains("instant") { return try await instantAgent(args, target: target) }
    let (queue, channel, replies, _) = try await serve(target, args, prefetch: 1, name: "agent")
    let tasks = TaskCheck(args)
    for try await delivery in try await channel.consume(queue: queue) {
        guard let task = try tasks.accept(delivery) else { continue }
        func reply(_ fields: [String: Any]) async throws {
            var all = fields
            all["dispatchId"] = task.dispatchId
            all["attempt"] = task.attempt
            try await replies.publish(
                exchange: "", routingKey: delivery.properties.replyTo ?? "frontdesk.replies",
                body: try JSONSerialization.data(withJSONObject: all), properties: .persistentJSON(correlationID: task.dispatchId))
        }
        if fail {
            try await reply(["kind": "error", "error": ["code": "agent_refused", "message": "this agent was told to fail"], "retryable": false])
        } else if failRetryable > 0 {
            failRetryable -= 1
            try await reply(["kind": "error", "error": ["code": "busy", "message": "busy, try again"], "retryable": true])
        } else {
            let lines = draft(for: task)
            try await reply(["kind": "accepted", "activity": "Reading the request"])
            for i in lines.indices {
                try await Task.sleep(for: .milliseconds(delayMs))
                var progress: [String: Any] = ["kind": "progress", "text": lines[...i].joined(separator: "\n"), "activity": "Drafting reply"]
                if !noEta { progress["etaMs"] = (lines.count - 1 - i) * delayMs + delayMs }
                try await reply(progress)
            }
            try await reply(["kind": "final", "text": lines.joined(separator: "\n")])
        }
        try delivery.ack()
        let outcome = fail || failRetryable > 0 ? "error" : "final"
        emit(args.switches.contains("json")
            ? jsonText(["dispatchId": task.dispatchId, "attempt": task.attempt, "answered": outcome])
            : "answered \(task.dispatchId) attempt \(task.attempt): \(outcome)")
    }
    return 0
}

/// A short, plausible reply to the request.
func draft(for task: AgentTask) -> [String] {
    let name = task.input.split(separator: " ").dropFirst(2).first.map(String.init)?.trimmingCharacters(in: .punctuationCharacters)
    return [
        "Hi \(name ?? "there"),",
        clockTime(in: task.input).map { "Confirmed for \($0) on Thursday." } ?? "Confirmed.",
        "The agenda is attached; reply here with any changes.",
        "— sent for \(task.project.name) / \(task.target.name)",
    ]
}

/// The first time of day written like 9:30 or 14:00 in `text`.
func clockTime(in text: String) -> String? {
    let bytes = Array(text.utf8)
    func isDigit(_ i: Int) -> Bool { i >= 0 && i < bytes.count && bytes[i] >= 0x30 && bytes[i] <= 0x39 }
    for colon in bytes.indices where bytes[colon] == UInt8(ascii: ":") {
        guard isDigit(colon - 1), isDigit(colon + 1), isDigit(colon + 2) else { continue }
        let start = isDigit(colon - 2) ? colon - 2 : colon - 1
        return String(decoding: bytes[start...(colon + 2)], as: UTF8.self)
    }
    return nil
}

/// `frontdesk agent --instant`: the benchmark's agent. It answers every task
/// at once with its final reply only: whatever tasks have arrived are
/// answered in one window of publishes (prefetch 256), and each task is
/// acked once its reply is confirmed, while the next window goes out.
func instantAgent(_ args: Arguments, target: String) async throws -> Int32 {
    let (queue, channel, replies, executor) = try await serve(target, args, prefetch: 256, name: "instant agent")
    let tasks = TaskCheck(args)
    // Answered on the connection's thread, where the tasks and confirms arrive.
    return try await withTaskExecutorPreference(executor) { try await answerInstantly(queue, channel, replies, tasks) }
}

/// What an agent takes as a task: a body that decodes, and — given the
/// sender's login (`--sender-login`, else `FRONTDESK_SENDER_LOGIN`) — only a
/// message the broker vouches that login published (`user_id`). Anyone who
/// may publish to the default exchange (every agent's user) can put a message
/// in any agent queue by name; without this check such a forged task would be
/// answered, to whatever `reply_to` it names. Anything else is rejected
/// (never requeued) and logged.
struct TaskCheck: Sendable {
    let senderLogin: String?

    init(_ args: Arguments) {
        senderLogin = args.options["sender-login"] ?? ProcessInfo.processInfo.environment["FRONTDESK_SENDER_LOGIN"].flatMap { $0.isEmpty ? nil : $0 }
    }

    func accept(_ delivery: AMQPDelivery) throws -> AgentTask? {
        if let login = senderLogin, delivery.properties.userID != login {
            try delivery.reject(requeue: false)
            let from = delivery.properties.userID.map { "'\($0.prefix(100))'" } ?? "no user_id"
            FileHandle.standardError.write(Data("rejected a task not published by the sender's login '\(login)' (\(from))\n".utf8))
            return nil
        }
        guard let task = try? AgentTask(jsonData: delivery.body) else {
            try delivery.reject(requeue: false)
            FileHandle.standardError.write(Data("rejected a task that is no task (\(delivery.body.count) bytes)\n".utf8))
            return nil
        }
        return task
    }
}

private func answerInstantly(_ queue: String, _ channel: AMQPChannel, _ replies: AMQPChannel, _ tasks: TaskCheck) async throws -> Int32 {
    let feed = BatchQueue<AMQPDelivery>()
    _ = try await channel.consume(queue: queue, deliver: { feed.yield($0) }, finished: { _ in feed.finish() })
    // Each window's tasks are acked where its confirms arrive (the
    // connection thread), in publish order; the first failure stops answering
    // and the agent exits with it.
    let settler = WindowSettler { feed.finish() }
    while let batch = await feed.next() {
        var messages: [OutboundMessage] = [], answered: [AMQPDelivery] = []
        for delivery in batch {
            guard let task = try tasks.accept(delivery) else { continue }
            let body = JSONWriter.object { json in
                json.field("attempt", task.attempt)
                json.field("dispatchId", task.dispatchId)
                json.field("kind", "final")
                json.field("text", draft(for: task).joined(separator: "\n"))
            }
            messages.append(OutboundMessage(
                exchange: "", routingKey: delivery.properties.replyTo ?? "frontdesk.replies", body: body,
                properties: .persistentJSON(correlationID: task.dispatchId)))
            answered.append(delivery)
        }
        try await settler.publish(messages, on: replies, acks: answered)
    }
    try await settler.settled()
    return 0
}

/// Connects as an agent of `target`: its task queue (declared, so an agent may
/// start before the sender), a consuming channel with `prefetch`, and a
/// confirming channel for replies.
func serve(
    _ target: String, _ args: Arguments, prefetch: UInt16, name: String
) async throws -> (queue: String, tasks: AMQPChannel, replies: AMQPChannel, executor: ConnectionTaskExecutor) {
    let queue = "frontdesk.agent." + target.replacingOccurrences(of: "/", with: ".")
    let connection = try await connect(args, name: "\(name) \(target)")
    let channel = try await connection.openChannel()
    try await channel.queueDeclare(queue, arguments: ["x-queue-type": "quorum"])
    try await channel.qos(prefetchCount: prefetch)
    let replies = try await connection.openChannel()
    try await replies.confirmSelect()
    FileHandle.standardError.write(Data("frontdesk \(name): serving \(queue)\n".utf8))
    return (queue, channel, replies, connection.executor)
}
