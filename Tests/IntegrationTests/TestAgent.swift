import AMQP
import Foundation

/// A reference agent for tests: consumes its target's queue and answers each
/// task with two progress replies and a final one (or an error).
final class TestAgent: Sendable {
    let connection: AMQPConnection
    let consumer: AMQPConsumer
    let worker: Task<Void, Never>
    let tasks = CollectedElements<AMQPDelivery>()

    enum Behaviour: Sendable { case reply, retryableError, fatalError, silent, acceptThenSilent, failFirstAttempt, slowStream, oversizedFinal }

    /// `declaring`: the arguments the agent declares its queue with, or nil
    /// to consume the queue as it is.
    init(url: AMQPURL, queue: String, behaviour: Behaviour = .reply, declaring arguments: FieldTable? = ["x-queue-type": "quorum"]) async throws {
        connection = try await AMQPConnection.connect(.init(url: url, connectionName: "test-agent:\(queue)"))
        let channel = try await connection.openChannel()
        if let arguments { try await channel.queueDeclare(queue, arguments: arguments) }
        try await channel.qos(prefetchCount: 10)
        let publisher = try await connection.openChannel()
        consumer = try await channel.consume(queue: queue)
        let consumer = consumer, tasks = tasks
        worker = Task {
            do {
                for try await task in consumer {
                    _ = await tasks.append(task)
                    guard let body = try? JSONSerialization.jsonObject(with: task.body) as? [String: Any],
                        let id = body["dispatchId"] as? String, let attempt = body["attempt"] as? Int
                    else { continue }
                    func reply(_ fields: [String: Any]) async throws {
                        var all = fields
                        all["dispatchId"] = id
                        all["attempt"] = attempt
                        try await publisher.publish(
                            exchange: "", routingKey: task.properties.replyTo ?? "frontdesk.replies",
                            body: try JSONSerialization.data(withJSONObject: all),
                            properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: id))
                    }
                    switch behaviour == .failFirstAttempt ? (attempt == 1 ? .retryableError : .reply) : behaviour {
                    case .reply, .failFirstAttempt:
                        try await reply(["kind": "accepted", "activity": "Reading"])
                        try await reply(["kind": "progress", "text": "Hi Lisa, confirmed for 14:00 on Thursday.\nThe agenda", "activity": "Drafting reply", "etaMs": 2000])
                        try await reply(["kind": "final", "text": "Hi Lisa, confirmed for 14:00 on Thursday.\nThe agenda is attached."])
                    case .retryableError:
                        try await reply(["kind": "error", "error": ["code": "busy", "message": "try later"], "retryable": true])
                    case .fatalError:
                        try await reply(["kind": "error", "error": ["code": "bad_input", "message": "cannot do that"], "retryable": false])
                    case .silent:
                        break
                    case .acceptThenSilent:
                        try await reply(["kind": "accepted", "activity": "Reading"])
                    case .slowStream:
                        var text = ""
                        for step in 1...5 {
                            text += "line \(step)\n"
                            try await reply(["kind": "progress", "text": text, "activity": "Writing", "etaMs": (5 - step) * 300])
                            try await Task.sleep(for: .milliseconds(300))
                        }
                        try await reply(["kind": "final", "text": text + "done"])
                    case .oversizedFinal:  // past the 256 KiB a reply may have
                        try await reply(["kind": "accepted", "activity": "Writing at length"])
                        try await reply(["kind": "final", "text": String(repeating: "All work and no play. ", count: 14_000)])
                    }
                    try task.ack()
                }
            } catch {}
        }
    }

    func stop() async {
        try? await consumer.cancel()
        worker.cancel()
        await connection.close()
    }
}
