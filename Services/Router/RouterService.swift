import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

/// Intake: validates each message on `frontdesk.commands`, de-duplicates
/// requests through the decision log, publishes drafted/routing (or failed)
/// and hands routed dispatches, cancels and reroutes to the sender. Every
/// effect is publisher-confirmed before the intake message is acked.
struct RouterService: Service {
    let client: AMQPClient
    let log: DecisionLog
    let resolver: RouteResolver
    let configuration: ServiceConfiguration
    let logger: Logger
    let metrics: RouterMetrics
    let intake: IntakeHandle

    /// Lets `shutdown()` stop the intake consumer that `run()` started.
    final class IntakeHandle: Sendable {
        /// Stops the intake consumer (basic.cancel); what it already delivered is still handled.
        let stop = AsyncHolder<@Sendable () async -> Void>()
        /// Ends when every in-flight handler has finished after intake stopped.
        let drained = AsyncStream<Void>.makeStream()
    }

    func run() async throws {
        // The router's tasks run on its connection's thread: a read-back or a
        // delivery resumes them there, with no thread of the pool to wake.
        await withTaskExecutorPreference(client.executor) { await runOnConnection() }
    }

    private func runOnConnection() async {
        await withDiscardingTaskGroup { group in
            group.addTask { await log.follow() }
            // Deliveries go straight from the connection thread into the batch
            // queue; prefetch covers two batches: one being decided while the
            // one before it is published and acked.
            let batches = BatchQueue<AMQPDelivery>(limit: Int(Self.batchLimit))
            let stop = await client.consume(
                ConsumerSpecification(queue: RouterTopology.intakeQueue, prefetchCount: 2 * Self.batchLimit),
                deliver: { batches.yield($0) }, ended: { batches.finish() })
            // Messages that expired in the intake (a producer's `expiration`)
            // come here, and are dead-lettered with the reason (`plan`).
            let stopExpired = await client.consume(
                ConsumerSpecification(queue: RouterTopology.expiredQueue, prefetchCount: Self.batchLimit),
                deliver: { batches.yield($0) }, ended: {})
            await intake.stop.set {
                await stopExpired()
                await stop()
            }
            // A pipeline: batch k+1 is decided (decision log) and its window
            // published while batch k still waits for its confirms. Settling
            // stays in batch order, so a batch can be acked with one
            // `multiple` ack: every lower tag is settled.
            let settlement = InOrderSettlement()
            // While requests come often enough, a small batch waits a few
            // milliseconds for more (timed by the connection's thread): a
            // dispatch alone costs nearly what a batch of several does.
            var linger = BatchLinger(linger: .milliseconds(configuration.intakeLingerMs), limit: Int(Self.batchLimit))
            while var batch = await batches.next() {
                // The handling time a batch reports includes its wait.
                let started = ContinuousClock.now
                var gained: Int?
                if let wait = linger.wait(for: batch.count) {
                    await client.sleep(for: wait)
                    let more = batches.takeAvailable(upTo: linger.limit - batch.count)
                    batch += more
                    gained = more.count
                }
                linger.took(batch.count, gained: gained, at: .now)
                let decided = await decide(batch, started: started)
                await publish(decided, settlement.issue(), settlement)
            }
            await settlement.idle()
            // Intake stopped and every handler finished: stop the rest.
            intake.drained.continuation.finish()
            await client.shutdown()
        }
    }

    func shutdown() async {
        // Under a resource alarm the intake's cancel would wait for the alarm to clear.
        client.abandonBlockedConnections()
        if let stop = await intake.stop.get() {
            await stop()
            for await _ in intake.drained.stream {}
        } else {
            await client.shutdown()
        }
    }

    // MARK: Handling

    /// What one delivery needs before it can be acked.
    enum Plan {
        /// Publish these (confirmed), then ack; `counted` goes to the metrics.
        case publish([OutboundMessage], counted: Counted)
        /// Needs the decision log first.
        case decide(DispatchRecord, body: Data, deadLetter: (DeadLetterCode, String)?)
        /// Ack with nothing to publish (a duplicate).
        case drop(Counted)
        /// Hand back for a later try.
        case retry(any Error)
    }

