// router-bench: frontdesk-router alone, from intake to hand-off, against
// router-c-relay (the same publishes and consumes as plain C) on the same
// broker in the same run. Both drain a backlog of N preloaded requests.
// Prints figures and the ratio; asserts nothing about speed.
//
//   router-bench [--requests N]   (run from the repository; needs the local broker)
import AMQP
import BenchmarkSupport
import Foundation


let requests = Int(argument("--requests", "5000"))!
let binDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
var base = try AMQPURL(parsing: ProcessInfo.processInfo.environment["AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5682/%2f")

@discardableResult
func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil, wait: Bool = true) throws -> (Process, String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    if let environment { p.environment = environment }
    let out = FileManager.default.temporaryDirectory.appendingPathComponent("router-bench-\(UUID().uuidString)")
    _ = FileManager.default.createFile(atPath: out.path, contents: nil)
    p.standardOutput = try FileHandle(forWritingTo: out)
    p.standardError = FileHandle.nullDevice
    try Children.run(p)
    guard wait else { return (p, "") }
    p.waitUntilExit()
    return (p, (try? String(contentsOf: out, encoding: .utf8)) ?? "")
}


let vhost = "frontdesk-bench-\(UUID().uuidString.prefix(6).lowercased())"
try brokerCtl(["add_vhost", vhost])
try brokerCtl(["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"])
defer { try? brokerCtl(["delete_vhost", vhost]) }
base.vhost = vhost

let connection = try await AMQPConnection.connect(.init(url: base, connectionName: "router-bench"))
let channel = try await connection.openChannel()
try await channel.confirmSelect()

func body(_ i: Int) -> Data {
    Data(#"{"id":"bench-\#(i)","input":"Reply to Lisa about the AGM agenda — short, confirm 14:00 (\#(i))","user":"u-42","threadId":"t-9"}"#.utf8)
}

func preload(exchange: String, routingKey: String) async throws {
    var sent = 0
    while sent < requests {
        let batch = (sent..<min(requests, sent + 500)).map {
            OutboundMessage(exchange: exchange, routingKey: routingKey, body: body($0), properties: .persistentJSON())
        }
        for r in try await channel.publish(batch) { try r.get() }
        sent += batch.count
    }
}

// --- The C relay.
try await channel.queueDeclare("bench.c.intake", arguments: ["x-queue-type": "quorum"])
try await channel.queueDeclare("bench.c.stream", arguments: ["x-queue-type": "stream"])
try await channel.queueDeclare("bench.c.out", arguments: ["x-queue-type": "quorum"])
try await preload(exchange: "", routingKey: "bench.c.intake")
let (_, cOutput) = try run(binDirectory.appendingPathComponent("router-c-relay").path, [
    base.host, "\(base.port)", base.user, base.password, vhost, "bench.c.intake", "bench.c.stream", "bench.c.out", "\(requests)",
])
struct CFigures: Decodable { var requests_per_s: Double }
let cRate = try JSONDecoder().decode(CFigures.self, from: Data(cOutput.utf8)).requests_per_s

// --- The router: declare its topology, stop it, preload, start it, time the drain.
var environment = ProcessInfo.processInfo.environment
environment["AMQP_URL"] = "amqp://\(base.user):\(base.password)@\(base.host):\(base.port)/\(vhost)"
environment["FRONTDESK_HTTP_PORT"] = "0"
environment["FRONTDESK_LOG_LEVEL"] = "error"
let routerPath = binDirectory.appendingPathComponent("frontdesk-router").path
let (first, _) = try run(routerPath, [], environment: environment, wait: false)
func inboxCount() async -> UInt32? {
    try? await connection.withChannel { try await $0.queueDeclare("frontdesk.sender.inbox", passive: true).messageCount }
}
while await inboxCount() == nil { try await Task.sleep(for: .milliseconds(50)) }
first.terminate()
first.waitUntilExit()
try await preload(exchange: "frontdesk.commands", routingKey: "dispatch.request")
// Timed from the first hand-off, as the C relay times from its first request.
let (router, _) = try run(routerPath, [], environment: environment, wait: false)
while (await inboxCount() ?? 0) == 0 { try await Task.sleep(for: .milliseconds(5)) }
let start = ContinuousClock.now
while (await inboxCount() ?? 0) < UInt32(requests) { try await Task.sleep(for: .milliseconds(20)) }
let elapsed = ContinuousClock.now - start
let routerCPU = ProcStats.cpuSeconds(router.processIdentifier) ?? .nan
router.terminate()
router.waitUntilExit()
let routerRate = Double(requests) / elapsed.seconds
await connection.close()

print("router-bench: \(requests) preloaded requests, intake → decision log → drafted + routing + hand-off, all confirmed")
print(String(format: "  raw C relay (same publishes and consumes) %9.0f requests/s", cRate))
print(String(format: "  frontdesk-router                           %9.0f requests/s", routerRate))
print(String(format: "  router CPU: %.2f s in all, %.3f ms a request", routerCPU, routerCPU * 1000 / Double(requests)))
print(String(format: "  ratio router / C relay = %.2f (target ≥ 0.80)", routerRate / cRate))
