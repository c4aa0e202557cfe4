// pipeline-bench: the whole pipeline — producer → frontdesk-router →
// frontdesk-sender → instant reference agents → replied — on the local
// broker, against pipeline-c-relay (the same publishes and consumes per
// dispatch in plain C) driven by the same producer and status subscriber in
// the same run. For each system: the maximum rate (requests published as fast
// as confirms allow), then offered rates at fractions of the pipeline's
// maximum. Prints dispatches/s, request → first event and request → replied
// latency (p50/p99/p99.9), CPU-ms per dispatch and peak RSS of each service
// (from /proc), and the ratio to the ceiling. Asserts nothing about speed.
//
//   pipeline-bench [--requests N] [--fractions 0.25,0.5,0.75] [--csv FILE]
//                  [--rates 166,700]    (fixed offered rates: instead of the fractions, or
//                                       besides them when --fractions is given too)
//                  [--swift-agents]     (the reference agent, `frontdesk agent --instant`, instead
//                                       of the relay's C agent loop: see below)
//                  [--pipeline-only]    (no C relay: for profiling the services)
//                  [--stages]           (per round: where the time went, all vs the slowest 2%)
//                  [--senders N --partitions P]  (N sender replicas sharing P partitions, one
//                                       instant agent for a target of each of 4 partitions)
//                  [--cluster]          (on the local 3-node cluster, scripts/cluster.sh:
//                                       every node in AMQP_URL, the three nodes' CPU as the broker's)
//   (run from the repository; needs the local broker and a release build)
import AMQP
import BenchmarkSupport
import Foundation
import Synchronization