    enum Counted {
        case accepted(confidence: Double?), failed, duplicate, deadLetter(DeadLetterCode), command(String)
    }

    static let batchLimit: UInt16 = 256

    /// A batch whose plans are final: only publishing and acking are left.
    struct DecidedBatch: Sendable {
        var deliveries: [AMQPDelivery]
        var plans: [Plan]
        var started: ContinuousClock.Instant
    }

    /// Plans a batch: one decision-log append for its new ids.
    func decide(_ batch: [AMQPDelivery], started: ContinuousClock.Instant) async -> DecidedBatch {
        var plans = batch.map(plan)
        let pending = plans.indices.compactMap { i -> (Int, DispatchRecord, Data, (DeadLetterCode, String)?)? in
            guard case .decide(let record, let body, let dl) = plans[i] else { return nil }
            return (i, record, body, dl)
        }
        if !pending.isEmpty {
            let appended = await log.append(pending.map { ($0.1, $0.2) })
            for ((i, record, body, dl), result) in zip(pending, appended) {
                switch result {
                case .success(let (winner, token)) where winner.token == token:
                    plans[i] = complete(record, body: body, batch[i], dl)
                case .success(let (winner, _)):
                    plans[i] = completeOrDrop(winner, candidate: record, batch[i], dl)
                case .failure(let error):
                    plans[i] = .retry(error)
                }
            }
        }
        return DecidedBatch(deliveries: batch, plans: plans, started: started)
    }

    /// Publishes a decided batch's events, dead letters and hand-offs in one
    /// window, without waiting for the confirms; the batch settles as
    /// `number` of `settlement` once they are in.
    func publish(_ decided: DecidedBatch, _ number: UInt64, _ settlement: InOrderSettlement) async {
        var messages: [OutboundMessage] = []
        var owners: [Int] = []
        for (i, p) in decided.plans.enumerated() {
            if case .publish(let m, _) = p {
                messages += m
                owners += Array(repeating: i, count: m.count)
            }
        }
        guard !messages.isEmpty else {
            return settlement.complete(number, settleWork(decided, failed: [:]))
        }
        // The confirms arrive on the connection thread, which settles the
        // batch there when nothing has to be handed back.
        let settle: @Sendable (Result<PublishConfirms.Results, any Error>) -> Void = { [owners, messages] outcome in
            var failed: [Int: any Error] = [:]
            switch outcome {
            case .success(let results):
                for (j, (owner, result)) in zip(owners, results).enumerated() {
                    // Which of its messages failed: a nack names no queue.
                    if case .failure(let error) = result, failed[owner] == nil {
                        failed[owner] = FailedPublish(error: error, exchange: messages[j].exchange, routingKey: messages[j].routingKey)
                    }
                }
            case .failure(let error):
                for owner in owners { failed[owner] = error }
            }
            settlement.complete(number, settleWork(decided, failed: failed))
        }
        do {
            _ = try await client.publishWithoutWaiting(messages, then: settle)
        } catch {
            settle(.failure(error))
        }
    }

    /// A message of a window that failed, for the log: which one it was.
    struct FailedPublish: Error, CustomStringConvertible {
        let error: AMQPError
        let exchange: String
        let routingKey: String
        var description: String { "\(error) (publishing to exchange '\(exchange)' with key '\(routingKey)')" }
    }

