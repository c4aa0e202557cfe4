import AMQP
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// Runs terms of leadership, one after another: connect, declare, become
/// the leader (the holder of the exclusive queue `frontdesk.sender.lock`,
/// deleted by the broker with its connection or its node), replay the remembered commands, then
/// run a `SenderTerm` until the connection fails. Standby replicas look
/// every `standbyPoll`, so that a new leader takes over well within a second
/// of the old one's connection ending.
///
/// With the work split into partitions (FRONTDESK_SENDER_PARTITIONS > 1),
/// each partition has a lock of its own and a slot in every replica that
/// runs its terms; the replicas share the partitions (`PartitionBalance`,
/// counting each other by their heartbeats in the status log), and
/// one status log reader per replica, reading on while its terms lead, lets
/// each partition see what the others published (a reroute moves a dispatch
/// to another partition).
final class SenderService: Service {
    let configuration: ServiceConfiguration
    let table: RoutingTable
    let logger: Logger
    let metrics: SenderMetrics
    let balance: PartitionBalance
    var partitions: SenderPartitions { configuration.senderPartitions }

    /// The slot of the control connection in `connections` (partitions are 0…P−1).
    private static let control = -1

    private struct State {
        var stopping = false
        /// Each partition slot's connection, and the control connection.
        var connections: [Int: AMQPConnection] = [:]
        var ready = false
        /// A term ended because the broker blocked its publishes; it stays
        /// set across reconnects (a new connection is told of the alarm only
        /// once it publishes) until a publish is confirmed again.
        var blocked = false
        /// The partitions this replica leads, and how many replicas there are.
        var led: Set<Int> = []
        var replicas = 1
        var lastChange = Date()
        var lastOverTake = Date.distantPast
        /// Partitions given up lately: not tried again before then (another replica's turn).
        var holdUntil: [Int: Date] = [:]
        /// Since when no other replica's heartbeat claims each partition.
        var unclaimedSince: [Int: Date] = [:]
        /// The other replicas, by their heartbeats.
        var peers: [PartitionBalance.Peer] = []
        /// When each slot last stood by, able to try for its partition.
        var standingBy: [Int: Date] = [:]
        /// When this replica last gave a partition up for a short replica.
        var lastShortRelease = Date.distantPast
        /// When the replica count last changed.
        var countChangedAt = Date()
        /// Slots trying for their partition now, and whether beyond the share.
        var trying: [Int: Bool] = [:]
    }

    private let state = Mutex(State())

    init(configuration: ServiceConfiguration, table: RoutingTable, logger: Logger, metrics: SenderMetrics) {
        self.configuration = configuration
        self.table = table
        self.logger = logger
        self.metrics = metrics
        balance = PartitionBalance(partitions: configuration.senderPartitions)
    }

    /// Connected with its topology declared, and the broker takes its publishes.
    var isReady: Bool { state.withLock { s in s.ready && !s.blocked && s.connections.values.allSatisfy { $0.blockedReason == nil } } }
    private var stopping: Bool { state.withLock { $0.stopping } }

    func shutdown() async {
        let connections = state.withLock { s -> [AMQPConnection] in
            s.stopping = true
            return Array(s.connections.values)
        }
        // Under a resource alarm a consumer's cancel would wait for the alarm
        // to clear; each connection may still take a few seconds: all at once.
        for c in connections { c.abandonWhenBlocked() }
        await withDiscardingTaskGroup { group in
            for c in connections { group.addTask { await c.close() } }
        }
    }

    /// What each loop of the replica does now and since when (`whereItWaits`).
    private let waits = Mutex<[String: (what: String, since: ContinuousClock.Instant)]>([:])

    /// Notes `loop`'s step; the same step again keeps its start (a wait
    /// that loops, such as standing by, shows how long it has lasted).
    private func at(_ loop: String, _ what: String) {
        let now = ContinuousClock.now
        waits.withLock { w in
            if w[loop]?.what != what { w[loop] = (what, now) }
        }
    }

    /// `loop` has ended: nothing to report of it.
    private func done(_ loop: String) {
        _ = waits.withLock { $0.removeValue(forKey: loop) }
    }

    private static func slot(_ k: Int) -> String { "partition \(k)" }