let requests = Int(argument("--requests", "4000"))!
let fractions = argument("--fractions", "0.25,0.5,0.75").split(separator: ",").compactMap { Double($0) }
let fixedRates = argument("--rates", "").split(separator: ",").compactMap { Double($0) }
/// Both kinds of rate when both are asked for (e.g. a quarter and half of the maximum, and 166 and 700/s).
let fractionsAsked = CommandLine.arguments.contains("--fractions")
/// The pipeline's instant agents are C (pipeline-c-relay --agent), the same
/// loop as the relay's own agent: the agents are no part of what is compared,
/// and the reference agent in Swift costs the machine ~0.13 CPU-ms a dispatch.
let swiftAgents = CommandLine.arguments.contains("--swift-agents")
let pipelineOnly = CommandLine.arguments.contains("--pipeline-only")
let reportStages = CommandLine.arguments.contains("--stages")
let csvPath = argument("--csv", "")
let senderCount = max(1, Int(argument("--senders", "1")) ?? 1)
let partitionCount = max(1, Int(argument("--partitions", "1")) ?? 1)
let onCluster = CommandLine.arguments.contains("--cluster")
/// The targets dispatches go to: with partitions, one of each of the example table's first four partitions.
let benchTargets = partitionCount > 1 ? ["yemaya/board-prep", "acme/legal", "yemaya/fundraising", "home/family"] : ["yemaya/board-prep"]
let binDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
let clusterPorts = [5691, 5692, 5693]
let base = try AMQPURL(parsing: onCluster
    ? "amqp://guest:guest@127.0.0.1:\(clusterPorts[0])/%2f"
    : ProcessInfo.processInfo.environment["AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5682/%2f")

/// The services' AMQP_URL for `vhost`: on the cluster, every node.
func servicesURL(_ vhost: String) -> String {
    let ports = onCluster ? clusterPorts : [base.port]
    return ports.map { "amqp://\(base.user):\(base.password)@\(base.host):\($0)/\(vhost)" }.joined(separator: ",")
}

/// rabbitmqctl against the local broker, or node 1 of the local cluster.
func ctl(_ arguments: [String]) throws {
    if !onCluster { return try brokerCtl(arguments) }
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/bash")
    p.arguments = ["scripts/cluster.sh", "ctl", "1"] + arguments
    p.standardOutput = FileHandle.nullDevice
    p.standardError = FileHandle.nullDevice
    try p.run()
    p.waitUntilExit()
}
let routes = "Shared/FrontDeskModel/Resources/routes.example.json"

// MARK: - Processes

func start(_ name: String, _ arguments: [String], vhost: String, httpPort: Int = 0) throws -> Process {
    let p = Process()
    p.executableURL = binDirectory.appendingPathComponent(name)
    p.arguments = arguments
    var environment = ProcessInfo.processInfo.environment
    environment["AMQP_URL"] = servicesURL(vhost)
    environment["FRONTDESK_HTTP_PORT"] = "\(httpPort)"
    environment["FRONTDESK_SENDER_PARTITIONS"] = "\(partitionCount)"
    environment["FRONTDESK_LOG_LEVEL"] = ProcessInfo.processInfo.environment["FRONTDESK_BENCH_LOG_LEVEL"] ?? "error"
    environment["FRONTDESK_ROUTES"] = routes
    p.environment = environment
    p.standardOutput = FileHandle.nullDevice
    p.standardError = FileHandle.standardError
    try Children.run(p)  // the run's vhosts are left behind on an interrupt
    return p
}

func makeVhost(_ label: String) throws -> AMQPURL {
    let vhost = "frontdesk-pipeline-\(label)-\(UUID().uuidString.prefix(6).lowercased())"
    try ctl(["add_vhost", vhost])
    try ctl(["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"])
    var url = base
    url.vhost = vhost
    return url
}

// MARK: - Load and measurement

struct Round {
    var system: String
    var offered: Double?  // nil: as fast as confirms allow
    var throughput: Double
    var firstEvent: [Double]  // ms, sorted
    var replied: [Double]  // ms, sorted
    var failed: Int
    var cpuMsPerDispatch: [(String, Double)]
    /// The share of all cores busy during the round (every process on the machine).
    var machineBusy: Double
}

func percentile(_ sorted: [Double], _ p: Double) -> Double {
    sorted.isEmpty ? .nan : sorted[min(sorted.count - 1, Int((Double(sorted.count) * p).rounded(.up)) - 1)]
}

/// What the status subscriber saw, by request id.
final class Observations: Sendable {
    struct Seen {
        var firstEvent: [String: ContinuousClock.Instant] = [:]
        var ended: [String: (at: ContinuousClock.Instant, replied: Bool)] = [:]
        var endedByRound: [Substring: Int] = [:]
        var sending: [String: ContinuousClock.Instant] = [:]
    }
    /// When the first event, the first `sending` and the end of `id` were seen.
    func stages(of id: String) -> (first: ContinuousClock.Instant, sending: ContinuousClock.Instant, end: ContinuousClock.Instant)? {
        seen.withLock { seen in
            guard let f = seen.firstEvent[id], let s = seen.sending[id], let e = seen.ended[id]?.at else { return nil }
            return (f, s, e)
        }
    }
    private let seen = Mutex(Seen())

    func saw(_ id: String, state: Substring, at now: ContinuousClock.Instant) {
        seen.withLock { seen in
            if seen.firstEvent[id] == nil { seen.firstEvent[id] = now }
            if state == "sending", seen.sending[id] == nil { seen.sending[id] = now }
            guard state == "replied" || state == "failed" || state == "cancelled", seen.ended[id] == nil else { return }
            seen.ended[id] = (now, state == "replied")
            seen.endedByRound[id.prefix { $0 != "-" }, default: 0] += 1
        }
    }

    func endedCount(round: String) -> Int { seen.withLock { $0.endedByRound[Substring(round)] ?? 0 } }

    func results(for ids: [String]) -> [(first: ContinuousClock.Instant?, end: ContinuousClock.Instant?, replied: Bool)] {
        seen.withLock { seen in ids.map { (seen.firstEvent[$0], seen.ended[$0]?.at, seen.ended[$0]?.replied ?? false) } }
    }
}

func requestBody(_ id: String) -> Data {
    guard benchTargets.count > 1 else {
        return Data(#"{"id":"\#(id)","input":"Reply to Lisa about the AGM agenda — short, confirm 14:00","user":"u-42","threadId":"t-9"}"#.utf8)
    }
    // Round-robin over the targets, by the id's number.
    let n = Int(id.split(separator: "-").last ?? "") ?? 0
    let route = benchTargets[n % benchTargets.count].split(separator: "/")
    return Data(
        #"{"id":"\#(id)","input":"Reply to Lisa about the AGM agenda — short, confirm 14:00","user":"u-42","threadId":"t-9","project":"\#(route[0])","target":"\#(route[1])"}"#
            .utf8)
}

/// Publishes `ids` at `rate` per second (nil: back to back, 256 a window) and
/// returns each request's send time.
func offer(_ ids: [String], rate: Double?, on channel: AMQPChannel) async throws -> [ContinuousClock.Instant] {
    var sentAt: [ContinuousClock.Instant] = []
    let start = ContinuousClock.now
    var next = 0
    while next < ids.count {
        let due: Int
        if let rate {
            let elapsed = (ContinuousClock.now - start).seconds
            due = min(ids.count, Int(elapsed * rate) + 1)
            if due <= next {
                // Sleep until the next request is due (not a fixed poll: at
                // 166/s that cost the instrument more CPU than the relay).
                try await Task.sleep(until: start + .seconds(Double(next) / rate), clock: .continuous)
                continue
            }
        } else {
            due = min(ids.count, next + 256)
        }
        let window = ids[next..<due].map {
            OutboundMessage(
                exchange: "frontdesk.commands", routingKey: "dispatch.request", body: requestBody($0),
                properties: .persistentJSON(messageID: $0))
        }
        let now = ContinuousClock.now
        sentAt += Array(repeating: now, count: window.count)
        for result in try await channel.publish(window) { try result.get() }
        next = due
    }
    return sentAt
}

/// The local broker's process (scripts/broker.sh writes its pid file): its
/// CPU per dispatch shows what each system costs the broker.
let brokerDirectory = ProcessInfo.processInfo.environment["FRONTDESK_BROKER_DIR"] ?? "/var/tmp/frontdesk-broker"
let brokerPIDs = (onCluster
    ? [1, 2, 3].map { "\(ProcessInfo.processInfo.environment["FRONTDESK_CLUSTER_DIR"] ?? "/var/tmp/frontdesk-cluster")/node\($0)/pid" }
    : [brokerDirectory + "/pid"])
    .compactMap { (try? String(contentsOfFile: $0, encoding: .utf8)).flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) } }

