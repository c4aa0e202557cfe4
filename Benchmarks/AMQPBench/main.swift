// amqp-bench: publish-with-confirm + consume through the Swift AMQP layer,
// against amqp-c-baseline (a plain C loop on rabbitmq-c) doing the same in
// the same run. Prints figures and the ratio; asserts nothing about speed.
//
// Then one pipeline stage at a paced rate (`--echo-rate`, default 166/s):
// a process that consumes each message, publishes it on (persistent,
// confirmed) and acks it once confirmed, on one connection with two channels
// (deliveries handled and acked on the connection's thread), against the same
// stage in C (`amqp-c-baseline --echo`). Each message meets idle threads, as
// a service's do at moderate rates; the figure is the stage process's CPU
// (user + system, from its CPU clock) per message. A floor: the services add
// their reconnecting client, batch queues and a hop to the task pool.
//
//   amqp-bench [--url URL] [--messages N] [--body-bytes B] [--runs R]
//              [--echo-rate R] [--echo-messages N] [--echo-only]
//   amqp-bench --echo-serve FROM TO [--url URL]    (the Swift stage)
import AMQP
import BenchmarkSupport
import Foundation
import Synchronization

struct Figures: Decodable {
    var messages_per_s: Double
    var confirm_p50_ms: Double
    var confirm_p99_ms: Double
}


/// A whole-number or decimal option within `range`, or exit 2 with why.
func option<T: LosslessStringConvertible & Comparable>(_ name: String, _ fallback: T, _ range: ClosedRange<T>) -> T {
    let text = argument(name, "\(fallback)")
    guard let value = T(text), range.contains(value) else {
        FileHandle.standardError.write(Data("amqp-bench: \(name) \(text): want \(range.lowerBound)...\(range.upperBound)\n".utf8))
        exit(2)
    }
    return value
}