    var whereItWaits: [(String, LogValue)] {
        let now = ContinuousClock.now
        return waits.withLock { w in
            w.sorted { $0.key < $1.key }.map { loop, at in
                ("waits.\(loop)", .string("\(at.what) for \(Int((now - at.since) / .milliseconds(1))) ms"))
            }
        }
    }

    /// How long a replica counts heartbeats before it tries for partitions.
    static let countSettle = Duration.seconds(2)

    /// How often a standby replica asks whether the leader is still there.
    static let standbyPoll = Duration.milliseconds(100)
    /// A term shorter than this counts as a failure for the back-off (a node
    /// that accepts and drops connections must not drive a tight loop).
    static let shortTerm = Duration.seconds(5)

    func run() async throws {
        if partitions.count == 1 { return await runSlot(0, shared: nil) }
        // One log for the replica's lifetime, read by one reader at a time
        // (a new one after the control connection is lost), shared by the slots.
        let shared = SharedStatusLog(StatusLog(writer: configuration.login, partitions: partitions))
        await withTaskGroup(of: Void.self) { group in
            for k in partitions.all {
                group.addTask { await self.runSlot(k, shared: shared) }
            }
            group.addTask { await self.control(shared) }
        }
    }

    /// This replica's id in its heartbeats.
    private let replicaID = UUID().uuidString.lowercased()
    /// How often a replica writes its heartbeat; the others count it, and
    /// take its partitions as claimed, while one is at most `heartbeatWindow` old.
    static let heartbeatInterval = Duration.milliseconds(250)
    static let heartbeatWindow: Double = 0.75
    /// A heartbeat says the replica stands by when a slot of it did within this long.
    static let standingByWithin: TimeInterval = 1

    /// With several partitions: the replica's control connection, for as
    /// long as the service runs: the topology, the status log reader (the
    /// slots try for partitions only once it has read the log to its end),
    /// a heartbeat every `heartbeatInterval` in the log, and from the
    /// heartbeats read, the replica count that decides each replica's share.
    private func control(_ shared: SharedStatusLog) async {
        let backoff = Backoff.reconnect
        var failures = 0
        let nodes = configuration.amqp.nodes.shuffled()
        var next = 0
        defer { done("control") }
        while !stopping, !Task.isCancelled {
            do {
                try await controlSession(configuration.amqp.to(nodes[next % nodes.count]), shared)
                failures = 0
            } catch {
                failures += 1
                if !stopping { logger.warning("sender control connection ended; reconnecting", [("error", .string("\(error)"))]) }
            }
            next += 1
            await shared.set(nil)
            state.withLock { s in
                s.connections[Self.control] = nil
                s.ready = false
            }
            if !stopping, failures > 0, failures % nodes.count == 0 {
                at("control", "back-off")
                try? await Task.sleep(for: .milliseconds(backoff.delayMs(afterAttempt: max(1, failures / nodes.count))))
            }
        }
    }

