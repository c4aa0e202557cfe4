import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

/// One term of leadership: it lives as long as its connection. Every input
/// (hand-off, parked dispatch, reply, timer, presence change, command) goes
/// through one serial loop, so each dispatch's machine sees one input at a
/// time. Any broker failure ends the term: the connection closes, the broker
/// hands every lease (unacked message) back, and the next leader resumes.
final class SenderTerm {
    /// Each target's agents (its agent queue's consumers) and parked copies, as a poll saw them.
    typealias PresenceSnapshot = [RoutingTable.Route: (consumers: UInt32, parked: UInt32)]

    enum Input: Sendable {
        case inbox(AMQPDelivery)
        case parked(AMQPDelivery, RoutingTable.Route)
        case reply(AMQPDelivery)
        case expired(AMQPDelivery)
        case retryDue(AMQPDelivery)
        /// Every `tickInterval`: the timers now due fire.
        case tick
        case presence(PresenceSnapshot)
        /// A marker published for held replies was read (or given up on).
        case markerRead(String, Bool)
        /// Partition 0's leader saw a `sending` event of this dispatch (noted in the log).
        case sendingSeen(String)
        /// The broker refused this attempt's task for its agent queue (nacked or returned).
        case taskRefused(id: String, attempt: Int, reason: String)

        var isCommand: Bool {
            if case .inbox(let d) = self { return d.properties.type == SenderCommand.cancelType || d.properties.type == SenderCommand.rerouteType }
            return false
        }
    }

    /// A dispatch this term holds: its machine, the unacked message that
    /// keeps it durable (inbox or park), and which of its entries in
    /// `timers` is current (an older one is ignored when it comes due).
    struct Held {
        var machine: DispatchMachine
        /// Nil for a dispatch taken up from the copy the log keeps (a cancel
        /// or reroute while it waits): its message in the broker is dropped
        /// when it surfaces.
        let lease: AMQPDelivery?
        /// Bumped whenever the machine sets or clears the timer: only an
        /// entry of the current generation fires.
        var timerGeneration = 0
        /// Set while delivered to an agent: the route and the window its lease holds a slot of.
        var inFlight: (route: RoutingTable.Route, window: LeaseWindow)?
    }

    /// Which consumer window a lease holds a slot of. The inbox and retry
    /// windows are shared by all targets, so each target may hold only its
    /// share of them with agents (`share`); past it, a dispatch waits in its
    /// target's park queue, whose window is the target's own.
    enum LeaseWindow: String, Sendable {
        case inbox, retry, park, none
    }

    static let inboxPrefetch: UInt16 = 500
    static let retryPrefetch: UInt16 = 100

    /// How a shared window's slots are shared out among the targets (`WindowShare`).
    func shareRule(of window: LeaseWindow) -> WindowShare? {
        switch window {
        case .inbox: return WindowShare(prefetch: Int(Self.inboxPrefetch), targets: routes.count)
        case .retry: return WindowShare(prefetch: Int(Self.retryPrefetch), targets: routes.count)
        case .park, .none: return nil  // a window of the target's own
        }
    }

    /// True when `route` may take one more slot of `window` for a delivery.
    func hasRoom(_ route: RoutingTable.Route, in window: LeaseWindow) -> Bool {
        shareRule(of: window)?.hasRoom(held: inFlightCounts[InFlightKey(route: route, window: window)] ?? 0, windowHeld: windowTotals[window] ?? 0)
            ?? true
    }

    struct InFlightKey: Hashable {
        let route: RoutingTable.Route
        let window: LeaseWindow
    }

    /// How often due timers are looked for: reply timeouts and expiry fire
    /// at most this late (the contract allows 5 s for expiry).
    static let tickInterval = Duration.milliseconds(100)
    /// A publish window unconfirmed this long is reported (once): its term has stalled behind it.
    static let lateConfirmWarning = Duration.seconds(5)

    let connection: AMQPConnection
    /// Where the term publishes; replaced after a redirected nack or a
    /// nacked task (`flush`).
    private(set) var publisher: AMQPChannel
    private var publisherSince = ContinuousClock.now
    /// Set when the broker nacked a task (the window went on without it).
    let taskNacked: Flag

