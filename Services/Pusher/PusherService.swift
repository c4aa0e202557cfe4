import AMQP
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// The pusher's broker objects.
enum PusherTopology {
    /// `dispatch.activity` registrations from `frontdesk.commands`. Quorum.
    static let registrations = "frontdesk.pusher.registrations"
    /// Every registration (and every token dropped), kept a day: each replica
    /// reads it from the start of the lifetime window. A stream.
    static let tokens = "frontdesk.pusher.tokens"
    /// Every status event, for the one pusher that acts (single active
    /// consumer: another replica takes over when it goes). Quorum, bounded.
    static let status = "frontdesk.pusher.status"

    static let tokenType = "frontdesk.pusher.token.v1"
    static let dropType = "frontdesk.pusher.drop.v1"
    static let markerType = "frontdesk.pusher.marker.v1"

    static func declare(on channel: AMQPChannel) async throws {
        // The shared exchanges and the dead-letter queue with its binding: on a broker
        // where only the pusher has run, a registration's dead letter must land somewhere.
        try await SharedTopology.declare(on: channel)
        try await channel.queueDeclare(registrations, arguments: ["x-queue-type": "quorum"])
        try await channel.queueBind(registrations, exchange: SharedTopology.commandsExchange, routingKey: CommandKey.activity)
        try await channel.queueDeclare(tokens, arguments: ["x-queue-type": "stream", "x-max-age": "1D"])
        try await channel.queueDeclare(status, arguments: [
            "x-queue-type": "quorum", "x-single-active-consumer": .bool(true),
            "x-max-length": .int64(1_000_000), "x-overflow": "drop-head",
        ])
        try await channel.queueBind(status, exchange: SharedTopology.statusExchange, routingKey: "status.#")
    }
}

/// frontdesk-pusher: each status event of a dispatch with a registered push
/// token becomes an ActivityKit push to APNs (CONTRACT.md, Live Activity pushes).
final class PusherService: Service {
    struct Settings: Sendable {
        var apnsURL: String?
        var bundleID: String
        var keyID: String
        var teamID: String
        var lifetimeSeconds: Int
        var login: String
        /// Seconds of failed pushes in a row (while others go through) after which a dispatch's pending update is let go.
        var giveUpSeconds: Int
    }

    let client: AMQPClient
    let settings: Settings
    let logger: Logger
    let metrics: PusherMetrics
    let apns: APNsClient
    let key: SigningKey

    private struct Registered: Sendable {
        var registration: PushRegistration
        var at: Date
    }

    private let tokens = Mutex<[String: Registered]>([:])
    /// The newest status event of each dispatch that had no token yet (acked):
    /// a token read a moment later pushes it at once, so a dispatch faster than
    /// its registration's trip through the token log still shows its state.
    private let untokened = Mutex(Untokened())
    /// The newest event of each dispatch with no token yet, within a count and
    /// a byte budget (most dispatches never get a token; an event can be ~20 KB).
    struct Untokened {
        var events: [String: (seq: Int, body: Data)] = [:]
        var bytes = 0

        mutating func keep(_ id: String, seq: Int, body: Data) {
            if let old = events[id] {
                guard old.seq < seq else { return }
                bytes -= old.body.count
            }
            while events[id] == nil, events.count >= PusherService.maxUntokened || bytes + body.count > PusherService.maxUntokenedBytes,
                let any = events.keys.first
            {
                bytes -= events.removeValue(forKey: any)?.body.count ?? 0
            }
            events[id] = (seq, body)
            bytes += body.count
        }