    private func controlSession(_ amqp: AMQPConnectionConfiguration, _ shared: SharedStatusLog) async throws {
        at("control", "connecting")
        let connection = try await AMQPConnection.connect(amqp)
        let proceed = state.withLock { s -> Bool in
            s.connections[Self.control] = connection
            return !s.stopping
        }
        defer { Task { await connection.close() } }
        guard proceed else { return }
        at("control", "declaring the topology")
        try await declareTopology(on: connection)
        let probes = try await connection.openChannel()
        try await probes.confirmSelect()
        at("control", "reading the log to its end")
        let reader = try await StatusLogReader.start(
            connection, login: configuration.login, lifetimeSeconds: configuration.lifetimeSeconds, into: shared.log)
        try await reader.probe(publisher: probes)  // read to the log's end: warm
        // Heartbeats count from here on: those read on the way (of replicas
        // perhaps long gone) do not, and this replica writes its own only now
        // (the others must not count it while it cannot lead yet).
        shared.log.clearHeartbeats()
        await shared.set(reader)
        state.withLock { s in
            s.ready = true
            s.countChangedAt = Date()
        }
        logger.info("connected; sharing the partitions", [("broker", .string("\(amqp.url)")), ("partitions", .int(partitions.count))])
        defer { Task { await reader.stop() } }
        // Heartbeats and the shares every 250 ms; the reader's probe apart
        // (a slow probe must not stop the heartbeats, which the others read as this replica's death).
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                defer { self.done("heartbeats") }
                while !self.stopping {
                    self.at("heartbeats", "publishing")
                    try await self.heartbeat(probes)
                    self.at("heartbeats", "pausing")
                    try await Task.sleep(for: Self.heartbeatInterval)
                    guard connection.isOpen, !reader.hasEnded else {
                        throw AMQPError(.consumerCancelled, "the control connection or its status log reader ended")
                    }
                    self.at("heartbeats", "rebalancing")
                    if self.rebalance(replicas: self.noteHeartbeats(shared.log)) {
                        try await self.heartbeat(probes)  // at once: the others see the partition free
                    }
                }
            }
            group.addTask {
                defer { self.done("log probe") }
                let probeChannel = try await connection.openChannel()
                try await probeChannel.confirmSelect()
                while !self.stopping {
                    self.at("log probe", "pausing")
                    try await Task.sleep(for: StatusLogReader.probeInterval)
                    self.at("log probe", "reading to a marker")
                    try await reader.probe(publisher: probeChannel)
                }
            }
            at("control", "heartbeats and log probe")
            _ = try await group.next()
            group.cancelAll()
            at("control", "ending the session's tasks")
        }
    }

    private func declareTopology(on connection: AMQPConnection) async throws {
        try await SenderTopology.declare(on: connection, table: table, partitions: partitions, usedAsItIs: { [logger] queue, error in
            logger.warning("an agent queue exists with other arguments than the sender's; using it as it is", [
                ("queue", .string(queue)), ("error", .string("\(error)")),
            ])
        }, statusLogWayRefused: { [logger] error in SharedTopology.warnStatusLogWayRefused(logger, error) })
    }

    private func heartbeat(_ channel: AMQPChannel) async throws {
        let (led, standingBy) = state.withLock { s in
            // A slot that stood by within the last second, and is not leading since.
            let since = Date().addingTimeInterval(-Self.standingByWithin)
            return (s.led.sorted().map(String.init).joined(separator: ","), s.standingBy.contains { !s.led.contains($0.key) && $0.value >= since })
        }
        var properties = AMQPProperties(messageID: replicaID, type: StatusLog.heartbeatType)
        properties.headers = [StatusLog.ledHeader: .string(led), StatusLog.standbyHeader: .string(standingBy ? "1" : "0")]
        try await channel.publish(OutboundMessage(
            exchange: "", routingKey: SenderTopology.statusLog, body: Data(), properties: properties.stamped(by: configuration.login)))
    }

    /// The replica count and the other replicas' partitions, from the heartbeats read.
    @discardableResult
    private func noteHeartbeats(_ log: StatusLog) -> Int {
        let (count, claimed, peers) = log.replicas(within: Self.heartbeatWindow, me: replicaID)
        let now = Date()
        state.withLock { s in
            if s.replicas != max(1, count) { s.countChangedAt = now }
            s.replicas = max(1, count)
            s.peers = peers
            for k in partitions.all {
                if claimed.contains(k) {
                    s.unclaimedSince[k] = nil
                } else if s.unclaimedSince[k] == nil {
                    s.unclaimedSince[k] = now
                }
            }
        }
        return max(1, count)
    }

    /// The terms of partition `k`, one after another, until the service
    /// stops (or, with several partitions, its session ends).
    private func runSlot(_ k: Int, shared: SharedStatusLog?) async {
        let backoff = Backoff.reconnect
        var failures = 0
        // Every node of AMQP_URL, in a shuffled order: after a failure or a lost
        // connection the next; a back-off only once each has failed in a row.
        let nodes = configuration.amqp.nodes.shuffled()
        var next = 0
        defer { done(Self.slot(k)) }
        while !stopping, !Task.isCancelled {
            let began = ContinuousClock.now
            do {
                try await term(configuration.amqp.to(nodes[next % nodes.count]), partition: k, shared: shared)
                failures = ContinuousClock.now - began < Self.shortTerm && !stopping ? failures + 1 : 0
                next += 1
            } catch {
                // A long term that failed is the first failure of a row, not one more.
                failures = ContinuousClock.now - began < Self.shortTerm ? failures + 1 : 1
                next += 1
                state.withLock { s in
                    if (error as? AMQPError)?.code == .connectionBlocked || s.connections[k]?.blockedReason != nil { s.blocked = true }
                }
                if !stopping, !Task.isCancelled {
                    logger.warning("sender term ended; reconnecting", [("error", .string("\(error)")), ("partition", .int(k))])
                }
            }
            state.withLock { s in
                s.connections[k] = nil
                if shared == nil { s.ready = false }
            }
            let roundFailed = failures > 0 && failures % nodes.count == 0
            if !stopping, nodes.count == 1 || roundFailed {
                at(Self.slot(k), "back-off")
                try? await Task.sleep(for: .milliseconds(backoff.delayMs(afterAttempt: max(1, failures / nodes.count))))
            }
        }
    }

    /// Gives up partitions while this replica leads more than its share, or more
    /// than ⌊P / N⌋ while another leads fewer (`PartitionBalance.release`); true if it gave any up.
    private func rebalance(replicas: Int) -> Bool {
        let now = Date()
        let release = state.withLock { s -> [(Int, AMQPConnection?)] in
            // Settled: nothing changed here, and the replica count held, for a while.
            // Every partition led, by this replica or by another's heartbeat
            // (one given up a moment ago is the short replica's to take first).
            let allLed = partitions.all.allSatisfy { s.led.contains($0) || s.unclaimedSince[$0] == nil }
            let give = balance.release(
                led: s.led, me: replicaID, replicas: s.replicas, peers: s.peers, allLed: allLed,
                sinceLastChange: min(now.timeIntervalSince(s.lastChange), now.timeIntervalSince(s.countChangedAt)),
                sinceOverTake: now.timeIntervalSince(s.lastOverTake), sinceShortRelease: now.timeIntervalSince(s.lastShortRelease))
            if !give.isEmpty, s.led.count <= balance.share(replicas: s.replicas) { s.lastShortRelease = now }
            for k in give { s.holdUntil[k] = now.addingTimeInterval(Self.releaseHold) }
            if !give.isEmpty {
                s.lastChange = now
                s.led.subtract(give)  // the next heartbeat no longer claims them
            }
            return give.map { ($0, s.connections[$0]) }
        }
        for (k, connection) in release {
            logger.info("giving up a partition to another replica", [("partition", .int(k)), ("replicas", .int(replicas))])
            // Not awaited: the heartbeats go on while the close takes its
            // time (up to its RPC timeout on a slow broker). Others stop
            // counting a replica 0.75 s after its last heartbeat.
            if let connection { Task { await connection.close() } }
        }
        return !release.isEmpty
    }

    /// A partition given up is not tried again by its replica for this long.
    static let releaseHold: TimeInterval = 3

    private func term(_ amqp: AMQPConnectionConfiguration, partition k: Int, shared: SharedStatusLog?) async throws {
        at(Self.slot(k), "connecting")
        let connection = try await AMQPConnection.connect(amqp)
        let proceed = state.withLock { s -> Bool in
            s.connections[k] = connection
            return !s.stopping
        }
        defer { Task { await connection.close() } }
        guard proceed else { return }
        try await withTaskCancellationHandler {
            try await lead(connection, amqp, partition: k, shared: shared)
        } onCancel: {
            Task { await connection.close() }
        }
        // A term (or a standby) that ended with its connection's failure says
        // why (`runSlot` logs it); one this replica closed ends quietly.
        if !stopping, let failure = connection.failure { throw failure }
    }

    private func lead(_ connection: AMQPConnection, _ amqp: AMQPConnectionConfiguration, partition k: Int, shared: SharedStatusLog?) async throws {
        if shared == nil {
            try await declareTopology(on: connection)
            state.withLock { $0.ready = true }
            logger.info("connected; waiting to lead", [("broker", .string("\(amqp.url)"))])
        }
        // A warm standby: the status log is read from the lifetime window's
        // start while this replica waits, so that taking over reads only its
        // tail (with a long log, reading it all at takeover took seconds).
        // With several partitions the replica's one reader serves every slot.
        var logReader: StatusLogReader?
        if shared == nil {
            logReader = try await StatusLogReader.start(connection, login: configuration.login, lifetimeSeconds: configuration.lifetimeSeconds)
        }
        // A standby also makes sure its reader still reads (on 3.10 a stream
        // consumer can hang without a cancel when its stream member restarts):
        // a probe marker every `probeInterval`, read back within it, or the term ends.
        // (The shared reader is probed by the replica's control loop.)
        var probes: AMQPChannel?
        if shared == nil {
            probes = try await connection.openChannel()
            try await probes?.confirmSelect()
        }
        var lastProbe = ContinuousClock.now
        // Leadership: holding the exclusive queue frontdesk.sender.lock. Only
        // one connection at a time can declare it; the broker deletes it when
        // that connection closes, and when the node it lives on goes down (a
        // transient queue on a lost node is removed). Counting the consumers
        // of a quorum queue, as before, failed on a cluster: RabbitMQ 3.10
        // keeps a consumer of a node that went down as "suspected down", and
        // with that node gone for good no standby would ever lead.
        var leadership: AMQPConsumer?
        while leadership == nil {
            at(Self.slot(k), "standing by")
            if stopping || !connection.isOpen || Task.isCancelled { return }
            if let probes, let logReader, ContinuousClock.now - lastProbe >= StatusLogReader.probeInterval {
                try await logReader.probe(publisher: probes)
                lastProbe = .now
            }
            if let shared {
                // Only with the replica's reader at the log's end and the
                // replicas counted; then another partition only while below
                // this replica's share, or now and then.
                guard let ready = await shared.readyReader(settle: Self.countSettle) else {
                    try await Task.sleep(for: Self.standbyPoll)
                    continue
                }
                logReader = ready
                // A slot's try counts as a partition led while it lasts: the
                // slots of one replica try at the same moment.
                let now = Date()
                let may = state.withLock { s -> Bool in
                    let busy = s.led.count + s.trying.count
                    guard s.holdUntil[k].map({ now >= $0 }) ?? true else { return false }
                    s.standingBy[k] = now  // ready to try for it, were it free
                    guard
                        balance.mayTry(
                            led: busy, replicas: s.replicas, unclaimedFor: s.unclaimedSince[k].map { now.timeIntervalSince($0) },
                            sinceOwnChange: s.trying.isEmpty ? now.timeIntervalSince(s.lastChange) : 0,
                            peers: s.peers)
                    else { return false }
                    s.trying[k] = busy >= balance.share(replicas: s.replicas)
                    return true
                }
                if !may {
                    try await Task.sleep(for: Self.standbyPoll)
                    continue
                }
            }
            // A try that does not lead, however it ends (opening the channel
            // can throw too), is no longer counted: a stale one would count as
            // a partition led, and the replica would never try again.
            defer { if shared != nil, leadership == nil { _ = state.withLock { $0.trying.removeValue(forKey: k) } } }
            at(Self.slot(k), "trying for the lock")
            let channel = try await connection.openChannel()
            var heldElsewhere = false
            do {
                try await channel.queueDeclare(SenderTopology.lock(k), durable: false, exclusive: true, autoDelete: false)
                leadership = try await channel.consume(queue: SenderTopology.lock(k), exclusive: true)
            } catch let error as AMQPError where error.replyCode == 405 {
                // RESOURCE_LOCKED: another sender holds it (the broker closed this channel).
                heldElsewhere = true
            }
            if heldElsewhere {
                // Not counted as a try while it waits: the replica's other slots may try meanwhile.
                if shared != nil { _ = state.withLock { $0.trying.removeValue(forKey: k) } }
                try await Task.sleep(for: Self.standbyPoll)
            }
        }
        // Leading lasts exactly as long as that queue and its consumer: should
        // the broker cancel it or close its channel while the connection lives
        // on, end the term at once (closing the connection returns every
        // lease), so that two senders never publish for the same dispatches.
        let leader = leadership!
        await probes?.close()
        let watch = Task { [logger] in
            // (A message put into the lock by name is acked: unacked, it would
            // trip the consumer timeout and end the term after 30 minutes.)
            do { for try await d in leader { try? d.ack() } } catch {}
            // (A connection closed here — the service stopping, or a partition
            // given up to another replica — ends the term without a warning.)
            if !Task.isCancelled && !self.stopping && connection.isOpen {
                logger.warning("leadership lost; ending the term", [("partition", .int(k))])
                await connection.close()
            }
        }
        defer { watch.cancel() }
        noteLeading(k, true)
        defer { noteLeading(k, false) }
        logger.info("leading", [("partition", .int(k)), ("routes", .int(partitions.routes(k, of: table).count))])
        let takingOver = ContinuousClock.now
        let publisher = try await connection.openChannel()
        try await publisher.confirmSelect()
        at(Self.slot(k), "taking over")
        let replayed = try await replayCommands(connection, publisher)
        state.withLock { $0.blocked = false }  // its marker was published and confirmed
        guard let logReader else { return }
        let statusLog = try await logReader.finish(publisher: publisher, grace: takeoverGrace, keepReading: shared != nil)
        let term = SenderTerm(
            connection: connection, publisher: publisher, table: table, partition: k, partitions: partitions,
            policy: RetryPolicy(
                baseMs: configuration.retry.baseMs, maxMs: configuration.retry.maxMs,
                maxAttempts: configuration.retry.maxAttempts, replyTimeoutSeconds: configuration.replyTimeoutSeconds,
                lifetimeSeconds: configuration.lifetimeSeconds),
            logger: logger, metrics: metrics, statusLog: statusLog, login: configuration.login, routerLogin: configuration.routerUser)
        metrics.terms.increment()
        // How long the takeover read (a slow one holds every dispatch of the partition).
        logger.info("term ready", [
            ("partition", .int(k)), ("commands", .int(replayed.count)),
            ("took_ms", .int(Int((ContinuousClock.now - takingOver) / .milliseconds(1)))),
        ])
        // The term's loop runs on its connection's thread: an input or a
        // confirm resumes it there, with no thread of the pool to wake.
        at(Self.slot(k), "leading")
        try await withTaskExecutorPreference(connection.executor) {
            try await term.run(replayedCommands: replayed)
        }
    }

    /// Keeps the set of led partitions and the leader gauges.
    private func noteLeading(_ k: Int, _ leading: Bool) {
        let now = Date()
        state.withLock { s in
            if leading {
                // Taken beyond the share (a free partition nobody else took): kept a while.
                if s.trying.removeValue(forKey: k) == true { s.lastOverTake = now }
                s.led.insert(k)
            } else {
                s.led.remove(k)
            }
            s.lastChange = now
            // Set under the lock: two slots changing at once must not leave the older count.
            metrics.leader.set(s.led.isEmpty ? 0 : 1)
            metrics.partitionsLed.set(Double(s.led.count))
        }
    }

    /// How long a new term waits for a dead leader's last events to reach the
    /// log. On one node the broker has routed a dead connection's last
    /// publishes once its consumer is seen gone, so a short wait covers the
    /// stream's own write. On a cluster (several nodes in AMQP_URL) nothing
    /// orders the dead channel's publish to the stream's node against its
    /// consumer's removal on the queue's node: a second. Both can be set with
    /// FRONTDESK_TAKEOVER_GRACE_MS.
    static let takeoverGraceOneNode = Duration.milliseconds(250)
    static let takeoverGraceCluster = Duration.seconds(1)

    var takeoverGrace: Duration {
        if let ms = ProcessInfo.processInfo.environment["FRONTDESK_TAKEOVER_GRACE_MS"].flatMap(Int.init), (0...60_000).contains(ms) {
            return .milliseconds(ms)
        }
        return configuration.amqp.alternates.isEmpty ? Self.takeoverGraceOneNode : Self.takeoverGraceCluster
    }

    /// Reads the commands stream to its end (marked by a message of our own).
    /// Each with when it was written: it is kept for the lifetime window from then.
    private func replayCommands(_ connection: AMQPConnection, _ publisher: AMQPChannel) async throws -> [(command: SenderCommand, at: Date)] {
        let channel = try await connection.openChannel()
        defer { Task { await channel.close() } }
        try await channel.qos(prefetchCount: 1000)
        let consumer = try await channel.consume(queue: SenderTopology.commands, arguments: [AMQPStream.offsetArgument: "first"])
        let marker = "marker-\(UUID().uuidString)"
        try await publisher.publish(OutboundMessage(
            exchange: "", routingKey: SenderTopology.commands, body: Data(),
            properties: AMQPProperties(messageID: marker, type: StatusLog.markerType).stamped(by: configuration.login)))
        var commands: [(command: SenderCommand, at: Date)] = []
        // A command counts for the window before its request came, and that
        // request may still wait up to its own lifetime: two windows are kept.
        let keep = UInt64(clamping: configuration.lifetimeSeconds).multipliedClamped(by: 2)
        let now = UInt64(Date().timeIntervalSince1970)
        // A stream consumer that hangs (RabbitMQ 3.10, its member restarted)
        // would hold the term, and the partition's lock, for ever: nothing
        // read for `StatusLogReader.stallTimeout` closes the channel, and the
        // term ends for a new connection (maybe to another node) to try again.
        let started = ContinuousClock.now
        let elapsedMs: @Sendable () -> Int64 = { Int64((ContinuousClock.now - started) / .milliseconds(1)) }
        let lastReadMs = Atomic<Int64>(0)
        let stalled = Flag()
        let stallMs = Int64(StatusLogReader.stallTimeout * 1000)
        let watchdog = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                if elapsedMs() - lastReadMs.load(ordering: .relaxed) > stallMs {
                    stalled.set()
                    await channel.close()
                    return
                }
            }
        }
        defer { watchdog.cancel() }
        let stall = AMQPError(.timeout, "the commands stream gave nothing back for \(Int(StatusLogReader.stallTimeout)) s")
        var sawMarker = false
        do {
            for try await d in consumer {
                lastReadMs.store(elapsedMs(), ordering: .relaxed)
                try? d.ack()
                if d.properties.messageID == marker {
                    sawMarker = true
                    break
                }
                // Saturating: a timestamp from the future (however far) is age 0, never a trap.
                if let written = d.properties.timestamp, now.subtractingClamped(written) > keep { continue }
                // Only commands this sender kept: anyone could publish into the stream by name.
                if d.properties.userID == configuration.login, let command = SenderCommand(type: d.properties.type, body: d.body) {
                    // Written by this service, so stamped, to the second: taken as the end of that second
                    // (never older than it was live); one from the future counts as now.
                    let stamped = d.properties.timestamp.map { Date(timeIntervalSince1970: TimeInterval($0.addingClamped(1))) }
                    commands.append((command, min(stamped ?? .distantFuture, Date())))
                }
            }
        } catch {
            // The watchdog's close fails the consumer: say why.
            throw stalled.isSet ? stall : error
        }
        guard sawMarker else {
            throw stalled.isSet ? stall : AMQPError(.timeout, "the commands stream ended before its marker")
        }
        return commands
    }
}

