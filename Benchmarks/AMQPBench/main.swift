// amqp-bench: publish-with-confirm + consume through the Swift AMQP layer,
// against amqp-c-baseline (a plain C loop on rabbitmq-c) doing the same in
// the same run. Prints figures and the ratio; asserts nothing about speed.
//
//   amqp-bench [--url URL] [--messages N] [--body-bytes B] [--runs R]
import AMQP
import BenchmarkSupport
import Foundation

struct Figures: Decodable {
    var messages_per_s: Double
    var confirm_p50_ms: Double
    var confirm_p99_ms: Double
}


let url = try AMQPURL(parsing: argument("--url", ProcessInfo.processInfo.environment["AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5682/%2f"))
let messages = Int(argument("--messages", "20000"))!
let bodyBytes = Int(argument("--body-bytes", "512"))!
let runs = Int(argument("--runs", "3"))!

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
    try p.run()
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
for window in [1, 10, 100] {
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