    let table: RoutingTable
    /// The partition this term leads, of how many, and its routes.
    let partition: Int
    let partitions: SenderPartitions
    let routes: [RoutingTable.Route]
    /// This term's number in its status log (a log may be shared by the terms of one replica).
    let term: UInt32
    /// Replies that partition 0's leader could not place yet (their
    /// dispatch's partition not in its log yet), in order, per dispatch.
    var heldReplies: [String: (since: Date, deliveries: [AMQPDelivery])] = [:]
    /// The marker the held replies wait for, and when it was published.
    var replyMarker: (marker: String, publishedAt: Date)?
    /// Commands remembered lately: looked at again each tick, as a dispatch
    /// moved here by another partition's reroute may show up in the log a
    /// moment after its command.
    var recentCommands: [(command: SenderCommand, at: Date, passedOn: PassedOn?)] = []
    let policy: RetryPolicy
    let logger: Logger
    let metrics: SenderMetrics
    let feed = BatchQueue<Input>()
    let settler: WindowSettler
    /// Messages of the inputs handled so far in this batch, published in one
    /// window by `flush()`; the settler acks the leases they settle once
    /// the window is confirmed.
    var pendingMessages: [OutboundMessage] = []
    var pendingAcks: [AMQPDelivery] = []

    var held: [String: Held] = [:]
    /// Dispatches with agents, by target and the window their lease holds a slot of.
    var inFlightCounts: [InFlightKey: Int] = [:]
    /// The slots each window's deliveries hold, over every target.
    var windowTotals: [LeaseWindow: Int] = [:]
    /// The held dispatches' timers, one heap for all (a sleeping task per
    /// dispatch cost a task switch to create and another to cancel).
    var timers = DeadlineQueue<String>()
    /// Dispatches finished since the status log was last pruned.
    var finishedSincePrune = 0
    /// Delay queues declared in this term.
    var delayQueues: Set<String> = []
    var pendingCommands = PendingCommands()
    var lastCommandsPrune = Date.distantPast
    var lastExpirySweep = Date.distantPast
    /// At most this many commands for dispatches not seen yet are kept (a
    /// flood of cancels for unknown ids must not grow memory without bound).
    static let maxPendingCommands = 100_000
    var presence: PresenceSnapshot = [:]
    /// Parks whose copies have not surfaced yet: the presence poll may not count them.
    var recentParks = RecentParks<RoutingTable.Route>()
    var parkConsumers: [RoutingTable.Route: AMQPConsumer] = [:]
    /// Each target's park consumer channel, kept across its consumers.
    var parkChannels: [RoutingTable.Route: AMQPChannel] = [:]
    /// The task passing on each target's latest park consumer's deliveries.
    var parkForwarders: [RoutingTable.Route: Task<Void, Never>] = [:]
    var forwarders: [Task<Void, Never>] = []

    /// What the status events published so far say (earlier leaders
    /// included), and which dispatches this term accepted or finished: a
    /// late duplicate (a hand-off re-sent by a router that died before its
    /// ack, or a second parked copy) is dropped.
    let statusLog: StatusLog

    /// This sender's broker login: the `user_id` of its internal messages.
    let login: String
    /// Who may write hand-offs (the router and the sender) and the sender's
    /// own copies (the sender alone).
    let handOffWriters: InternalWriters
    let copyWriters: InternalWriters

    init(
        connection: AMQPConnection, publisher: AMQPChannel, table: RoutingTable, partition: Int = 0, partitions: SenderPartitions = .one,
        policy: RetryPolicy, logger: Logger, metrics: SenderMetrics, statusLog: StatusLog, login: String, routerLogin: String
    ) {
        self.partition = partition
        self.partitions = partitions
        routes = partitions.routes(partition, of: table)
        term = statusLog.newTerm()
        self.login = login
        handOffWriters = InternalWriters([login, routerLogin])
        copyWriters = InternalWriters([login])
        self.statusLog = statusLog
        // A task the agent's queue refused is that dispatch's failed attempt,
        // not the term's: an agent's login may declare its own queue with a
        // length limit, or delete it, and one target's agents must not end
        // the term every other target's dispatches live in.
        let taskNacked = Flag()
        self.taskNacked = taskNacked
        settler = WindowSettler(tolerates: { [feed] message, error in
            guard let refused = SenderTerm.refusedTask(message, error) else { return false }
            if error.code == .nacked { taskNacked.set() }
            feed.yield(.taskRefused(id: refused.id, attempt: refused.attempt, reason: refused.reason))
            return true
        }, failed: { [feed] in feed.finish() })
        self.connection = connection
        self.publisher = publisher
        self.table = table
        self.policy = policy
        self.logger = logger
        self.metrics = metrics
    }

    func online(_ r: RoutingTable.Route) -> Bool { (presence[r]?.consumers ?? 0) > 0 }

    /// The route is this term's partition's.
    func owns(_ r: RoutingTable.Route) -> Bool { partitions.partition(of: r) == partition }