/// Reads the status log from the lifetime window's start for as long as the
/// replica stands by; `finish` reads up to a marker of our own, waits for a
/// dead leader's last events to land, reads to a second marker, and stops:
/// from then on this term is the only sender publishing (leadership is the
/// leader queue's single consumer), and it notes its own events in the log as
/// they are confirmed. The router's later events need no reading: a hand-off
/// it sends again within this term is caught by the entry the term marks
/// accepted. (Following the log for the whole term cost ~15% of the leader's
/// CPU, four deliveries a dispatch; a standby has the CPU to spare.)
final class StatusLogReader: Sendable {
    /// A wait for a marker gives up once the reader has taken nothing for this long.
    static let stallTimeout: TimeInterval = 30
    /// How often a standby checks that its reader still reads.
    static let probeInterval = Duration.seconds(10)

    let log: StatusLog
    private let channel: AMQPChannel
    private let reader: Task<Void, Never>
    private let login: String
    /// Set when the reader stopped (its consumer or channel ended).
    private let ended: Flag

    private init(log: StatusLog, channel: AMQPChannel, reader: Task<Void, Never>, login: String, ended: Flag) {
        self.log = log
        self.channel = channel
        self.reader = reader
        self.login = login
        self.ended = ended
    }

    /// Reads the status log into `log` (a new one by default) from the lifetime window's start.
    static func start(
        _ connection: AMQPConnection, login: String, lifetimeSeconds: Int, into existing: StatusLog? = nil
    ) async throws -> StatusLogReader {
        let log = existing ?? StatusLog(writer: login)
        let channel = try await connection.openChannel()
        try await channel.qos(prefetchCount: 2000)
        let since = UInt64(Date().timeIntervalSince1970).subtractingClamped(UInt64(clamping: lifetimeSeconds) &+ 60)
        let consumer = try await channel.consume(queue: SenderTopology.statusLog, arguments: [AMQPStream.offsetArgument: .timestamp(since)])
        let ended = Flag()
        let reader = Task {
            defer {
                ended.set()
                log.giveUpAll()  // no marker will be read any more
            }
            var count = 0
            do {
                for try await d in consumer {
                    log.ingest(d)
                    count += 1
                    if count % 100 == 0 { try? d.ack(multiple: true) }
                    if count % 50_000 == 0 { log.prune(olderThan: lifetimeSeconds + SenderTerm.pruneMarginSeconds) }
                }
            } catch {}
        }
        return StatusLogReader(log: log, channel: channel, reader: reader, login: login, ended: ended)
    }