func cpuSeconds(_ processes: [(String, Process)]) -> [String: Double] {
    var total: [String: Double] = [:]
    for (name, p) in processes { total[name, default: 0] += ProcStats.cpuSeconds(p.processIdentifier) ?? .nan }
    for pid in brokerPIDs { if let broker = ProcStats.cpuSeconds(pid) { total["broker", default: 0] += broker } }
    // The producer and the status subscriber share the cores too.
    total["bench"] = ProcStats.cpuSeconds(getpid())
    return total
}

/// One round: offer `requests` new requests and wait until each has ended.
func round(
    _ system: String, rate: Double?, label: String, channel: AMQPChannel, observations: Observations,
    processes: [(String, Process)]
) async throws -> Round {
    let ids = (0..<requests).map { "\(label)-\($0)" }
    let cpuBefore = cpuSeconds(processes)
    let machineBefore = ProcStats.machineJiffies()
    let sentAt = try await offer(ids, rate: rate, on: channel)
    let deadline = ContinuousClock.now + .seconds(120)
    var reported = ContinuousClock.now
    while observations.endedCount(round: label) < ids.count, ContinuousClock.now < deadline {
        try await Task.sleep(for: .milliseconds(20))
        if ContinuousClock.now - reported > .seconds(5) {
            reported = .now
            FileHandle.standardError.write(Data("pipeline-bench: \(system) \(label): \(observations.endedCount(round: label))/\(ids.count) ended\n".utf8))
        }
    }
    let cpuAfter = cpuSeconds(processes)
    let machineAfter = ProcStats.machineJiffies()
    let results = observations.results(for: ids)
    var first: [Double] = [], replied: [Double] = []
    var failed = 0, lastEnd = sentAt[0]
    for (sent, r) in zip(sentAt, results) {
        if let f = r.first { first.append((f - sent).seconds * 1000) }
        if let e = r.end, r.replied {
            replied.append((e - sent).seconds * 1000)
            lastEnd = max(lastEnd, e)
        } else {
            failed += 1
        }
    }
    if reportStages { printStages(system, rate: rate, ids: ids, sentAt: sentAt, observations: observations) }
    let cpu = cpuAfter.keys.sorted().map { ($0, (cpuAfter[$0]! - (cpuBefore[$0] ?? 0)) * 1000 / Double(requests)) }
    return Round(
        system: system, offered: rate, throughput: Double(replied.count) / (lastEnd - sentAt[0]).seconds,
        firstEvent: first.sorted(), replied: replied.sorted(), failed: failed, cpuMsPerDispatch: cpu,
        machineBusy: machineBefore.flatMap { b in machineAfter.map { a in (a.busy - b.busy) / (a.total - b.total) } } ?? .nan)
}