    /// Partition 0's leader takes every agent reply and every expired copy,
    /// and passes on those of the other partitions.
    var passesOn: Bool { partition == 0 && partitions.count > 1 }

    /// Runs the term until its connection fails or `stop` is set.
    func run(replayedCommands: [(command: SenderCommand, at: Date)]) async throws {
        // A reroute kept for a dispatch the sender has had since (its events
        // go past routing) was applied then; replayed now it could undo a
        // later reroute. Cancels are kept: one that was applied ended the
        // dispatch, and a late copy of an ended dispatch is dropped anyway.
        for (c, at) in replayedCommands {
            if case .reroute = c, (statusLog[c.id]?.lastSeq ?? 0) > 2 { continue }
            remember(c, at: at, persist: false)
        }
        // Know who is online before the first hand-off: one that arrives at
        // once must go straight to an online agent, not through the park queue.
        var presenceChannel = try await connection.openChannel()
        try await presenceChanged(try await Self.presenceSnapshot(&presenceChannel, connection, routes: routes), now: Date())
        try await forward(queue: SenderTopology.inbox(partition), prefetch: Self.inboxPrefetch) { .inbox($0) }
        try await forward(queue: SenderTopology.replies(partition), prefetch: passesOn ? 2000 : 500) { .reply($0) }
        try await forward(queue: SenderTopology.expired(partition), prefetch: 100) { .expired($0) }
        try await forward(queue: SenderTopology.retry(partition), prefetch: Self.retryPrefetch) { .retryDue($0) }
        if passesOn { try await watchSending() }
        // The presence polls and the tick run on the connection's thread too:
        // from the pool, each poll's declares would hop there and back (two
        // wake-ups a declare, ten declares every 300 ms with five targets).
        forwarders.append(Task(executorPreference: connection.executor) { [feed, routes, presenceChannel, connection] in
            await SenderTerm.pollPresence(channel: presenceChannel, connection, routes: routes, feed: feed)
        })
        forwarders.append(Task(executorPreference: connection.executor) { [feed, settler, logger, partition, connection] in
            await SenderTerm.tick(feed, settler: settler, connection: connection, logger: logger, partition: partition)
        })
        defer {
            if let pending = replyMarker { statusLog.giveUp(marker: pending.marker) }
            statusLog.dropTentatives(term: term)
            for f in forwarders { f.cancel() }
            for f in parkForwarders.values { f.cancel() }
            // A term that ended leads nothing: its per-target figures go to 0.
            for route in routes {
                metrics.agents.set(0, route.description)
                metrics.parked.set(0, route.description)
                metrics.inFlight.set(0, route.description)
            }
        }
        // Whatever gathered while the last batch was handled is handled
        // together: one publish window, settled by the settler.
        do {
            while let batch = await feed.next() {
                try settler.check()
                // Cancels and reroutes first: a dispatch that surfaces in the same
                // batch must not be delivered before a command already in the broker.
                for input in batch where input.isCommand { try await handle(input) }
                for input in batch where !input.isCommand { try await handle(input) }
                try await flush()
            }
            try settler.check()
        } catch {
            // A nacked status event may be in the log and not in the surfaces'
            // queues: the next leader, its log showing the dispatch ended, would
            // drop its lease, and no surface would see the end. Published again
            // first, while this connection still holds the lock. (Status events
            // only: a waiting record alone, without its park copy, would claim
            // a copy the broker does not have.)
            let (published, left) = await settler.publishFailedAgain(on: connection, within: Self.publishAgainWithin) {
                $0.exchange == SharedTopology.statusExchange
            }
            if published + left > 0 {
                logger.warning("published a failed window's events again before ending the term", [
                    ("published", .int(published)), ("left", .int(left)), ("partition", .int(partition)),
                ])
            }
            throw error
        }
    }

    /// The dispatch and attempt of a task the broker refused (a nack: its
    /// queue is full and rejects publishes; a return: its queue is gone),
    /// or nil for any other message or failure.
    static func refusedTask(_ message: OutboundMessage, _ error: AMQPError) -> (id: String, attempt: Int, reason: String)? {
        guard error.code == .nacked || error.code == .returned, message.properties.type == AgentTask.type,
            let id = message.properties.correlationID, let messageID = message.properties.messageID,
            let slash = messageID.lastIndex(of: "/"), let attempt = Int(messageID[messageID.index(after: slash)...])
        else { return nil }
        let why = error.code == .nacked
            ? "the broker nacked it (its queue is full and rejects publishes, or lost its leader)" : "its queue does not exist"
        return (id, attempt, "the broker did not take the task for \(message.routingKey): \(why)")
    }