    /// Acks (or hands back) a batch's deliveries once its confirms are in:
    /// at once when all went through, after a back-off when some must come again.
    func settleWork(_ decided: DecidedBatch, failed: [Int: any Error]) -> InOrderSettlement.Work {
        let (batch, plans) = (decided.deliveries, decided.plans)
        var retries: [AMQPDelivery] = []
        var settled: [AMQPDelivery] = []
        var counts: [Counted] = []
        for (i, p) in plans.enumerated() {
            switch p {
            case .publish(_, let counted) where failed[i] == nil:
                counts.append(counted)
                settled.append(batch[i])
            case .drop(let counted):
                counts.append(counted)
                settled.append(batch[i])
            case .retry(let error):
                logger.warning("will retry a message", [("error", .string("\(error)")), ("routing_key", .string(batch[i].routingKey))])
                retries.append(batch[i])
            default:
                logger.warning("will retry a message", [("error", .string("\(failed[i].map { "\($0)" } ?? "?")")), ("routing_key", .string(batch[i].routingKey))])
                retries.append(batch[i])
            }
        }
        let finish: @Sendable () -> Void = { [self, counts, settled] in
            for c in counts { count(c) }
            // The rest with one ack per consumer (a reconnect starts a new
            // consumer and new tags); any retries were settled just before.
            for (_, deliveries) in Dictionary(grouping: settled, by: \.consumerTag) {
                let last = deliveries.max { $0.deliveryTag < $1.deliveryTag }!
                try? last.ack(multiple: true)
            }
            let seconds = (ContinuousClock.now - decided.started).inSeconds
            for _ in batch { metrics.handling.observe(seconds) }
        }
        guard !retries.isEmpty else { return .now(finish) }
        return .later { [retries, client] in
            // Back off a little, then hand them back: they come again, marked
            // redelivered. While a resource alarm blocks publishing, hold them
            // until it clears (or the connection goes): handing them back at
            // once would only spin, and count deliveries against them.
            try? await Task.sleep(for: .milliseconds(200))
            while client.blockedReason != nil, client.connectionState.isReady {
                try? await Task.sleep(for: .milliseconds(100))
            }
            for d in retries { try? d.nack(requeue: true) }
            finish()
        }
    }

    private func count(_ counted: Counted) {
        switch counted {
        case .accepted(let confidence):
            metrics.requests.increment("accepted")
            if let confidence { metrics.confidence.observe(confidence) }
        case .failed: metrics.requests.increment("failed")
        case .duplicate: metrics.requests.increment("duplicate")
        case .deadLetter(let code): metrics.deadLetters.increment(code.rawValue)
        case .command(let kind): metrics.commands.increment(kind)
        }
    }

    func plan(_ delivery: AMQPDelivery) -> Plan {
        // Expired in the intake before it was read (the router down or
        // behind): its producer said not to act on it after that, so it is not
        // handled, but it is not lost either. (Anyone who may publish to the
        // default exchange can put a message on that queue by name, with any
        // `x-death`: such a message is only ever dead-lettered, never a command.)
        if delivery.routingKey == RouterTopology.expiredQueue {
            // From a header anyone may write: cut as a routing key is.
            let key = delivery.deadLetteredRoutingKey.map { "'\($0.utf8Prefix(FieldTable.maxShortStringBytes))'" } ?? "unknown"
            let reason = "the message (routing key \(key)) expired in the router's intake before the router read it: its producer set an expiration"
            logger.info("dead-lettered", [("code", .string(DeadLetterCode.invalidRequest.rawValue)), ("reason", .string(reason))])
            return .publish([deadLetterMessage(delivery, .invalidRequest, reason)], counted: .deadLetter(.invalidRequest))
        }
        let now = Date()
        switch IntakeClassifier.classify(routingKey: delivery.routingKey, type: delivery.properties.type, body: delivery.body) {
        case .reject(let code, let reason, nil, _):
            logger.info("dead-lettered", [("code", .string(code.rawValue)), ("reason", .string(reason)), ("routing_key", .string(delivery.routingKey))])
            return .publish([deadLetterMessage(delivery, code, reason)], counted: .deadLetter(code))
        case .reject(let code, let reason, let id?, let input):
            let record = RouterDecision.invalid(
                id: id, input: input, reason: reason, body: delivery.body, now: now, lifetimeSeconds: configuration.lifetimeSeconds)
            return decideOrReuse(record, delivery, (code, reason))
        case .request(let request):
            let record = RouterDecision.decide(
                request, body: delivery.body, resolver: resolver, now: now, lifetimeSeconds: configuration.lifetimeSeconds)
            return decideOrReuse(record, delivery, nil)
        case .notForRouter:
            return .publish([], counted: .command("activity"))
        case .cancel(let cancel):
            return .publish(handOffs(SenderCommand(cancel)), counted: .command("cancel"))
        case .reroute(let reroute):
            guard resolver.table.target(reroute.route) != nil else {
                let reason = "the reroute names \(reroute.route.description), which is no target of the routing table"
                logger.info("dead-lettered", [("code", "unknown_target"), ("reason", .string(reason))])
                return .publish([deadLetterMessage(delivery, .unknownTarget, reason)], counted: .deadLetter(.unknownTarget))
            }
            return .publish(handOffs(SenderCommand(reroute)), counted: .command("reroute"))
        }
    }