/// Where the time went in a round: mean request → drafted → sending →
/// replied for all requests and for the slowest 2%, and when (in 100 ms bins
/// from the round's start) the slowest were sent: clustered bins point at a
/// stall, spread ones at queueing.
func printStages(_ system: String, rate: Double?, ids: [String], sentAt: [ContinuousClock.Instant], observations: Observations) {
    let seen = zip(ids, sentAt).compactMap { id, sent -> (sent: ContinuousClock.Instant, ms: [Double])? in
        guard let t = observations.stages(of: id) else { return nil }
        return (sent, [(t.first - sent).seconds, (t.sending - t.first).seconds, (t.end - t.sending).seconds].map { $0 * 1000 })
    }
    guard !seen.isEmpty else { return }
    let totals = seen.map { $0.ms.reduce(0, +) }.sorted()
    let cut = totals[Int(Double(totals.count) * 0.98)]
    func mean(_ rows: [[Double]]) -> String {
        (0..<3).map { i in String(format: "%.1f", rows.map { $0[i] }.reduce(0, +) / Double(max(1, rows.count))) }.joined(separator: " / ")
    }
    let slow = seen.filter { $0.ms.reduce(0, +) >= cut }
    var bins: [Int: Int] = [:]
    for s in slow { bins[Int((s.sent - sentAt[0]).seconds * 10), default: 0] += 1 }
    let offered = rate.map { String(format: "%.0f/s", $0) } ?? "max"
    print("stages \(system) \(offered): request → drafted / → sending / → replied, ms: all \(mean(seen.map(\.ms))); "
        + "slowest 2% (≥ \(Int(cut)) ms) \(mean(slow.map(\.ms))), sent in 100 ms bins "
        + bins.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: " "))
}

/// Connects the producer and the status subscriber to `url`.
func driver(_ url: AMQPURL, observations: Observations) async throws -> (AMQPConnection, AMQPChannel) {
    let connection = try await AMQPConnection.connect(.init(url: url, connectionName: "pipeline-bench"))
    let channel = try await connection.openChannel()
    try await channel.confirmSelect()
    let watch = try await connection.openChannel()
    try await watch.exchangeDeclare("frontdesk.status", type: "topic")
    try await watch.queueDeclare("bench.watch", exclusive: true)
    try await watch.queueBind("bench.watch", exchange: "frontdesk.status", routingKey: "status.#")
    // Noted on the connection thread as each event arrives: the instrument
    // shares the cores with what it measures, so it adds no task hop.
    _ = try await watch.consume(queue: "bench.watch", noAck: true, deliver: { event in
        guard let id = event.properties.correlationID, let dot = event.routingKey.lastIndex(of: ".") else { return }
        observations.saw(id, state: event.routingKey[event.routingKey.index(after: dot)...], at: .now)
    }, finished: { _ in })
    return (connection, channel)
}

/// Runs the maximum, then `fractions` of `scale` (default: this system's maximum).
func runSystem(_ system: String, url: AMQPURL, processes: [(String, Process)], scale: Double? = nil) async throws -> [Round] {
    let observations = Observations()
    let (connection, channel) = try await driver(url, observations: observations)
    defer { Task { await connection.close() } }
    // Warm up (connections, queues, caches), then the maximum, then the offered rates.
    _ = try await round(system, rate: nil, label: "warm", channel: channel, observations: observations, processes: processes)
    let maximum = try await round(system, rate: nil, label: "max", channel: channel, observations: observations, processes: processes)
    var rounds = [maximum]
    let rates = (fixedRates.isEmpty || fractionsAsked ? fractions.map { $0 * (scale ?? maximum.throughput) } : []) + fixedRates
    for (i, rate) in rates.enumerated() {
        rounds.append(try await round(system, rate: rate, label: "r\(i)", channel: channel, observations: observations, processes: processes))
    }
    return rounds
}

// MARK: - The pipeline: router, sender, two instant agents

