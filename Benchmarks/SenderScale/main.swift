// sender-scale: parks N dispatches (default 100,000) for a target without
// agents, sampling frontdesk-sender's RSS as they park, then starts an
// instant agent and times the drain to `replied`. Prints figures; asserts
// nothing. Run from the repository with the local broker:
//
//   .build/release/sender-scale [--dispatches N]
import AMQP
import BenchmarkSupport
import Foundation
import FrontDeskModel


let total = Int(argument("--dispatches", "100000"))!
let bin = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
var url = try AMQPURL(parsing: ProcessInfo.processInfo.environment["AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5682/%2f")

func rssMiB(_ pid: Int32) -> Double { ProcStats.rssMiB(pid) ?? 0 }

let vhost = "frontdesk-scale-\(UUID().uuidString.prefix(6).lowercased())"
try brokerCtl(["add_vhost", vhost])
try brokerCtl(["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"])
defer { try? brokerCtl(["delete_vhost", vhost]) }
url.vhost = vhost

var environment = ProcessInfo.processInfo.environment
environment["AMQP_URL"] = "amqp://\(url.user):\(url.password)@\(url.host):\(url.port)/\(vhost)"
environment["FRONTDESK_HTTP_PORT"] = "0"
environment["FRONTDESK_LOG_LEVEL"] = "error"
let sender = Process()
sender.executableURL = bin.appendingPathComponent("frontdesk-sender")
sender.environment = environment
sender.standardOutput = FileHandle.nullDevice
sender.standardError = FileHandle.nullDevice
try Children.run(sender)
defer { sender.terminate() }

let connection = try await AMQPConnection.connect(.init(url: url, connectionName: "sender-scale"))
let channel = try await connection.openChannel()
try await channel.confirmSelect()
let park = "frontdesk.sender.park.yemaya.board-prep"
while (try? await connection.withChannel({ try await $0.queueDeclare(park, passive: true) })) == nil {
    try await Task.sleep(for: .milliseconds(100))
}
try await channel.queueDeclare("scale.replied", arguments: ["x-queue-type": "quorum"])
try await channel.queueBind("scale.replied", exchange: "frontdesk.status", routingKey: "status.*.*.replied")
try await Task.sleep(for: .seconds(1))
let table = try RoutingTable.example()
let parts = table.eventParts(.init(project: "yemaya", target: "board-prep"))!
let baselineRSS = rssMiB(sender.processIdentifier)
print("sender-scale: \(total) dispatches parked for yemaya/board-prep (no agent), then drained by one instant agent")
print(String(format: "  sender RSS, idle and leading:     %7.1f MiB", baselineRSS))

let start = ContinuousClock.now
var published = 0
var nextSample = total / 5
while published < total {
    let now = Date()
    let batch = (published..<min(total, published + 1000)).map { i -> OutboundMessage in
        let record = DispatchRecord(
            id: "scale-\(i)", bodyFingerprint: "x", outcome: .routed, input: "Reply to Lisa about the AGM agenda (\(i))",
            project: parts.project, target: parts.target, route: .init(confidence: 1, reason: "scale", alternatives: []),
            invalid: false, startedAt: RFC3339.format(now), decidedAt: RFC3339.format(now),
            expiresAt: RFC3339.format(now.addingTimeInterval(3600)), lastSeq: 2)
        return OutboundMessage(
            exchange: "", routingKey: "frontdesk.sender.inbox", body: record.jsonData(),
            properties: {
                // As the router writes it: the sender takes hand-offs only with a service's user_id.
                var p = AMQPProperties.persistentJSON(messageID: "\(record.id)/handoff", correlationID: record.id, type: DispatchRecord.handoffType)
                p.userID = url.user
                return p
            }())
    }
    for r in try await channel.publish(batch) { try r.get() }
    published += batch.count
    if published >= nextSample {
        var parked: UInt32 = 0
        while parked < UInt32(published) {
            parked = try await connection.withChannel { try await $0.queueDeclare(park, passive: true).messageCount }
            if parked < UInt32(published) { try await Task.sleep(for: .milliseconds(200)) }
        }
        print(String(format: "  %6d parked after %6.1f s:        %7.1f MiB", published, (ContinuousClock.now - start).seconds, rssMiB(sender.processIdentifier)))
        nextSample += total / 5
    }
}
let parkRate = Double(total) / (ContinuousClock.now - start).seconds

// An instant agent: a final reply for every task, at once.
let agentConnection = try await AMQPConnection.connect(.init(url: url, connectionName: "sender-scale:agent"))
let agentChannel = try await agentConnection.openChannel()
try await agentChannel.qos(prefetchCount: 500)
// Replies go without waiting for confirms: the agent must not be the bottleneck.
let replies = try await agentConnection.openChannel()
let tasks = try await agentChannel.consume(queue: "frontdesk.agent.yemaya.board-prep")
let agent = Task {
    do {
        for try await task in tasks {
            guard let t = try? JSONDecoder().decode(AgentTask.self, from: task.body) else { continue }
            let body = try JSONSerialization.data(withJSONObject: ["dispatchId": t.dispatchId, "attempt": t.attempt, "kind": "final", "text": "done"])
            _ = try await replies.publish([OutboundMessage(exchange: "", routingKey: "frontdesk.replies", body: body, properties: .persistentJSON(correlationID: t.dispatchId))])
            try task.ack()
        }
    } catch {}
}
let drainStart = ContinuousClock.now
var peakRSS = 0.0
while true {
    let done = try await connection.withChannel { try await $0.queueDeclare("scale.replied", passive: true).messageCount }
    peakRSS = max(peakRSS, rssMiB(sender.processIdentifier))
    if done >= UInt32(total) { break }
    try await Task.sleep(for: .milliseconds(250))
}
let drain = (ContinuousClock.now - drainStart).seconds
agent.cancel()
print(String(format: "  parking rate:                      %7.0f dispatches/s", parkRate))
print(String(format: "  drain to replied with one agent:   %7.0f dispatches/s (%.1f s), sender peak RSS %.1f MiB", Double(total) / drain, drain, peakRSS))
await agentConnection.close()
await connection.close()