    /// How long a term that failed tries to publish its nacked events again.
    static let publishAgainWithin = Duration.seconds(5)

    /// Publishes what this batch produced, without waiting: the settler acks
    /// the leases it settled once the broker has confirmed it.
    func flush() async throws {
        guard !pendingMessages.isEmpty || !pendingAcks.isEmpty else { return }
        let messages = pendingMessages, acks = pendingAcks
        pendingMessages = []
        pendingAcks = []
        // Confirmed events and waiting records go into the status log, in
        // their order, before their leases are acked.
        let noted = messages.filter {
            $0.exchange == SharedTopology.statusExchange || ($0.routingKey == SenderTopology.statusLog && $0.properties.type == StatusLog.waitingType)
        }
        // A nack the channel answered by the event's way (a surface's queue
        // refused it), or a nacked task (its agent queue refused it), leaves
        // the window confirmed, but on RabbitMQ 3.10 the channel may go on
        // refusing that queue for good (a dead leader, see
        // `AMQPClient.retireIfNacked`): the term moves to a new channel, at
        // most once a second, and the old one closes once settled. Windows
        // still settle in publish order, whichever channel they went on
        // (surfaces order a dispatch's events by seq, not by arrival).
        let refused = taskNacked.take() || publisher.hadRedirectedNack
        if refused, ContinuousClock.now - publisherSince >= AMQPClient.retireInterval {
            let fresh = try await connection.openChannel()
            try await fresh.confirmSelect()
            publisher.closeWhenSettled()
            publisher = fresh
            publisherSince = .now
        }
        try await settler.publish(messages, on: publisher, acks: acks) { [statusLog] in
            for m in noted {
                if m.exchange == SharedTopology.statusExchange {
                    statusLog.note(properties: m.properties, routingKey: m.routingKey)
                } else {
                    statusLog.noteWaitingRecord(properties: m.properties, body: m.body)
                }
            }
        }
    }

    /// Consumes `queue` straight into the term's feed (on the connection
    /// thread: one task hop less per delivery). A consumer that ends ends
    /// the term.
    private func forward(queue: String, prefetch: UInt16, _ wrap: @escaping @Sendable (AMQPDelivery) -> Input) async throws {
        let channel = try await connection.openChannel()
        try await channel.qos(prefetchCount: prefetch)
        _ = try await channel.consume(queue: queue, deliver: { [feed] in feed.yield(wrap($0)) }, finished: { [feed] _ in feed.finish() })
    }

    /// Partition 0's leader learns each delivered dispatch's partition from
    /// its `sending` event as the exchange routes it (a queue of its own),
    /// not from the stream a moment later: an instant agent's reply would
    /// otherwise often come first and wait.
    private func watchSending() async throws {
        let channel = try await connection.openChannel()
        let queue = "frontdesk.sender.sending.\(UUID().uuidString.lowercased())"
        try await channel.queueDeclare(queue, durable: false, exclusive: true, autoDelete: true)
        try await channel.queueBind(queue, exchange: SharedTopology.statusExchange, routingKey: "status.*.*.sending")
        _ = try await channel.consume(queue: queue, noAck: true, deliver: { [feed, statusLog] d in
            guard SharedTopology.cameByTheStatusExchange(d), let id = d.properties.correlationID else { return }
            statusLog.note(properties: d.properties, routingKey: d.routingKey)
            feed.yield(.sendingSeen(id))
        }, finished: { [feed] _ in feed.finish() })
    }

    /// Feeds a `.tick` every `tickInterval`; and reports a publish window
    /// overdue for its confirms — from here, not from the term's loop, which
    /// may itself be waiting for that window.
    /// Timed by the connection's thread, where this task runs: a
    /// `Task.sleep` wakes a timer thread, which wakes the connection's
    /// (about six context switches a tick, most of the idle sender's).
    static func tick(_ feed: BatchQueue<Input>, settler: WindowSettler, connection: AMQPConnection, logger: Logger, partition: Int) async {
        while !Task.isCancelled {
            await connection.sleep(for: tickInterval)
            guard connection.isOpen, !Task.isCancelled else { return }  // closed: the sleep ends at once from now on
            feed.yield(.tick)
            if let waited = settler.overdueWindow(after: lateConfirmWarning) {
                // Nothing after it is acked meanwhile. Its status events and
                // log records are published again (repeatable); should their
                // copies go unconfirmed too, the confirm timeout ends the term.
                logger.warning("a publish window waits for its confirms", [
                    ("waited_ms", .int(Int(waited / .milliseconds(1)))), ("partition", .int(partition)),
                    ("republished_total", .int(connection.republishedMessages)),
                ])
            }
        }
    }
}