let pURL = try makeVhost("p")
let router = try start("frontdesk-router", [], vhost: pURL.vhost)
let senders = try (0..<senderCount).map { i in try start("frontdesk-sender", [], vhost: pURL.vhost, httpPort: 9650 + i) }
try await Task.sleep(for: .milliseconds(1500))  // the sender has declared the agent queues
// Two instant agents for one target, or one for each of the targets.
let agentTargets = benchTargets.count == 1 ? benchTargets + benchTargets : benchTargets
let agents = try agentTargets.map { target in
    swiftAgents
        ? try start("frontdesk", ["agent", "--target", target, "--instant", "--amqp-url", servicesURL(pURL.vhost)], vhost: pURL.vhost)
        : try start(
            "pipeline-c-relay",
            [base.host, "\(onCluster ? clusterPorts[0] : base.port)", base.user, base.password, pURL.vhost, "--agent",
             "frontdesk.agent." + target.replacingOccurrences(of: "/", with: ".")], vhost: pURL.vhost)
}
try await Task.sleep(for: .seconds(1))  // the agents are seen online
if partitionCount > 1 { try await waitUntilShared() }

/// Waits (at most a minute) until the replicas lead every partition once, evenly.
func waitUntilShared() async throws {
    let deadline = ContinuousClock.now + .seconds(60)
    var led: [Int] = []
    while ContinuousClock.now < deadline {
        led = senders.indices.map { i in partitionsLed(port: 9650 + i) ?? -1 }
        if led.reduce(0, +) == partitionCount, (led.max() ?? 0) - (led.min() ?? 0) <= 1 {
            return FileHandle.standardError.write(Data("pipeline-bench: \(senderCount) senders lead \(led) of \(partitionCount) partitions\n".utf8))
        }
        try await Task.sleep(for: .milliseconds(250))
    }
    throw AMQPError(.timeout, "the senders did not share the partitions: \(led)")
}

func partitionsLed(port: Int) -> Int? {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    p.arguments = ["-fs", "http://127.0.0.1:\(port)/metrics"]
    let out = Pipe()
    p.standardOutput = out
    p.standardError = FileHandle.nullDevice
    guard (try? p.run()) != nil else { return nil }
    let data = out.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return String(decoding: data, as: UTF8.self).split(separator: "\n")
        .first { $0.hasPrefix("frontdesk_sender_partitions_led ") }
        .flatMap { Double($0.split(separator: " ").last ?? "") }.map { Int($0) }
}

defer {
    for p in [router] + senders + agents where p.isRunning { p.terminate() }
    try? ctl(["delete_vhost", pURL.vhost])
}

let pipelineProcesses = [("router", router)] + senders.map { ("sender", $0) } + agents.map { ("agents", $0) }
let pipeline = try await runSystem("pipeline", url: pURL, processes: pipelineProcesses)
let pipelineMax = pipeline[0].throughput

// MARK: - The ceiling: pipeline-c-relay

var ceiling: [Round] = []
if !pipelineOnly {
    let cURL = try makeVhost("c")
    do {
        let connection = try await AMQPConnection.connect(.init(url: cURL, connectionName: "pipeline-bench setup"))
        let channel = try await connection.openChannel()
        try await channel.exchangeDeclare("frontdesk.commands", type: "topic")
        try await channel.exchangeDeclare("frontdesk.status", type: "topic")
        for queue in ["frontdesk.router.intake", "bench.inbox", "bench.replies", "bench.agent"] {
            try await channel.queueDeclare(queue, arguments: ["x-queue-type": "quorum"])
        }
        try await channel.queueBind("frontdesk.router.intake", exchange: "frontdesk.commands", routingKey: "#")
        for stream in ["bench.decisions", "frontdesk.status.log"] {
            try await channel.queueDeclare(stream, arguments: ["x-queue-type": "stream", "x-max-age": "1D"])
        }
        try await channel.queueBind("frontdesk.status.log", exchange: "frontdesk.status", routingKey: "status.#")
        await connection.close()
    }
    let relay = try start("pipeline-c-relay", [base.host, "\(base.port)", base.user, base.password, cURL.vhost], vhost: cURL.vhost)
    try await Task.sleep(for: .milliseconds(500))

    ceiling = try await runSystem("c-relay", url: cURL, processes: [("c-relay", relay)], scale: pipelineMax)
    relay.terminate()
    try? ctl(["delete_vhost", cURL.vhost])
}
let peakRSS = ([("router", router)] + senders.map { ("sender", $0) }).map { ($0.0, ProcStats.peakRSSMiB($0.1.processIdentifier) ?? .nan) }

// MARK: - Report