    /// Publishes a marker and waits until the reader has read it. It gives up
    /// when the reader stopped, or has taken nothing for `stallTimeout` (a
    /// long backlog is fine as long as it moves).
    private func readToMarker(_ publisher: AMQPChannel) async throws {
        guard !ended.isSet else {
            throw AMQPError(.consumerCancelled, "the status log stopped being read")
        }
        let marker = "marker-\(UUID().uuidString)"
        let log = log
        log.expect(marker: marker)
        try await publisher.publish(OutboundMessage(
            exchange: "", routingKey: SenderTopology.statusLog, body: Data(),
            properties: AMQPProperties(messageID: marker, type: StatusLog.markerType).stamped(by: login)))
        let watchdog = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                if Date().timeIntervalSince1970 - log.lastIngest.load(ordering: .relaxed) > Self.stallTimeout {
                    log.giveUp(marker: marker)
                    return
                }
            }
        }
        defer { watchdog.cancel() }
        guard await log.waitFor(marker: marker) else {
            throw AMQPError(.timeout, "the status log reader stopped making progress")
        }
    }

    /// A standby's check that its reader still reads: a marker, read back.
    func probe(publisher: AMQPChannel) async throws {
        try await readToMarker(publisher)
    }

    /// Reads to the log's end as a new term starts; `keepReading`: the
    /// reader goes on (a log shared by the terms of several partitions,
    /// which see each other's events through it), else it stops.
    func finish(publisher: AMQPChannel, grace: Duration, keepReading: Bool = false) async throws -> StatusLog {
        try await readToMarker(publisher)
        // A leader killed a moment ago may have events still inside the broker
        // (published, not yet routed to the log) when our marker lands: a
        // terminal one among them would make its dispatch look unfinished.
        // Give them time to land, then read to a second marker.
        try await Task.sleep(for: grace)
        try await readToMarker(publisher)
        if !keepReading { await stop() }
        return log
    }

    /// Stops reading.
    func stop() async {
        await channel.close()
        await reader.value
    }

    /// The reader stopped (its consumer or channel ended).
    var hasEnded: Bool { ended.isSet }
}

/// With several partitions: the replica's status log, and the reader that
/// keeps it (none while the control connection is down).
actor SharedStatusLog {
    nonisolated let log: StatusLog
    private var reader: StatusLogReader?
    private var since: ContinuousClock.Instant?

    init(_ log: StatusLog) { self.log = log }

    func set(_ reader: StatusLogReader?) {
        self.reader = reader
        since = reader == nil ? nil : .now
    }

    /// The reader, once it has read the log to its end and the replicas'
    /// heartbeats for `settle` (a replica that has just started must not take
    /// every partition before it has counted the others).
    func readyReader(settle: Duration) -> StatusLogReader? {
        guard let reader, let since, ContinuousClock.now - since >= settle, !reader.hasEnded else { return nil }
        return reader
    }
}