let urlText = argument("--url", ProcessInfo.processInfo.environment["AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5682/%2f")
let url = try AMQPURL(parsing: urlText)
let messages = option("--messages", 20000, 1...10_000_000)
let bodyBytes = option("--body-bytes", 512, 0...1_048_576)
let runs = option("--runs", 3, 1...100)

let echoRate = option("--echo-rate", 166.0, 1...100_000)
let echoMessages = option("--echo-messages", 2000, 1...10_000_000)
let echoOnly = CommandLine.arguments.contains("--echo-only")
/// What the driver and the Swift stage publish (the C stage sets the same).
let echoProperties = AMQPProperties(contentType: "application/json", deliveryMode: 2)

/// The Swift stage: consume FROM (prefetch 2); each delivery is published to
/// TO from the connection thread it arrived on and acked there when
/// confirmed. Ends when the consumer does, or stdin closes (the driver is
/// gone); a publish that failed ends it with 1.
func echoServe(from: String, to: String) async throws -> Never {
    Thread.detachNewThread {
        _ = FileHandle.standardInput.readDataToEndOfFile()
        exit(0)
    }
    let connection = try await AMQPConnection.connect(.init(url: url, connectionName: "amqp-bench:echo"))
    let input = try await connection.openChannel()
    let output = try await connection.openChannel()
    try await output.confirmSelect()
    try await input.qos(prefetchCount: 2)
    let (ended, end) = AsyncStream<Void>.makeStream()
    _ = try await input.consume(queue: from, deliver: { delivery in
        output.publishWithoutWaiting([OutboundMessage(exchange: "", routingKey: to, body: delivery.body, properties: echoProperties)]) { result in
            guard case .success(let results) = result, results.allSatisfy({ (try? $0.get()) != nil }) else {
                FileHandle.standardError.write(Data("amqp-bench --echo-serve: a publish was not confirmed: \(result)\n".utf8))
                exit(1)
            }
            do { try delivery.ack() } catch {
                FileHandle.standardError.write(Data("amqp-bench --echo-serve: ack: \(error)\n".utf8))
                exit(1)
            }
        }
    }, finished: { _ in end.finish() })
    for await _ in ended {}
    exit(0)
}

if let i = CommandLine.arguments.firstIndex(of: "--echo-serve") {
    guard i + 2 < CommandLine.arguments.count else {
        FileHandle.standardError.write(Data("usage: amqp-bench --echo-serve FROM TO [--url URL]\n".utf8))
        exit(2)
    }
    try await echoServe(from: CommandLine.arguments[i + 1], to: CommandLine.arguments[i + 2])
}

/// One stage process (`command`) between two fresh quorum queues: `echoMessages`
/// published into it at `echoRate`, one at a time (each confirmed before the
/// next). Returns its CPU-ms a message and the rate achieved. The stage ends
/// with the driver (its stdin closes) or is killed; the queues go either way.
func echoRun(_ command: [String]) async throws -> (cpuMs: Double, rate: Double) {
    let tag = UUID().uuidString.prefix(8)
    let from = "frontdesk.bench.echo-in.\(tag)", to = "frontdesk.bench.echo-out.\(tag)"
    let connection = try await AMQPConnection.connect(.init(url: url, connectionName: "amqp-bench:echo-driver"))
    let channel = try await connection.openChannel()
    func cleanUp() async {
        for queue in [from, to] { _ = try? await channel.queueDelete(queue) }
        await connection.close()
    }
    let stage = Process()
    var started = false
    /// SIGKILL: a child spawned from a Dispatch thread inherits its blocked
    /// signal mask, so a SIGTERM could wait forever. Once, and only while it
    /// runs: the pid of a stage that ended by itself (and was reaped) may be reused.
    func stopStage() {
        guard started else { return }
        started = false
        if stage.isRunning { kill(stage.processIdentifier, SIGKILL) }
        stage.waitUntilExit()
    }
    do {
        // x-expires: if the driver is killed, the queues go ten minutes after their stage.
        for queue in [from, to] { try await channel.queueDeclare(queue, arguments: ["x-queue-type": "quorum", "x-expires": .int32(600_000)]) }
        try await channel.confirmSelect()
        let received = Mutex(0)
        let watch = try await connection.openChannel()
        _ = try await watch.consume(queue: to, noAck: true, deliver: { _ in received.withLock { $0 += 1 } }, finished: { _ in })
        stage.executableURL = URL(fileURLWithPath: command[0])
        stage.arguments = Array(command.dropFirst()) + [from, to]
        let stdin = Pipe()
        stage.standardInput = stdin
        try Children.run(stage)
        started = true
        let body = Data(repeating: UInt8(ascii: "x"), count: bodyBytes)
        let message = OutboundMessage(exchange: "", routingKey: from, body: body, properties: echoProperties)
        func waitFor(_ count: Int) async throws {
            let deadline = ContinuousClock.now + .seconds(60)
            while received.withLock({ $0 }) < count {
                guard stage.isRunning else { throw AMQPError(.library, "\(command[0]) exited \(stage.terminationStatus)") }
                guard ContinuousClock.now < deadline else { throw AMQPError(.library, "the stage passed on \(received.withLock { $0 }) of \(count)") }
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        // Warm: the stage is consuming once the first 50 came through.
        for _ in 0..<50 { try await channel.publish(message) }
        try await waitFor(50)
        guard let cpuStart = ProcStats.cpuClockSeconds(stage.processIdentifier) else { throw AMQPError(.library, "no CPU clock for the stage") }
        let start = ContinuousClock.now
        for i in 0..<echoMessages {
            try await Task.sleep(until: start + .seconds(Double(i) / echoRate), clock: .continuous)
            try await channel.publish(message)
        }
        let published = ContinuousClock.now
        try await waitFor(50 + echoMessages)
        guard let cpuEnd = ProcStats.cpuClockSeconds(stage.processIdentifier) else { throw AMQPError(.library, "no CPU clock for the stage") }
        stopStage()
        // Every message acked once it was passed on (none returned to the
        // queue when the stage died), and none passed on twice.
        let left = try await channel.queueDelete(from)
        let passed = received.withLock { $0 }
        guard left == 0, passed == 50 + echoMessages else {
            throw AMQPError(.library, "the stage left \(left) unacked and passed on \(passed) of \(50 + echoMessages)")
        }
        await cleanUp()
        return ((cpuEnd - cpuStart) * 1000 / Double(echoMessages), Double(echoMessages) / max((published - start).seconds, 1e-9))
    } catch {
        stopStage()
        await cleanUp()
        throw error
    }
}

func percentile(_ sorted: [Double], _ p: Double) -> Double { sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }

func swiftRun(window: Int) async throws -> Figures {
    let queue = "frontdesk.bench.swift.\(UUID().uuidString.prefix(8))"
    let publisher = try await AMQPConnection.connect(.init(url: url, connectionName: "amqp-bench:publisher"))
    let subscriber = try await AMQPConnection.connect(.init(url: url, connectionName: "amqp-bench:consumer"))
    let pub = try await publisher.openChannel()
    try await pub.queueDeclare(queue, arguments: ["x-queue-type": "quorum"])
    try await pub.confirmSelect()
    let sub = try await subscriber.openChannel()
    try await sub.qos(prefetchCount: UInt16(2 * window))
    let consumer = try await sub.consume(queue: queue)
    let start = ContinuousClock.now
    let consumed = Task { () throws -> ContinuousClock.Instant in
        var received = 0
        for try await delivery in consumer {
            try delivery.ack()
            received += 1
            if received == messages { break }
        }
        return ContinuousClock.now
    }
    let body = Data(repeating: UInt8(ascii: "x"), count: bodyBytes)
    let message = OutboundMessage(exchange: "", routingKey: queue, body: body, properties: AMQPProperties(contentType: "application/json", deliveryMode: 2))
    var latencies: [Double] = []
    var sent = 0
    while sent < messages {
        let count = min(window, messages - sent)
        let t0 = ContinuousClock.now
        for result in try await pub.publish(Array(repeating: message, count: count)) { try result.get() }
        latencies.append((ContinuousClock.now - t0).seconds * 1000)
        sent += count
    }
    let done = try await consumed.value
    let seconds = (done - start).seconds
    try await pub.queueDelete(queue)
    await publisher.close()
    await subscriber.close()
    latencies.sort()
    return Figures(messages_per_s: Double(messages) / seconds, confirm_p50_ms: percentile(latencies, 0.5), confirm_p99_ms: percentile(latencies, 0.99))
}

func cRun(window: Int) throws -> Figures {
    let exe = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("amqp-c-baseline")
    let p = Process()
    p.executableURL = exe
    p.arguments = [url.host, "\(url.port)", url.user, url.password, "\(messages)", "\(window)", "\(bodyBytes)"]
    let out = Pipe()
    p.standardOutput = out
    try Children.run(p)
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    guard p.terminationStatus == 0 else { throw AMQPError(.library, "amqp-c-baseline exited \(p.terminationStatus)") }
    return try JSONDecoder().decode(Figures.self, from: data)
}

func median(_ xs: [Double]) -> Double { xs.sorted()[xs.count / 2] }

print("amqp-bench: \(messages) persistent \(bodyBytes)-byte messages to a quorum queue, publisher confirms, consumer acks each; median of \(runs) runs, C and Swift interleaved")
print("")
func column(_ text: String, _ width: Int) -> String { text.count >= width ? text : String(repeating: " ", count: width - text.count) + text }
print("window  client       msgs/s  confirm p50  confirm p99")
for window in echoOnly ? [] : [1, 10, 100] {
    var c: [Figures] = [], s: [Figures] = []
    for _ in 0..<runs {
        c.append(try cRun(window: window))
        s.append(try await swiftRun(window: window))
    }
    let cRate = median(c.map(\.messages_per_s)), sRate = median(s.map(\.messages_per_s))
    for (name, f) in [("C", c), ("Swift", s)] {
        print(column("\(window)", 6) + "  " + name.padding(toLength: 6, withPad: " ", startingAt: 0)
              + column(String(format: "%.0f", median(f.map(\.messages_per_s))), 12)
              + column(String(format: "%.3f ms", median(f.map(\.confirm_p50_ms))), 13)
              + column(String(format: "%.3f ms", median(f.map(\.confirm_p99_ms))), 13))
    }
    print(column("\(window)", 6) + "  Swift/C throughput ratio = " + String(format: "%.2f", sRate / cRate) + " (target ≥ 0.90)")
}

print("")
guard !url.tls else {
    FileHandle.standardError.write(Data("amqp-bench: the C stage has no TLS: give an amqp:// URL\n".utf8))
    exit(2)
}
print("one stage (consume, publish on confirmed, ack; one connection, two channels) at \(Int(echoRate))/s, one message at a time, "
      + "\(echoMessages) messages: the stage's CPU-ms a message; median of \(runs) runs, C and Swift interleaved")
let here = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
let baseline = URL(fileURLWithPath: here).deletingLastPathComponent().appendingPathComponent("amqp-c-baseline").path
var cEcho: [(cpuMs: Double, rate: Double)] = [], sEcho: [(cpuMs: Double, rate: Double)] = []
for _ in 0..<runs {
    cEcho.append(try await echoRun([baseline, "--echo", url.host, "\(url.port)", url.user, url.password, url.vhost]))
    sEcho.append(try await echoRun([here, "--url", urlText, "--echo-serve"]))
}
for (name, xs) in [("C", cEcho), ("Swift", sEcho)] {
    print("  " + name.padding(toLength: 6, withPad: " ", startingAt: 0) + String(format: "  %.4f CPU-ms a message", median(xs.map(\.cpuMs)))
          + "  (runs: " + xs.map { String(format: "%.4f at %.0f/s", $0.cpuMs, $0.rate) }.joined(separator: ", ") + ")")
}
print(String(format: "  Swift/C CPU a message = %.2f", median(sEcho.map(\.cpuMs)) / median(cEcho.map(\.cpuMs))))