print("pipeline-bench: \(requests) dispatches a round; producer → router → \(senderCount) sender(s), \(partitionCount) partition(s) → \(agents.count) instant agents (\(swiftAgents ? "frontdesk agent --instant" : "C")) → replied; every publish confirmed\(onCluster ? "; on the 3-node cluster" : "")")
print("system    offered/s   replied/s   first p50   p99      replied p50  p99      p99.9    failed  busy  CPU-ms/dispatch")
var csv = "system,offered,throughput,first_p50,first_p99,replied_p50,replied_p99,replied_p999,machine_busy\n"
for r in pipeline + ceiling {
    let offered = r.offered.map { String(format: "%9.0f", $0) } ?? "      max"
    let cpu = r.cpuMsPerDispatch.map { String(format: "%@ %.3f", $0.0, $0.1) }.joined(separator: ", ")
    print(String(
        format: "%-9@ %@ %11.0f %9.2f %8.2f %12.2f %8.2f %8.2f %6d  %3.0f%%  %@", r.system, offered, r.throughput,
        percentile(r.firstEvent, 0.5), percentile(r.firstEvent, 0.99), percentile(r.replied, 0.5), percentile(r.replied, 0.99),
        percentile(r.replied, 0.999), r.failed, r.machineBusy * 100, cpu))
    csv += String(
        format: "%@,%.0f,%.1f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", r.system, r.offered ?? r.throughput, r.throughput,
        percentile(r.firstEvent, 0.5), percentile(r.firstEvent, 0.99), percentile(r.replied, 0.5), percentile(r.replied, 0.99),
        percentile(r.replied, 0.999), r.machineBusy)
}
print("peak RSS: " + peakRSS.map { String(format: "%@ %.1f MiB", $0.0, $0.1) }.joined(separator: ", "))
if let relayMax = ceiling.first?.throughput {
    print(String(format: "ratio pipeline / C relay at the maximum = %.2f (target ≥ 0.60)", pipelineMax / relayMax))
}
if let half = pipeline.first(where: { $0.offered.map { abs($0 - pipelineMax / 2) < 1 } ?? false }) {
    print(String(format: "p99 request → replied at half the maximum (%.0f/s) = %.2f ms (target ≤ 20 ms), both cores %.0f%% busy", half.offered!, percentile(half.replied, 0.99), half.machineBusy * 100))
    // The ceiling at the same offered rate: what any client doing this broker work gets here.
    if let relay = ceiling.first(where: { $0.offered == half.offered }) {
        print(String(format: "  C relay at the same rate: p99 %.2f ms, both cores %.0f%% busy", percentile(relay.replied, 0.99), relay.machineBusy * 100))
    }
}
// The latency goal at each offered rate: the pipeline's p50 and p99 against
// the relay's at the same rate (targets ≤ 1.3× and ≤ 1.5×), and the CPU of
// router + sender against the whole relay's (its three loops; target ≤ 1.5×).
if !ceiling.isEmpty {
    print("against the relay at the same offered rate: p50 ratio (≤ 1.3), p99 ratio (≤ 1.5), CPU-ms router+sender / relay (≤ 1.5)")
    for r in pipeline {
        guard let offered = r.offered, let c = ceiling.first(where: { $0.offered == offered }) else { continue }
        let services = r.cpuMsPerDispatch.filter { $0.0 == "router" || $0.0 == "sender" }.map(\.1).reduce(0, +)
        let relayCPU = c.cpuMsPerDispatch.first { $0.0 == "c-relay" }?.1 ?? .nan
        let p50 = percentile(r.replied, 0.5) / percentile(c.replied, 0.5), p99 = percentile(r.replied, 0.99) / percentile(c.replied, 0.99)
        print(String(
            format: "  %5.0f/s  p50 %6.2f / %6.2f ms = %.2f%@  p99 %6.2f / %6.2f ms = %.2f%@  CPU %.3f / %.3f ms = %.2f%@", offered,
            percentile(r.replied, 0.5), percentile(c.replied, 0.5), p50, p50 <= 1.3 ? " met" : " not met",
            percentile(r.replied, 0.99), percentile(c.replied, 0.99), p99, p99 <= 1.5 ? " met" : " not met",
            services, relayCPU, services / relayCPU, services / relayCPU <= 1.5 ? " met" : " not met"))
    }
}
if !csvPath.isEmpty { try csv.write(toFile: csvPath, atomically: true, encoding: .utf8) }
