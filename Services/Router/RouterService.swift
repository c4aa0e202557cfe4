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
        let consumer = AsyncHolder<ClientConsumer>()
        /// Ends when every in-flight handler has finished after intake stopped.
        let drained = AsyncStream<Void>.makeStream()
    }

    func run() async throws {
        await withDiscardingTaskGroup { group in
            group.addTask { await log.follow() }
            let deliveries = await client.consume(ConsumerSpecification(queue: RouterTopology.intakeQueue, prefetchCount: 256))
            await intake.consumer.set(deliveries)
            await withDiscardingTaskGroup { handlers in
                for await delivery in deliveries {
                    handlers.addTask { await handle(delivery) }
                }
            }
            // Intake stopped and every handler finished: stop the rest.
            intake.drained.continuation.finish()
            await client.shutdown()
        }
    }

    func shutdown() async {
        if let consumer = await intake.consumer.get() {
            await consumer.stop()
            for await _ in intake.drained.stream {}
        } else {
            await client.shutdown()
        }
    }

    // MARK: Handling

    func handle(_ delivery: AMQPDelivery) async {
        let started = ContinuousClock.now
        do {
            try await process(delivery)
            try delivery.ack()
        } catch {
            logger.warning("will retry a message", [("error", .string("\(error)")), ("routing_key", .string(delivery.routingKey))])
            // Back off a little, then hand it back: it comes again, marked redelivered.
            try? await Task.sleep(for: .milliseconds(200))
            try? delivery.nack(requeue: true)
        }
        let elapsed = ContinuousClock.now - started
        metrics.handling.observe(Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
    }

    func process(_ delivery: AMQPDelivery) async throws {
        let now = Date()
        switch IntakeClassifier.classify(routingKey: delivery.routingKey, type: delivery.properties.type, body: delivery.body) {
        case .reject(let code, let reason, nil, _):
            try await deadLetter(delivery, code, reason)
        case .reject(let code, let reason, let id?, let input):
            let record = RouterDecision.invalid(
                id: id, input: input, reason: reason, body: delivery.body, now: now, lifetimeSeconds: configuration.lifetimeSeconds)
            try await settle(record, delivery, deadLetter: (code, reason))
        case .request(let request):
            let record = RouterDecision.decide(
                request, body: delivery.body, resolver: resolver, now: now, lifetimeSeconds: configuration.lifetimeSeconds)
            try await settle(record, delivery, deadLetter: nil)
        case .cancel(let cancel):
            try await handOff(delivery, type: "frontdesk.handoff.cancel.v1", id: cancel.id)
            metrics.commands.increment("cancel")
        case .reroute(let reroute):
            guard resolver.table.target(reroute.route) != nil else {
                try await deadLetter(delivery, .unknownTarget, "the reroute names \(reroute.route.description), which is no target of the routing table")
                return
            }
            try await handOff(delivery, type: "frontdesk.handoff.reroute.v1", id: reroute.id)
            metrics.commands.increment("reroute")
        }
    }

    /// Decides whether this delivery's record is the one that counts for its
    /// id, and completes it if so.
    func settle(_ record: DispatchRecord, _ delivery: AMQPDelivery, deadLetter dl: (DeadLetterCode, String)?) async throws {
        if let existing = log.first(record.id) {
            return try await completeOrDrop(existing.record, candidate: record, delivery, dl)
        }
        let (winner, token) = try await log.append(record)
        if winner.token == token {
            try await complete(record, delivery, dl)
        } else {
            try await completeOrDrop(winner.record, candidate: record, delivery, dl)
        }
    }

    /// An id that was decided before: a redelivery of the same message
    /// finishes that decision (its previous handler may have died midway,
    /// and re-publishing gives the same events); anything else is a duplicate.
    private func completeOrDrop(
        _ decided: DispatchRecord, candidate: DispatchRecord, _ delivery: AMQPDelivery, _ dl: (DeadLetterCode, String)?
    ) async throws {
        if delivery.redelivered && decided.bodyFingerprint == candidate.bodyFingerprint {
            try await complete(decided, delivery, dl)
            return
        }
        metrics.requests.increment("duplicate")
        logger.info("duplicate request dropped", [("dispatch_id", .string(candidate.id))])
    }

    private func complete(_ record: DispatchRecord, _ delivery: AMQPDelivery, _ dl: (DeadLetterCode, String)?) async throws {
        var messages = record.events().map(Self.statusMessage)
        if let (code, reason) = dl { messages.append(deadLetterMessage(delivery, code, reason)) }
        if record.outcome == .routed {
            messages.append(OutboundMessage(
                exchange: "", routingKey: RouterTopology.senderInbox, body: record.jsonData(),
                properties: .persistentJSON(messageID: "\(record.id)/handoff", correlationID: record.id, type: DispatchRecord.handoffType),
                mandatory: true))
        }
        for result in try await client.publish(messages) { try result.get() }
        if let (code, _) = dl { metrics.deadLetters.increment(code.rawValue) }
        metrics.requests.increment(record.outcome == .routed ? "accepted" : "failed")
        if let confidence = record.route?.confidence { metrics.confidence.observe(confidence) }
        logger.debug("decided", [("dispatch_id", .string(record.id)), ("outcome", .string(record.outcome.rawValue))])
    }

    static func statusMessage(_ event: StatusEvent) -> OutboundMessage {
        OutboundMessage(
            exchange: SharedTopology.statusExchange, routingKey: event.routingKey, body: event.jsonData(),
            properties: .persistentJSON(messageID: event.messageID, correlationID: event.dispatchId, type: StatusEvent.type))
    }

    private func handOff(_ delivery: AMQPDelivery, type: String, id: String) async throws {
        var properties = delivery.properties
        properties.type = type
        properties.correlationID = id
        properties.deliveryMode = 2
        try await client.publish(OutboundMessage(
            exchange: "", routingKey: RouterTopology.senderInbox, body: delivery.body, properties: properties, mandatory: true))
    }

    private func deadLetter(_ delivery: AMQPDelivery, _ code: DeadLetterCode, _ reason: String) async throws {
        try await client.publish(deadLetterMessage(delivery, code, reason))
        metrics.deadLetters.increment(code.rawValue)
        logger.info("dead-lettered", [("code", .string(code.rawValue)), ("reason", .string(reason)), ("routing_key", .string(delivery.routingKey))])
    }

    /// The original body and properties, plus the four headers of CONTRACT.md.
    private func deadLetterMessage(_ delivery: AMQPDelivery, _ code: DeadLetterCode, _ reason: String) -> OutboundMessage {
        var properties = delivery.properties
        var headers = properties.headers ?? FieldTable()
        headers["x-frontdesk-error"] = .string(code.rawValue)
        headers["x-frontdesk-reason"] = .string(reason)
        headers["x-frontdesk-service"] = "frontdesk-router"
        headers["x-frontdesk-routing-key"] = .string(delivery.routingKey)
        properties.headers = headers
        properties.deliveryMode = 2
        return OutboundMessage(exchange: SharedTopology.deadLetterExchange, routingKey: delivery.routingKey, body: delivery.body, properties: properties)
    }
}

/// A value set once by one task and read by another.
actor AsyncHolder<Value: Sendable> {
    private var value: Value?
    func set(_ v: Value) { value = v }
    func get() -> Value? { value }
}