        mutating func take(_ id: String) -> (seq: Int, body: Data)? {
            guard let e = events.removeValue(forKey: id) else { return nil }
            bytes -= e.body.count
            return e
        }
    }
    static let maxUntokened = 100_000
    static let maxUntokenedBytes = 64 << 20
    private let scheduler: Mutex<PushScheduler>
    private let held = Mutex<[UInt64: AMQPDelivery]>([:])
    private let nextTag = Atomic<UInt64>(0)
    private let providerToken = Mutex(ProviderTokenCache())
    private let caughtUp = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)
    private let stopSignal: AsyncStream<Void>.Continuation
    private let stopStream: AsyncStream<Void>

    init(client: AMQPClient, settings: Settings, logger: Logger, metrics: MetricsRegistry, apns: APNsClient, key: SigningKey) {
        self.client = client
        self.settings = settings
        self.logger = logger
        self.metrics = PusherMetrics(metrics)
        self.apns = apns
        self.key = key
        scheduler = Mutex(PushScheduler(giveUpAfter: TimeInterval(settings.giveUpSeconds)))
        (stopStream, stopSignal) = AsyncStream<Void>.makeStream()
    }

    var isReady: Bool { client.isReady && caughtUp.load(ordering: .acquiring) }

    func run() async throws {
        let marker = "pusher-\(UUID().uuidString)"
        let since = UInt64(max(0, Date().timeIntervalSince1970 - Double(settings.lifetimeSeconds) - 300))
        let stopTokens = await client.consume(
            ConsumerSpecification(queue: PusherTopology.tokens, prefetchCount: 1000, arguments: [AMQPStream.offsetArgument: .timestamp(since)]),
            deliver: { [self] d in
                takeTokenRecord(d, marker: marker)
                try? d.ack()
            },
            ended: {})
        // Registrations: validated, then written to the token log before their ack.
        let registrations = await client.consume(ConsumerSpecification(queue: PusherTopology.registrations, prefetchCount: 50))
        let registering = Task { [self] in
            for await d in registrations { await register(d) }
        }
        await writeMarker(marker)
        while !caughtUp.load(ordering: .acquiring), !stopped.load(ordering: .acquiring) {
            try? await Task.sleep(for: .milliseconds(20))
        }
        // A connection lost: the broker returns every unacked event to the queue (and another
        // replica may now act on it), so what this replica held is dropped unsent; told before
        // the next connection's first delivery, never after it (which it would drop too).
        client.onConnectionLost { [self] in dropHeldWork() }
        // Only once every token registered so far is known: the status events.
        let stopStatus = await client.consume(
            ConsumerSpecification(queue: PusherTopology.status, prefetchCount: 1000),
            deliver: { [self] d in takeStatus(d) },
            ended: {})
        let timer = Task { [self] in
            var ticks = 0
            while !stopped.load(ordering: .acquiring) {
                try? await Task.sleep(for: .milliseconds(100))
                perform(scheduler.withLock { $0.due(now: Date()) })
                ticks += 1
                if ticks % 600 == 0 {  // a minute
                    metrics.tokens.set(Double(tokens.withLock { $0.count }))
                    pruneTokens()
                    perform([.ack(scheduler.withLock { $0.forget(idleSince: Date().addingTimeInterval(-600)) })])
                }
            }
        }
        for await _ in stopStream { break }
        await stopStatus()
        await registrations.stop()
        registering.cancel()
        timer.cancel()
        await stopTokens()
        await apns.stop()
        // What was not pushed is returned to the broker: the next pusher sends it.
        let unsent = scheduler.withLock { $0.heldTags() }
        let deliveries = held.withLock { h in unsent.compactMap { h.removeValue(forKey: $0) } }
        for d in deliveries { try? d.nack(requeue: true) }
    }

    func shutdown() async {
        stopped.store(true, ordering: .releasing)
        stopSignal.yield()
        stopSignal.finish()
    }

    // MARK: Tokens

    private func writeMarker(_ marker: String) async {
        while !stopped.load(ordering: .acquiring) {
            do {
                try await client.publish(OutboundMessage(
                    exchange: "", routingKey: PusherTopology.tokens, body: Data("{}".utf8),
                    properties: AMQPProperties.persistentJSON(messageID: marker, type: PusherTopology.markerType).stamped(by: settings.login)))
                return
            } catch {
                try? await Task.sleep(for: .milliseconds(500))
            }
        }
    }

    private func takeTokenRecord(_ d: AMQPDelivery, marker: String) {
        guard d.properties.userID == settings.login else { return }  // only this service's own records
        switch d.properties.type {
        case PusherTopology.markerType:
            if d.properties.messageID == marker { caughtUp.store(true, ordering: .releasing) }
        case PusherTopology.tokenType:
            guard case .success(let r) = PushRegistration.parse(type: nil, body: d.body) else { return }
            let at = d.properties.timestamp.map { Date(timeIntervalSince1970: Double(min($0, 253_402_300_799))) } ?? Date()
            // Under the lock of the events kept without a token (as `takeStatus` looks and keeps): an
            // event is either kept before the token is noted, and taken here, or sees the token.
            let (kept, replaced) = untokened.withLock { u in
                let previous = tokens.withLock { t in
                    defer { t[r.id] = Registered(registration: r, at: at) }
                    return t[r.id]?.registration.pushToken
                }
                return (u.take(r.id), previous.map { $0 != r.pushToken } ?? false)
            }
            // A new token: the old one's failures do not count against it, and what waits goes to it now.
            if replaced { perform(scheduler.withLock { $0.tokenChanged(r.id, now: Date()) }) }
            // Events that came first (this replica acts): the newest is pushed now.
            if let kept,
                let event = try? JSONDecoder().decode(StatusEvent.self, from: kept.body)
            {
                submit(event, delivery: nil)
            }
        case PusherTopology.dropType:
            guard let id = d.properties.correlationID else { return }
            tokens.withLock { t in
                // A drop names the token it dropped: a newer registration stays.
                if t[id]?.registration.pushToken == String(decoding: d.body, as: UTF8.self) { t[id] = nil }
            }
        default:
            return
        }
    }

    private func dropHeldWork() {
        let dropped = held.withLock { h -> Int in
            defer { h = [:] }
            return h.count
        }
        scheduler.withLock { $0.reset() }
        if dropped > 0 { logger.warning("connection lost: unsent pushes go back to the broker", [("held", .int(dropped))]) }
    }

    private func pruneTokens() {
        let cutoff = Date().addingTimeInterval(-Double(settings.lifetimeSeconds) - 600)
        tokens.withLock { t in
            for (id, r) in t where r.at < cutoff { t[id] = nil }
        }
    }

    private func register(_ d: AMQPDelivery) async {
        switch PushRegistration.parse(type: d.properties.type, body: d.body) {
        case .failure(let rejection):
            logger.info("dead-lettered", [("code", .string(rejection.code.rawValue)), ("reason", .string(rejection.reason))])
            metrics.deadLetters.increment(rejection.code.rawValue)
            let letter = SharedTopology.deadLetter(d, code: rejection.code, reason: rejection.reason, service: "frontdesk-pusher")
            await settle(d, after: letter)
        case .success(let r):
            let body = (try? JSONEncoder().encode(r)) ?? Data()
            let record = OutboundMessage(
                exchange: "", routingKey: PusherTopology.tokens, body: body,
                properties: AMQPProperties.persistentJSON(messageID: "\(r.id)/token/\(UUID().uuidString)", correlationID: r.id, type: PusherTopology.tokenType)
                    .stamped(by: settings.login))
            await settle(d, after: record)
        }
    }

    /// Publishes `message` with a confirm, then acks `d`; on failure leaves it to come again.
    private func settle(_ d: AMQPDelivery, after message: OutboundMessage) async {
        do {
            try await client.publish(message)
            try d.ack()
        } catch {
            logger.warning("cannot record a registration; it will come again", [("error", .string("\(error)"))])
            try? d.nack(requeue: true)
        }
    }

    // MARK: Status events → pushes

    private func takeStatus(_ d: AMQPDelivery) {
        // Most events have no activity to push to: their dispatch and seq come from
        // the properties (`correlation_id`, `message_id` = `<id>/<seq>`), and the
        // body is decoded only for a dispatch with a token.
        guard d.properties.type == nil || d.properties.type == StatusEvent.type, SharedTopology.cameByTheStatusExchange(d),
            let id = d.properties.correlationID
        else {
            try? d.ack()  // not a status event
            return
        }
        let seq: Int
        if let messageID = d.properties.messageID, messageID.hasPrefix(id + "/"), let s = Int(messageID.dropFirst(id.count + 1)) {
            seq = s
        } else if let event = try? JSONDecoder().decode(StatusEvent.self, from: d.body), event.dispatchId == id {
            seq = event.seq  // a message id of another shape (the contract asks only that it be unique): the body tells
        } else {
            try? d.ack()
            return
        }
        // No activity to push to yet: kept (the newest only), in case its token is on its way. Looked
        // and kept in one step under the lock `takeTokenRecord` notes a token under: never kept just
        // after the token's record looked for it.
        let keptUntokened = untokened.withLock { u in
            guard tokens.withLock({ $0[id] }) == nil else { return false }
            u.keep(id, seq: seq, body: d.body)
            return true
        }
        guard !keptUntokened else {
            try? d.ack()
            return
        }
        guard let event = try? JSONDecoder().decode(StatusEvent.self, from: d.body), event.dispatchId == id else {
            try? d.ack()
            return
        }
        submit(event, delivery: d)
    }

    /// Hands the event's push to the scheduler; `delivery` is acked when it is done (nil: already acked).
    private func submit(_ event: StatusEvent, delivery d: AMQPDelivery?) {
        var state = LiveActivityState()
        state.apply(event)
        guard let view = state.view(now: Date()) else {
            try? d?.ack()
            return
        }
        let tag = nextTag.wrappingAdd(1, ordering: .relaxed).newValue
        if let d { held.withLock { $0[tag] = d } }
        let actions = scheduler.withLock { s -> [PushScheduler.Action] in
            let update = PushUpdate(
                dispatchId: event.dispatchId, seq: event.seq, payload: ActivityPush.payload(for: event, view: view),
                priority: ActivityPush.priority(for: event, previousState: s.lastState(event.dispatchId), previousRoute: s.lastRoute(event.dispatchId)),
                isEnd: event.state.isTerminal, tag: tag, eventAt: RFC3339.parse(event.at) ?? Date())
            return s.submit(update, state: event.state, route: ActivityPush.route(of: event), now: Date())
        }
        perform(actions)
    }

    /// `sentTo`: the token a completed push went to. A dispatch's token is
    /// let go (its end delivered, or APNs said it is gone) only while it is
    /// still that one: a token registered while the push was on its way stays.
    private func perform(_ actions: [PushScheduler.Action], sentTo: String? = nil) {
        for action in actions {
            switch action {
            case .send(let update): send(update)
            case .ack(let tags):
                let deliveries = held.withLock { h in tags.compactMap { h.removeValue(forKey: $0) } }
                for d in deliveries { try? d.ack() }
            case .dropToken(let id): dropToken(id, ifStill: sentTo)
            case .finished(let id):
                tokens.withLock { t in
                    if sentTo == nil || t[id]?.registration.pushToken == sentTo { t[id] = nil }
                }
            case .gaveUp(let id):
                metrics.givenUp.increment()
                logger.warning("APNs took no push of a dispatch for the give-up time; its pending update is dropped", [
                    ("dispatch", .string(id)), ("seconds", .int(settings.giveUpSeconds)),
                ])
            }
        }
    }

    /// The provider token to send with, and when it was issued.
    private func bearer(now: Date) -> (token: String, issuedAt: Date)? {
        providerToken.withLock { cache in
            let token = cache.current(now: now) { issuedAt in
                APNs.providerToken(keyID: settings.keyID, teamID: settings.teamID, issuedAt: issuedAt, sign: key.sign)
            }
            return token.map { ($0, cache.issuedAt) }
        }
    }

    private func send(_ update: PushUpdate) {
        /// `sentTo`: the token the push was for ("" for none: no token is then let go).
        @Sendable func complete(_ outcome: PushScheduler.Outcome, sentTo: String) {
            perform(
                scheduler.withLock { $0.completed(update.dispatchId, sendID: update.sendID, outcome, now: Date(), jitter: Double.random(in: 0..<1)) },
                sentTo: sentTo)
        }
        // The token went (a 410 under another update): nothing to send to (dropping it again does nothing).
        guard let registered = tokens.withLock({ $0[update.dispatchId] }) else { return complete(.gone, sentTo: "") }
        // No provider token could be signed: tried again after a back-off, the token kept.
        guard let bearer = bearer(now: Date()) else { return complete(.retry(after: nil), sentTo: registered.registration.pushToken) }
        let r = registered.registration
        let url = APNs.url(base: settings.apnsURL, environment: r.environment, token: r.pushToken)
        let headers = APNs.headers(bearer: bearer.token, bundleID: settings.bundleID, priority: update.priority, expiration: nil)
        apns.post(url: url, headers: headers, body: update.payload) { [self] status, body, retryAfter, error in
            let now = Date()
            var (outcome, reason) = APNs.outcome(
                status: status, body: body, tokenAge: now.timeIntervalSince(bearer.issuedAt), retryAfter: retryAfter)
            let current = tokens.withLock { $0[update.dispatchId]?.registration.pushToken }
            if outcome == .gone, current != r.pushToken {
                // That token was replaced while the push was on its way: the new one stays.
                outcome = .rejected
            }
            metrics.pushes.increment(status == 0 ? "error" : String(status))
            switch outcome {
            case .delivered:
                metrics.latency.observe(max(0, Date().timeIntervalSince(update.eventAt)))
            case .rejected:
                metrics.rejected.increment(APNs.reasonLabel(reason))
                logger.warning("APNs refused a push", [("status", .int(status)), ("reason", .string(reason ?? "none")), ("dispatch", .string(update.dispatchId))])
            case .gone:
                logger.info("push token gone", [("dispatch", .string(update.dispatchId)), ("reason", .string(reason ?? "Unregistered"))])
            case .retry:
                if reason == "ExpiredProviderToken" {
                    // A 403 all the same: counted, then tried again with a new token.
                    metrics.rejected.increment("ExpiredProviderToken")
                    providerToken.withLock { $0.expired(issuedAt: bearer.issuedAt, now: now) }
                }
                logger.warning("APNs did not take a push; backing off", [
                    ("status", .int(status)), ("reason", .string(reason ?? error ?? "none")), ("dispatch", .string(update.dispatchId)),
                ])
            }
            complete(outcome, sentTo: r.pushToken)
        }
    }

    /// `token` nil: whichever token the dispatch has.
    private func dropToken(_ id: String, ifStill token: String?) {
        let gone = tokens.withLock { t -> Registered? in
            guard let current = t[id], token == nil || current.registration.pushToken == token else { return nil }
            return t.removeValue(forKey: id)
        }
        guard let gone else { return }
        let message = OutboundMessage(
            exchange: "", routingKey: PusherTopology.tokens, body: Data(gone.registration.pushToken.utf8),
            properties: AMQPProperties.persistentJSON(messageID: "\(id)/drop/\(UUID().uuidString)", correlationID: id, type: PusherTopology.dropType)
                .stamped(by: settings.login))
        Task { try? await client.publish(message) }
    }
}

struct PusherMetrics: Sendable {
    let pushes: Counter
    let latency: Histogram
    let tokens: Gauge
    let rejected: Counter
    let deadLetters: Counter
    let givenUp: Counter

    init(_ registry: MetricsRegistry) {
        pushes = registry.counter("frontdesk_pusher_pushes_total", "pushes by APNs status (error: no answer)", labels: ["status"])
        latency = registry.histogram(
            "frontdesk_pusher_push_latency_seconds", "from a status event's at to APNs' 200", buckets: Histogram.latencyBuckets)
        tokens = registry.gauge("frontdesk_pusher_tokens", "push tokens held")
        rejected = registry.counter("frontdesk_pusher_rejected_total", "pushes APNs refused (400, 403, …), by reason", labels: ["reason"])
        deadLetters = registry.counter("frontdesk_pusher_dead_letters_total", "registrations dead-lettered, by code", labels: ["code"])
        givenUp = registry.counter(
            "frontdesk_pusher_given_up_total", "dispatches whose pending update was dropped after FRONTDESK_APNS_GIVE_UP_S of failed pushes")
    }
}
