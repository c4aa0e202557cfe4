import AMQP
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization
import Testing

/// A vhost of its own, a routing table, router processes started from the
/// built executable, and a queue bound to every status event.
final class RouterHarness: @unchecked Sendable {
    // @unchecked: the connection and channel are touched only by the test's
    // own task; the processes and their ports are behind a lock (a test may
    // start services concurrently).
    let vhost: String
    let url: AMQPURL
    let tableFile: String
    private let started = Mutex<(processes: [Process], ports: [Int32: Int])>(([], [:]))
    /// Every process a test starts, killed by stop().
    var processes: [Process] {
        get { started.withLock { $0.processes } }
        set { started.withLock { $0.processes = newValue } }
    }
    /// The probe port of each service process started.
    var ports: [Int32: Int] { started.withLock { $0.ports } }
    var connection: AMQPConnection
    var channel: AMQPChannel
    let statusQueue: String
    /// Every status event that reached `statusQueue`, in arrival order, with
    /// when it arrived; `events(until:)` reads past a cursor.
    let statusEvents = Arrivals()
    private var statusCursor = 0

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
        try await collectStatus()
    }

    /// Consumes the status queue for the whole test, on a connection of its own.
    private func collectStatus() async throws {
        let c = try await AMQPConnection.connect(.init(url: url, connectionName: "router-test:status"))
        statusConnection = c
        // Acked once noted: an event the broker had sent when it went away comes again.
        let consumer = try await c.openChannel().consume(queue: statusQueue)
        let arrivals = statusEvents
        _ = Task {
            do {
                for try await d in consumer {
                    arrivals.append(d)
                    try? d.ack()
                }
            } catch {}
        }
    }

    private var statusConnection: AMQPConnection?

    /// Waits until `done` holds for the status deliveries that arrived since
    /// the last call, then returns those and moves past them. At the deadline
    /// the test fails with `what`, and gets what arrived.
    func statusDeliveries(
        _ what: String = "the expected events", within: Duration = .seconds(20),
        until done: ([AMQPDelivery]) -> Bool
    ) async throws -> [AMQPDelivery] {
        let deadline = ContinuousClock.now + within
        while true {
            let (arrived, end) = statusEvents.since(statusCursor)
            let deliveries = arrived.map(\.delivery)
            if done(deliveries) {
                statusCursor = end
                return deliveries
            }
            if ContinuousClock.now >= deadline {
                statusCursor = end
                let seen = deliveries.map { "\($0.properties.messageID ?? "?")@\($0.routingKey)" }
                Issue.record("timed out after \(within) waiting for \(what); got \(seen)\(serviceLogTail())")
                return deliveries
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// As `statusDeliveries`, decoded.
    func events(
        _ what: String = "the expected events", within: Duration = .seconds(20),
        until done: ([[String: Any]]) -> Bool
    ) async throws -> [[String: Any]] {
        try await statusDeliveries(what, within: within) { done(Self.decode($0)) }.map { Self.decode([$0]).first ?? [:] }
    }

    static func decode(_ deliveries: [AMQPDelivery]) -> [[String: Any]] {
        deliveries.compactMap { (try? JSONSerialization.jsonObject(with: $0.body)) as? [String: Any] }
    }

    /// Waits until each of `ids` has a terminal event.
    func events(untilEnded first: String, _ rest: String...) async throws -> [[String: Any]] {
        let ids = [first] + rest
        return try await events("\(ids) to end") { events in
            ids.allSatisfy { id in events.contains { $0["dispatchId"] as? String == id && Self.terminal.contains($0["state"] as? String ?? "") } }
        }
    }

    /// Waits until `id` has an event in `state`.
    func events(until id: String, reaches state: String, within: Duration = .seconds(20)) async throws -> [[String: Any]] {
        try await events("\(id) to reach \(state)", within: within) { events in
            events.contains { $0["dispatchId"] as? String == id && $0["state"] as? String == state }
        }
    }

    /// When the first event of `id` in `state` arrived, among all so far.
    func arrival(of id: String, _ state: String) -> ContinuousClock.Instant? {
        statusEvents.since(0).0.first { a in
            guard let e = Self.decode([a.delivery]).first else { return false }
            return e["dispatchId"] as? String == id && e["state"] as? String == state
        }?.at
    }

    static let terminal: Set<String> = ["replied", "failed", "cancelled"]

    /// What a surface shows of one dispatch's `events` (in arrival order),
    /// as the contract has it: an event whose seq is not above the last one
    /// shown is dropped. `strays` are the dropped ones that were not an exact
    /// repeat of an event already seen (at least once allows only those).
    static func shown(_ events: [[String: Any]]) -> (shown: [[String: Any]], strays: [[String: Any]]) {
        var shown: [[String: Any]] = [], strays: [[String: Any]] = []
        var seen: [Int: NSDictionary] = [:]
        for e in events {
            guard let seq = e["seq"] as? Int else { strays.append(e); continue }
            if let last = shown.last?["seq"] as? Int, seq <= last {
                if seen[seq]?.isEqual(to: e) != true { strays.append(e) }
                continue
            }
            seen[seq] = e as NSDictionary
            shown.append(e)
        }
        return (shown, strays)
    }

    /// Waits until a condition holds, or fails the test with `what` (and
    /// the tail of this test's service logs) at the deadline.
    func waitUntil(
        _ what: String, within: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation,
        _ condition: () async throws -> Bool
    ) async throws {
        try await IntegrationTests.waitUntil(
            what, within: within, sourceLocation: sourceLocation, explain: {
                // The logs first: gdb holds each service still for a moment.
                let logs = serviceLogTail()
                return await serviceThreads() + logs
            }, condition)
    }

    static let gdb = "/usr/bin/gdb"
    /// Where `serviceThreads` saves the stacks (touched by the test's own task only).
    var threadDumpDirectory = ProcessInfo.processInfo.environment["FRONTDESK_TEST_LOG_DIR"]
    private var threadsDumped = false

    /// With FRONTDESK_TEST_LOG_DIR and gdb installed: every thread's stack
    /// of each service still running, beside its log
    /// (`<vhost>-<executable>-<port>.threads.txt`), for a wait that timed out
    /// on a service that stalled; says where they are.
    func serviceThreads() async -> String {
        // Once a test: a second timed-out wait would overwrite the first,
        // most telling, stacks, and each dump holds the test for seconds.
        guard let dir = threadDumpDirectory, !threadsDumped, FileManager.default.isExecutableFile(atPath: Self.gdb) else { return "" }
        threadsDumped = true
        var saved: [String] = []
        for p in processes where p.isRunning {
            let name = p.executableURL?.lastPathComponent ?? "service"
            let path = "\(dir)/\(vhost)-\(name)-\(ports[p.processIdentifier] ?? 0).threads.txt"
            guard FileManager.default.createFile(atPath: path, contents: nil), let out = FileHandle(forWritingAtPath: path) else { continue }
            let dump = Process()
            dump.executableURL = URL(fileURLWithPath: Self.gdb)
            dump.arguments = ["-p", "\(p.processIdentifier)", "-batch", "-ex", "thread apply all bt 40"]
            dump.standardOutput = out
            dump.standardError = out
            dump.standardInput = FileHandle.nullDevice
            // Awaited through its termination handler (no thread blocks), and
            // stopped after 20 s should gdb itself hang.
            let ended = AsyncStream<Void>.makeStream()
            dump.terminationHandler = { _ in ended.continuation.finish() }
            do { try dump.run() } catch { continue }
            let watchdog = Task {
                try await Task.sleep(for: .seconds(20))
                if dump.isRunning { dump.terminate() }
            }
            for await _ in ended.stream {}
            watchdog.cancel()
            try? out.close()
            saved.append(path)
        }
        return saved.isEmpty ? "" : "\n--- every thread's stack: " + saved.joined(separator: ", ")
    }

    /// With FRONTDESK_TEST_LOG_DIR (as CI runs): the last lines of this
    /// test's service logs, for a failure to say what the services did (CI
    /// shows the failing test's issues first, and only part of the rest).
    func serviceLogTail(lines: Int = 12) -> String {
        guard let dir = ProcessInfo.processInfo.environment["FRONTDESK_TEST_LOG_DIR"],
            let files = try? FileManager.default.contentsOfDirectory(atPath: dir)
        else { return "" }
        var tail = ""
        for file in files.sorted() where file.hasPrefix("\(vhost)-") && file.hasSuffix(".log") {
            guard let text = try? String(contentsOfFile: "\(dir)/\(file)", encoding: .utf8) else { continue }
            let last = text.split(separator: "\n").filter { !$0.contains(#""level":"debug""#) }.suffix(lines)
            tail += "\n--- \(file), last \(last.count) lines:\n" + last.map { String($0.prefix(400)) }.joined(separator: "\n")
        }
        return tail
    }

    /// The sender `p` says it leads (the gauge's own line: its HELP text
    /// contains "frontdesk_sender_leader 1" too).
    func isLeading(_ p: Process) async throws -> Bool {
        try await metrics(p).split(separator: "\n").contains("frontdesk_sender_leader 1")
    }

    /// The sender `p` (the one leading) has seen an agent on `route` ("project/target").
    func waitUntilSenderSeesAgents(_ p: Process, on route: String) async throws {
        try await waitUntil("the sender sees an agent on \(route)") {
            let lines = try await metrics(p).split(separator: "\n")
            return lines.contains("frontdesk_sender_leader 1") && lines.contains {
                $0.hasPrefix("frontdesk_sender_agents{target=\"\(route)\"}") && !$0.hasSuffix(" 0")
            }
        }
    }

    /// The sender `p` leads and consumes its queues.
    func waitUntilLeading(_ p: Process) async throws {
        try await waitUntil("the sender leads") {
            guard try await isLeading(p) else { return false }
            return try await consumers("frontdesk.replies") > 0
        }
    }

    func consumers(_ queue: String) async throws -> UInt32 {
        try await channel.queueDeclare(queue, passive: true).consumerCount
    }

    func messages(_ queue: String) async throws -> UInt32 {
        try await channel.queueDeclare(queue, passive: true).messageCount
    }

    /// The status of `path` on the probe port of `p` (0 when it does not answer).
    func probe(_ p: Process, _ path: String) async -> Int {
        guard let port = ports[p.processIdentifier] else { return 0 }
        return (try? await probe(port: port, path: path)) ?? 0
    }

    func metrics(_ p: Process) async throws -> String {
        guard let port = ports[p.processIdentifier] else { return "" }
        let (data, _) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)/metrics")!)
        return String(decoding: data, as: UTF8.self)
    }

    /// How many terms the sender `p` began (`frontdesk_sender_terms_total`).
    func terms(_ p: Process) async throws -> Int? {
        let line = try await metrics(p).split(separator: "\n").first { $0.hasPrefix("frontdesk_sender_terms_total ") }
        return line.flatMap { Double($0.split(separator: " ").last ?? "").map { Int($0) } }
    }

    /// A new connection after the broker went away.
    func reconnect() async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while true {
            do {
                connection = try await AMQPConnection.connect(.init(url: url, connectionName: "router-test:reconnected"))
                channel = try await connection.openChannel()
                try await channel.confirmSelect()
                await statusConnection?.close()
                try await collectStatus()
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

    func start(_ executable: String, extraEnvironment: [String: String], waitUntilReady: Bool = true) async throws -> Process {
        // A random probe port may be taken (a broker's distribution port is in
        // the range): a process that exits before it is ready is started
        // again on another port, and its exit is said.
        try await startRetrying(executable, waitUntilReady: waitUntilReady) { extraEnvironment }
    }

    /// Starts `executable` with the environment `environment` gives for this
    /// attempt (a port of its own, say), up to three times while it exits
    /// before it is ready.
    func startRetrying(
        _ executable: String, waitUntilReady: Bool = true, environment: () -> [String: String]
    ) async throws -> Process {
        for attempt in 1...3 {
            let (p, exited) = try await startOnce(executable, extraEnvironment: environment(), waitUntilReady: waitUntilReady)
            guard exited else { return p }
            FileHandle.standardError.write(Data(
                "harness: \(executable) exited with status \(p.terminationStatus) before it was ready (attempt \(attempt))\n".utf8))
        }
        throw AMQPError(.timeout, "\(executable) exited three times before it was ready")
    }

    private func startOnce(
        _ executable: String, extraEnvironment: [String: String], waitUntilReady: Bool
    ) async throws -> (Process, exited: Bool) {
        let p = Process()
        p.executableURL = Bundle.main.executableURL!.deletingLastPathComponent().appendingPathComponent(executable)
        let port = TestPorts.next()
        let outer = ProcessInfo.processInfo.environment
        var env = outer
        env["AMQP_URL"] = "amqp://guest:guest@\(url.host):\(url.port)/\(vhost)"
        env["FRONTDESK_ROUTES"] = tableFile
        env["FRONTDESK_HTTP_PORT"] = "\(port)"
        // With FRONTDESK_TEST_LOG_DIR: FRONTDESK_TEST_LOG_LEVEL, debug unless set.
        env["FRONTDESK_LOG_LEVEL"] = outer["FRONTDESK_TEST_LOG_DIR"] == nil ? "warning" : outer["FRONTDESK_TEST_LOG_LEVEL"] ?? "debug"
        for (k, v) in extraEnvironment { env[k] = v }
        p.environment = env
        // No inherited descriptors: a router that outlived its test must not
        // hold the test runner's output open.
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        // FRONTDESK_TEST_LOG_DIR keeps each service's log, for a failure to be read.
        if let dir = outer["FRONTDESK_TEST_LOG_DIR"] {
            let file = "\(dir)/\(vhost)-\(executable)-\(port).log"
            _ = FileManager.default.createFile(atPath: file, contents: nil)
            p.standardError = FileHandle(forWritingAtPath: file) ?? FileHandle.nullDevice
        }
        try p.run()
        started.withLock {
            $0.processes.append(p)
            $0.ports[p.processIdentifier] = port
        }
        if !waitUntilReady { return (p, false) }
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            if (try? await probe(port: port, path: "/readyz")) == 200 { return (p, false) }
            if !p.isRunning { return (p, true) }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw AMQPError(.timeout, "\(executable) did not become ready")
    }

    func probe(port: Int, path: String) async throws -> Int {
        let (_, response) = try await URLSession.shared.data(from: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        return (response as? HTTPURLResponse)?.statusCode ?? 0
    }

    func publish(_ routingKey: String, _ body: String, type: String? = nil, properties: AMQPProperties? = nil) async throws {
        try await channel.publish(
            exchange: "frontdesk.commands", routingKey: routingKey, body: Data(body.utf8),
            properties: properties ?? AMQPProperties(contentType: "application/json", deliveryMode: 2, type: type))
    }

    /// What a hostile or merely unusual producer sets: its own validated
    /// user id, CC and BCC naming the agents' replies queue, a TTL, a
    /// reply_to, a priority, a timestamp at the end of time.
    static let hostileProperties = AMQPProperties(
        contentType: "application/json",
        headers: ["CC": .array([.string("frontdesk.replies")]), "BCC": .array([.string("frontdesk.replies")]), "x-extra": "kept"],
        deliveryMode: 2, priority: 9, replyTo: "frontdesk.replies", expiration: "600000", timestamp: UInt64.max, userID: "guest",
        appID: "hostile")

    /// The messages of `queue`, taken off it, once there are `count` of them
    /// (the test fails at the deadline, with what there was).
    func drain(_ queue: String, count: Int, within: Duration = .seconds(20)) async throws -> [AMQPDelivery] {
        let c = try await connection.openChannel()
        let consumer = try await c.consume(queue: queue, noAck: true)
        let collected = CollectedElements<AMQPDelivery>()
        let reader = Task {
            for try await d in consumer { _ = await collected.append(d) }
        }
        try await waitUntil("\(count) messages on \(queue)", within: within) { await collected.all.count >= count }
        reader.cancel()
        await c.close()
        return await collected.all
    }

    func stop() async {
        for p in processes where p.isRunning { kill(p.processIdentifier, SIGKILL) }
        for p in processes { p.waitUntilExit() }
        await connection.close()
        await statusConnection?.close()
        try? Self.ctl(["delete_vhost", vhost])
        try? FileManager.default.removeItem(atPath: tableFile)
    }

    static func ctl(_ arguments: [String]) throws {
        try TestBroker.script(["ctl"] + arguments)
    }
}


/// Runs `body` with a fresh harness and always stops it: its routers are
/// killed and its vhost deleted, whether the body passed or threw.
/// Deliveries that arrive on a consumer's task, read by the test's task.
final class Arrivals: Sendable {
    struct Arrival: Sendable {
        let delivery: AMQPDelivery
        let at: ContinuousClock.Instant
    }

    private let state = Mutex<[Arrival]>([])

    func append(_ delivery: AMQPDelivery) { state.withLock { $0.append(Arrival(delivery: delivery, at: .now)) } }

    /// What arrived from index `start` on, and the index past it.
    func since(_ start: Int) -> ([Arrival], Int) {
        state.withLock { all in (Array(all[min(start, all.count)...]), all.count) }
    }
}

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

/// Ports for the services the tests start: random, below the ephemeral range
/// (32768 and up, where outgoing connections take theirs), and never the same
/// twice in one test run. (Two services of one test once drew the same port:
/// the second could not serve its probes, and the first's answered for it.)
/// A port some other process listens on now (a leftover broker node's
/// distribution port, say) is passed over; one taken between this check and
/// the service's bind is why `startRetrying` draws again.
enum TestPorts {
    private static let given = Mutex<Set<Int>>([])

    static func next() -> Int {
        given.withLock { given in
            while true {
                let port = 20000 + Int.random(in: 0..<12000)
                if given.insert(port).inserted, isFree(port) { return port }
            }
        }
    }

    /// Whether a listening socket could be bound on every address at `port`.
    static func isFree(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return true }
        defer { close(fd) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = INADDR_ANY
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}
