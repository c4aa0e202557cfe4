import AMQP
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// A vhost of its own, a routing table, router processes started from the
/// built executable, and a queue bound to every status event.
final class RouterHarness: @unchecked Sendable {
    // @unchecked: the processes array is touched only by the test's own task.
    let vhost: String
    let url: AMQPURL
    let tableFile: String
    var processes: [Process] = []  // every process a test starts, killed by stop()
    var connection: AMQPConnection
    var channel: AMQPChannel
    let statusQueue: String

    static let table = """
    {"projects":[
      {"id":"yemaya","name":"Yemaya","accent":"#6E56CF","targets":[
        {"id":"board-prep","name":"Board Prep","keywords":["agm","agenda"],"contacts":["Lisa"]}]},
      {"id":"acme","name":"Acme Corp","targets":[{"id":"legal","name":"Legal","keywords":["contract"]}]}],
     "default":{"project":"yemaya","target":"board-prep"}}
    """

    init(_ name: String) async throws {
        vhost = "frontdesk-test-\(name)-\(UUID().uuidString.prefix(6).lowercased())"
        try Self.ctl(["add_vhost", vhost])
        try Self.ctl(["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"])
        var url = TestBroker.url
        url.vhost = vhost
        self.url = url
        tableFile = FileManager.default.temporaryDirectory.appendingPathComponent("routes-\(vhost).json").path
        try Self.table.write(toFile: tableFile, atomically: true, encoding: .utf8)
        connection = try await AMQPConnection.connect(.init(url: url, connectionName: "router-test:\(name)"))
        channel = try await connection.openChannel()
        statusQueue = "frontdesk.test.status"
        try await channel.exchangeDeclare("frontdesk.status", type: "topic")
        try await channel.queueDeclare(statusQueue, arguments: ["x-queue-type": "quorum"])
        try await channel.queueBind(statusQueue, exchange: "frontdesk.status", routingKey: "status.#")
        try await channel.confirmSelect()
    }

    /// A new connection after the broker went away.
    func reconnect() async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while true {
            do {
                connection = try await AMQPConnection.connect(.init(url: url, connectionName: "router-test:reconnected"))
                channel = try await connection.openChannel()
                try await channel.confirmSelect()
                return
            } catch where ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(200))
            }
        }
    }

    /// Starts a router replica and waits until it answers /readyz.
    @discardableResult
    func startRouter(extraEnvironment: [String: String] = [:]) async throws -> Process {
        try await start("frontdesk-router", extraEnvironment: extraEnvironment)
    }

    /// Starts a sender replica and waits until it answers /readyz.
    @discardableResult
    func startSender(extraEnvironment: [String: String] = [:]) async throws -> Process {
        try await start("frontdesk-sender", extraEnvironment: extraEnvironment)
    }

    func start(_ executable: String, extraEnvironment: [String: String]) async throws -> Process {
        let p = Process()
        p.executableURL = Bundle.main.executableURL!.deletingLastPathComponent().appendingPathComponent(executable)
        let port = 20000 + Int.random(in: 0..<20000)
        var env = ProcessInfo.processInfo.environment
        env["AMQP_URL"] = "amqp://guest:guest@\(url.host):\(url.port)/\(vhost)"
        env["FRONTDESK_ROUTES"] = tableFile
        env["FRONTDESK_HTTP_PORT"] = "\(port)"
        env["FRONTDESK_LOG_LEVEL"] = "warning"
        for (k, v) in extraEnvironment { env[k] = v }
        p.environment = env
        // No inherited descriptors: a router that outlived its test must not
        // hold the test runner's output open.
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        processes.append(p)
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            if (try? await probe(port: port, path: "/readyz")) == 200 { return p }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw AMQPError(.timeout, "\(executable) did not become ready")
    }

    func probe(port: Int, path: String) async throws -> Int {
        let (_, response) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        return (response as? HTTPURLResponse)?.statusCode ?? 0
    }

    func publish(_ routingKey: String, _ body: String, type: String? = nil) async throws {
        try await channel.publish(
            exchange: "frontdesk.commands", routingKey: routingKey, body: Data(body.utf8),
            properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, type: type))
    }

    /// Every message that reached `queue` until none came for `quiet`.
    func drain(_ queue: String, quiet: Duration = .milliseconds(800)) async throws -> [AMQPDelivery] {
        let c = try await connection.openChannel()
        let consumer = try await c.consume(queue: queue, noAck: true)
        let collected = CollectedElements<AMQPDelivery>()
        let reader = Task {
            for try await d in consumer { _ = await collected.append(d) }
        }
        var last = -1
        while true {
            try await Task.sleep(for: quiet)
            let count = await collected.all.count
            if count == last { break }
            last = count
        }
        reader.cancel()
        await c.close()
        return await collected.all
    }

    /// The status events that arrived until none came for `quiet`, decoded.
    func events(quiet: Duration = .milliseconds(800)) async throws -> [[String: Any]] {
        try await drain(statusQueue, quiet: quiet).map { try JSONSerialization.jsonObject(with: $0.body) as! [String: Any] }
    }

    func stop() async {
        for p in processes where p.isRunning { kill(p.processIdentifier, SIGKILL) }
        for p in processes { p.waitUntilExit() }
        await connection.close()
        try? Self.ctl(["delete_vhost", vhost])
        try? FileManager.default.removeItem(atPath: tableFile)
    }

    static func ctl(_ arguments: [String]) throws {
        try TestBroker.script(["ctl"] + arguments)
    }
}


/// Runs `body` with a fresh harness and always stops it: its routers are
/// killed and its vhost deleted, whether the body passed or threw.
func withHarness(_ name: String, _ body: (RouterHarness) async throws -> Void) async throws {
    let h = try await RouterHarness(name)
    do {
        try await body(h)
    } catch {
        await h.stop()
        throw error
    }
    await h.stop()
}