    /// An id this replica already knows is settled without the log; a new
    /// one must go through it.
    private func decideOrReuse(_ record: DispatchRecord, _ delivery: AMQPDelivery, _ dl: (DeadLetterCode, String)?) -> Plan {
        if let existing = log.first(record.id) { return completeOrDrop(existing, candidate: record, delivery, dl) }
        return .decide(record, body: record.jsonData(), deadLetter: dl)
    }

    /// An id that was decided before: a redelivery of the same message
    /// finishes that decision (its previous handler may have died midway,
    /// and re-publishing gives the same events); anything else is a duplicate.
    private func completeOrDrop(
        _ decided: DecisionLog.Entry, candidate: DispatchRecord, _ delivery: AMQPDelivery, _ dl: (DeadLetterCode, String)?
    ) -> Plan {
        if delivery.redelivered, let record = decided.record, record.bodyFingerprint == candidate.bodyFingerprint {
            return complete(record, body: decided.body, delivery, dl)
        }
        logger.info("duplicate request dropped", [("dispatch_id", .string(candidate.id))])
        return .drop(.duplicate)
    }

    private func complete(_ record: DispatchRecord, body: Data, _ delivery: AMQPDelivery, _ dl: (DeadLetterCode, String)?) -> Plan {
        var messages = record.events().map(Self.statusMessage)
        if let (code, reason) = dl { messages.append(deadLetterMessage(delivery, code, reason)) }
        if record.outcome == .routed {
            // To the partition of its route (every routed record names one; 0 otherwise).
            let partition = record.project.flatMap { p in record.target.map { t in RoutingTable.Route(project: p.id, target: t.id) } }
                .map(configuration.senderPartitions.partition(of:)) ?? 0
            messages.append(OutboundMessage(
                exchange: SharedTopology.handOffExchange, routingKey: SharedTopology.senderInbox(partition: partition), body: body,
                properties: .persistentJSON(messageID: "\(record.id)/handoff", correlationID: record.id, type: DispatchRecord.handoffType)
                    .stamped(by: configuration.login),
                mandatory: true))
        }
        return .publish(messages, counted: record.outcome == .routed ? .accepted(confidence: record.route?.confidence) : .failed)
    }

    static func statusMessage(_ event: StatusEvent) -> OutboundMessage {
        SharedTopology.statusEvent(
            routingKey: event.routingKey, body: event.jsonData(),
            properties: .persistentJSON(messageID: event.messageID, correlationID: event.dispatchId, type: StatusEvent.type))
    }

    /// A validated cancel or reroute for the sender: body and properties
    /// written here, nothing of the producer's message carried over. To
    /// every partition: a command names only its dispatch, whose partition
    /// (its route's, changed by a reroute) only the sender knows; the
    /// partition that holds the dispatch acts, the others remember it.
    private func handOffs(_ command: SenderCommand) -> [OutboundMessage] {
        configuration.senderPartitions.all.map { k in
            OutboundMessage(
                exchange: SharedTopology.handOffExchange, routingKey: SharedTopology.senderInbox(partition: k), body: command.jsonData(),
                properties: .persistentJSON(messageID: "\(command.id)/\(command.type)", correlationID: command.id, type: command.type)
                    .stamped(by: configuration.login),
                mandatory: true)
        }
    }

    private func deadLetterMessage(_ delivery: AMQPDelivery, _ code: DeadLetterCode, _ reason: String) -> OutboundMessage {
        SharedTopology.deadLetter(delivery, code: code, reason: reason, service: "frontdesk-router")
    }
}

/// A value set once by one task and read by another.
actor AsyncHolder<Value: Sendable> {
    private var value: Value?
    func set(_ v: Value) { value = v }
    func get() -> Value? { value }
}
