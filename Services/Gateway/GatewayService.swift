import AMQP
import CCrypto
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// frontdesk-gateway: HTTP for apps and browsers (CONTRACT.md, Gateway).
/// Stateless: what it knows of dispatches it reads from the status log, a
/// stream every replica reads from the start of the lifetime window; what it
/// is asked to do it publishes to `frontdesk.commands` as a producer.
final class GatewayService: Service {
    struct Settings: Sendable {
        var tokens: GatewayTokens
        /// The file they came from, and what `stat` said of it before it was read: read again when it changes.
        var tokensPath: String? = nil
        var tokensStamp: TokenSource.Stamp? = nil
        var table: RoutingTable
        var lifetimeSeconds: Int
        var login: String
        /// This replica's queue on the status exchange (see `declareLiveQueue`).
        var liveQueue: String
        /// How long a request for an id not seen yet waits for its first event.
        var firstEventWait: Duration = .seconds(1)
        var keepAliveInterval: Duration = .seconds(15)
        /// The event book's size limit; ended dispatches heard of longest ago go first.
        var maxBookBytes = 512 << 20
        /// Open event streams one user may hold: more answer 429.
        var maxStreamsPerUser = GatewayState.defaultMaxStreamsPerUser
        /// What one stream's replay queues before it ends for the client to resume.
        var maxReplayBytes = GatewayState.defaultMaxReplayBytes
    }

    let client: AMQPClient
    let settings: Settings
    let logger: Logger
    let state: GatewayState
    let page: [String: Data]
    /// Built once: its indices take a large table tens of milliseconds.
    let resolver: RouteResolver
    let tokenSource: TokenSource
    private let presence: Presence
    /// The log has been read up to the marker this replica wrote: history is complete.
    private let caughtUp = Atomic<Bool>(false)
    /// Where the status log is read from on each (re)start of its consumer,
    /// and the marker of the catch-up that start began.
    private struct LogPosition {
        /// The offset after the last event read: a reconnect resumes there
        /// (it read the whole lifetime window again).
        var next: Int64?
        var marker = ""
        /// Live events are left to the log until it has caught up with this
        /// start's marker: after a reconnect the log still holds what came
        /// while this replica was away, and a live event written to a stream
        /// before those would put a higher seq ahead of them (a client drops
        /// the lower ones that follow).
        var liveHeld = true
        var heldSince = ContinuousClock.now
    }
    private let logPosition = Mutex(LogPosition())
    /// A catch-up that takes longer (the log consumer failed to start again,
    /// or its offset is past the end of a log declared anew) is given up:
    /// live events are taken again, and the next start reads the log from
    /// the lifetime window's start.
    static let maxCatchUp = Duration.seconds(15)

    /// Each start of either consumer: live copies are held until a new
    /// marker comes back by the log (consumers start in any order).
    private func beginCatchUp() {
        let marker = "gateway-\(UUID().uuidString)"
        logPosition.withLock { p in
            p.marker = marker
            p.liveHeld = true
            p.heldSince = .now
        }
        Task { await writeMarker(marker) }
    }
    private let stopped = Atomic<Bool>(false)
    private let stopSignal: AsyncStream<Void>.Continuation
    private let stopStream: AsyncStream<Void>

    init(client: AMQPClient, settings: Settings, logger: Logger, metrics: MetricsRegistry, page: [String: Data]) {
        self.client = client
        self.settings = settings
        self.logger = logger
        self.resolver = RouteResolver(table: settings.table)
        self.state = GatewayState(
            metrics: GatewayMetrics(metrics), maxStreamsPerUser: settings.maxStreamsPerUser, maxReplayBytes: settings.maxReplayBytes,
            postedFor: TimeInterval(settings.lifetimeSeconds))
        self.tokenSource = TokenSource(
            initial: settings.tokens, path: settings.tokensPath, stamp: settings.tokensStamp, logger: logger, reads: state.metrics.tokenReads)
        self.page = page
        self.presence = Presence(client: client, table: settings.table)
        (stopStream, stopSignal) = AsyncStream<Void>.makeStream()
    }

    var isReady: Bool { client.isReady && caughtUp.load(ordering: .acquiring) }

    static let markerType = "frontdesk.gateway.marker.v1"

    static let liveQueuePrefix = "frontdesk.gateway.live."

    /// The live tail: an exclusive queue bound to every status event, gone
    /// with the connection (declared again on the next). Bounded: should it
    /// overflow, the oldest events go, and they still come from the log.
    static func declareLiveQueue(_ name: String, on channel: AMQPChannel) async throws {
        try await channel.queueDeclare(
            name, durable: false, exclusive: true, autoDelete: true,
            arguments: ["x-max-length": .int64(100_000), "x-overflow": "drop-head"])
        try await channel.queueBind(name, exchange: SharedTopology.statusExchange, routingKey: "status.#")
    }

    // MARK: Service

    func run() async throws {
        tokenSource.start()
        defer { tokenSource.stop() }
        let since = UInt64(max(0, Date().timeIntervalSince1970 - Double(settings.lifetimeSeconds) - 300))
        let state = state, login = settings.login
        let stop = await client.consume(
            ConsumerSpecification(
                queue: SharedTopology.statusLog, prefetchCount: 1000,
                argumentsOnStart: { [self] in
                    // Each start: from the lifetime window's start the first
                    // time, after the last event read since.
                    beginCatchUp()
                    let next = logPosition.withLock { $0.next }
                    return [AMQPStream.offsetArgument: next.map { .int64($0) } ?? .timestamp(since)]
                }),
            deliver: { [self] d in
                state.metrics.logReads.increment()
                // The broker sets the first `x-stream-offset` (a publisher may add more after it).
                if let offset = d.properties.headers?.entries.first(where: { $0.key == AMQPStream.offsetArgument })?.value.intValue,
                    offset < Int64.max
                {
                    logPosition.withLock { $0.next = offset + 1 }
                }
                if d.properties.type == StatusEvent.type, SharedTopology.cameByTheStatusExchange(d) {
                    publishDeferred(state.take(d.body, messageID: d.properties.messageID, now: Date()))
                } else if d.properties.type == Self.markerType, d.properties.userID == login,
                    logPosition.withLock({ p in
                        guard p.liveHeld, d.properties.messageID == p.marker else { return false }
                        p.liveHeld = false
                        return true
                    })
                {
                    caughtUp.store(true, ordering: .releasing)
                }
                try? d.ack()
            },
            ended: {})
        // Every event comes twice, by the log and by the live queue: whichever
        // is first counts, the book drops the other. While the log catches up
        // (after each start) the live copies are left to it.
        let stopLive = await client.consume(
            ConsumerSpecification(
                queue: settings.liveQueue, prefetchCount: 1000, exclusive: true,
                argumentsOnStart: { [self] in
                    beginCatchUp()
                    return nil
                },
                // Exclusive and auto-delete: it went with its consumer's channel (the log covers the gap).
                redeclare: { [liveQueue = settings.liveQueue] in try await Self.declareLiveQueue(liveQueue, on: $0) }),
            deliver: { [self] d in
                var gaveUp = false
                let held = logPosition.withLock { p -> Bool in
                    if p.liveHeld, ContinuousClock.now - p.heldSince > Self.maxCatchUp {
                        p.liveHeld = false
                        p.next = nil
                        gaveUp = true
                    }
                    return p.liveHeld
                }
                if gaveUp {
                    logger.warning("the status log did not catch up within \(Self.maxCatchUp): live events are taken again, and the log is read from the lifetime window's start at its next start")
                }
                if !held, d.properties.type == StatusEvent.type, SharedTopology.cameByTheStatusExchange(d) {
                    publishDeferred(state.take(d.body, messageID: d.properties.messageID, now: Date()))
                }
                try? d.ack()
            },
            ended: {})
        async let housekeeping: Void = housekeep()
        for await _ in stopStream { break }
        await stopLive()
        await stop()
        await housekeeping
    }

    func shutdown() async {
        stopped.store(true, ordering: .releasing)
        state.endAllStreams()
        stopSignal.yield()
        stopSignal.finish()
    }

    /// Writes a marker into the log (retrying until the broker takes it, while
    /// it is still the one waited for): once read back, everything before it
    /// has been read.
    private func writeMarker(_ marker: String) async {
        while !stopped.load(ordering: .acquiring), logPosition.withLock({ $0.liveHeld && $0.marker == marker }) {
            do {
                try await client.publish(OutboundMessage(
                    exchange: "", routingKey: SharedTopology.statusLog, body: Data("{}".utf8),
                    properties: AMQPProperties.persistentJSON(messageID: marker, type: Self.markerType).stamped(by: settings.login)))
                return
            } catch {
                try? await Task.sleep(for: .milliseconds(500))
            }
        }
    }

    /// Keep-alive comments on every stream, and pruning of old dispatches.
    private func housekeep() async {
        var ticks = 0
        var last = ContinuousClock.now
        while !stopped.load(ordering: .acquiring) {
            try? await Task.sleep(for: .milliseconds(500))  // short steps: shutdown is not held up
            guard ContinuousClock.now - last >= settings.keepAliveInterval else { continue }
            last = .now
            state.keepAlive()
            ticks += 1
            if ticks % 4 == 0 {
                let cutoff = Date().addingTimeInterval(-Double(settings.lifetimeSeconds) - 600)
                state.prune(heardBefore: cutoff, maxBytes: settings.maxBookBytes, now: Date())
            }
        }
    }

    // MARK: HTTP

    func handle(_ request: AsyncHTTPRequest, _ responder: HTTPResponder) async {
        let endpoint = GatewayEndpoint.parse(method: request.method, path: request.path)
        let status: Int
        do {
            status = try await answer(endpoint, request, responder)
        } catch let error as GatewayError {
            responder.answer(status: error.status, contentType: "application/json", body: error.body, header: Self.header(for: error))
            status = error.status
        } catch {
            let e = GatewayError(500, "internal", "the request could not be completed")
            responder.answer(status: 500, contentType: "application/json", body: e.body)
            status = 500
        }
        state.metrics.requests.increment(String(status))
    }

    /// The header an error's answer carries, if any.
    private static func header(for error: GatewayError) -> (String, String)? {
        error.status == 401 ? ("WWW-Authenticate", "Bearer") : error.status == 503 || error.status == 429 ? ("Retry-After", "1") : nil
    }

    /// What answers a request, from its head alone (on the HTTP server's
    /// thread): one that needs a token and has no valid one gets its 401,
    /// also with a body over the limit (not the 413 a user's would get).
    func refusal(forHead request: AsyncHTTPRequest) -> HTTPRefusal? {
        guard Self.needsToken(GatewayEndpoint.parse(method: request.method, path: request.path), request) else { return nil }
        do {
            _ = try user(request)
            return nil
        } catch {
            state.metrics.requests.increment(String(error.status))
            return HTTPRefusal(status: error.status, body: error.body, header: Self.header(for: error))
        }
    }

    /// Every /v1 request needs a token, also one for no endpoint or with the wrong method; and
    /// every endpoint that needs one, however its path was spelled (`/%761/…` is `/v1/…`).
    private static func needsToken(_ endpoint: GatewayEndpoint, _ request: AsyncHTTPRequest) -> Bool {
        endpoint.needsToken || request.path.hasPrefix("/v1")
    }

    private func user(_ request: AsyncHTTPRequest) throws(GatewayError) -> String {
        guard request.headers["authorization"] != nil else { throw .unauthorized("a bearer token is required") }
        guard let user = tokenSource.tokens.user(authorization: request.headers["authorization"], digest: Self.sha256Hex) else {
            throw .unauthorized("the token is not valid")
        }
        return user
    }

    static func sha256Hex(_ text: String) -> String {
        var digest = [UInt8](repeating: 0, count: 32)
        let bytes = Array(text.utf8)
        guard fd_sha256(bytes, bytes.count, &digest) == 1 else { return "" }
        // Runs for every /v1 request on the HTTP server's thread (the head check): no formatter.
        let hex = Array("0123456789abcdef".utf8)
        var text = [UInt8]()
        text.reserveCapacity(64)
        for byte in digest {
            text.append(hex[Int(byte >> 4)])
            text.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    private func json(_ responder: HTTPResponder, _ status: Int, _ body: Data) -> Int {
        responder.answer(status: status, contentType: "application/json", body: body)
        return status
    }

    /// The dispatch, if it is `user`'s; an id not seen yet gets a moment to
    /// appear (it may have been posted to another replica just now).
    private func owned(_ id: String, by user: String) async throws(GatewayError) {
        if state.owner(id) == nil { _ = await state.waitForEvent(id, timeout: settings.firstEventWait) }
        guard state.isOwned(id, by: user) else { throw .notFound }
    }

    /// A command for an id this user posted here that has no event yet (the
    /// router may be slow or down): validated, kept, and published once the
    /// first event shows the dispatch is theirs. False: the ordinary path applies.
    private func deferred(_ id: String, user: String, key: String, body: () throws -> Data) async throws -> Bool {
        guard state.poster(id, now: Date()) == user else { return false }
        _ = await state.waitForEvent(id, timeout: settings.firstEventWait)
        let data = try body()
        return state.deferCommand(id, user: user, key: key, body: data)
    }

    /// Commands kept for ids posted here until their first event showed the
    /// owner who gave them: published now, in order, in the background, and
    /// tried again while the broker does not take them (a resource alarm, a
    /// lost connection) — the client was told 202.
    private func publishDeferred(_ commands: [GatewayState.DeferredCommand]) {
        guard !commands.isEmpty else { return }
        Task {
            for command in commands {
                guard let id = (try? JSONFields(command.body)).flatMap({ try? $0.string("id") }) else { continue }
                var delay = Duration.milliseconds(250)
                while !stopped.load(ordering: .acquiring) {
                    do {
                        try await publish(command.key, id: id, body: command.body)
                        break
                    } catch {
                        try? await Task.sleep(for: delay)
                        delay = min(delay * 2, .seconds(10))
                    }
                }
            }
        }
    }

    private func answer(_ endpoint: GatewayEndpoint, _ request: AsyncHTTPRequest, _ responder: HTTPResponder) async throws -> Int {
        if case .page(let file) = endpoint {
            guard let body = page[file] else { throw GatewayError(404, "not_found", "no such page") }
            let type = file.hasSuffix(".js") ? "text/javascript; charset=utf-8"
                : file.hasSuffix(".css") ? "text/css; charset=utf-8" : "text/html; charset=utf-8"
            responder.answer(
                status: 200, contentType: type, body: body,
                header: ("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:"))
            return 200
        }
        let user = Self.needsToken(endpoint, request) ? try user(request) : ""
        switch endpoint {
        case .notFound: throw GatewayError(404, "not_found", "no such endpoint")
        case .methodNotAllowed(let allowed):
            let e = GatewayError(405, "method_not_allowed", "use \(allowed)")
            responder.answer(status: 405, contentType: "application/json", body: e.body, header: ("Allow", allowed))
            return 405
        default: break
        }
        guard caughtUp.load(ordering: .acquiring) else {
            // Until the log is read up to now, "unknown" could be wrong: not an answer to give.
            throw GatewayError(503, "starting", "the gateway is still reading the status log; try again shortly")
        }
        guard client.connectionState.isReady else {
            // Without the broker nothing can be published, and presence and new events are unknown.
            throw GatewayError(503, "unavailable", "the gateway has lost the broker; try again shortly")
        }
        if endpoint.publishes, let reason = client.blockedReason {
            // A resource alarm: a publish would wait until it clears. Reads still work.
            throw GatewayError(503, "unavailable", "the broker takes no commands now (\(reason.prefix(100))); try again shortly")
        }
        switch endpoint {
        case .createDispatch:
            let (id, body) = try GatewayBodies.dispatchRequest(request.body, user: user, makeID: { UUID().uuidString.lowercased() }).get()
            // Another's dispatch is 404 (CONTRACT: "another's answer 404"), as on every
            // other endpoint: the answer must not tell whether someone else used the id.
            // A known dispatch without a user (sent to the broker directly) is nobody's to take.
            let known = state.owner(id)  // one look: an event may come in between
            var claim = GatewayState.Claim.held
            switch known {
            case .some(let owner): guard owner == user else { throw GatewayError.notFound }
            case .none:
                claim = state.claim(id, by: user, now: Date())
                guard claim != .refused else { throw GatewayError.notFound }
            }
            if known == nil {
                do {
                    try await publish(CommandKey.request, id: id, body: body)
                } catch {
                    if claim == .new { state.unclaim(id, by: user) }
                    guard var refused = error as? GatewayError else { throw error }
                    refused.id = id  // the broker may have it: a retry with this id stays one dispatch
                    throw refused
                }
                // Its first event may show it is another's after all (posted at another
                // replica, or sent to the broker directly, a moment earlier): 404 as above.
                if await state.waitForEvent(id, timeout: settings.firstEventWait), let owner = state.owner(id), owner != user {
                    throw GatewayError.notFound
                }
            }
            let answer = JSONWriter.object { json in
                json.field("events", "/v1/dispatches/\(id)/events")
                json.field("id", id)
            }
            responder.answer(status: 202, contentType: "application/json", body: answer, header: ("Location", "/v1/dispatches/\(id)"))
            return 202
        case .latest(let id):
            try await owned(id, by: user)
            guard let latest = state.latest(id, user: user) else { throw GatewayError.notFound }
            return json(responder, 200, latest.body)
        case .events(let id):
            // A stream on an id posted here by this user may open before the first
            // event: the event then decides (`subscribe`, `take`).
            if state.poster(id, now: Date()) != user { try await owned(id, by: user) }
            guard state.mayOpenStream(user) else {
                throw GatewayError(429, "too_many_streams", "at most \(settings.maxStreamsPerUser) open event streams per user")
            }
            let after = ServerSentEvents.lastSeq(request.headers["last-event-id"])
            // Resumed after the terminal event: 204, which tells an
            // EventSource to stop (an empty 200 had it reconnect every second for ever).
            if after > 0, state.hasEnded(id, before: after) {
                responder.answer(status: 204, contentType: "text/event-stream", body: Data())
                return 204
            }
            guard let stream = responder.stream(status: 200, contentType: "text/event-stream") else { return 499 }
            state.subscribe(id, user: user, after: after, stream: stream)
            return 200
        case .cancel(let id):
            if try await deferred(id, user: user, key: CommandKey.cancel, body: { try GatewayBodies.cancel(request.body, id: id).get() }) {
                return json(responder, 202, JSONWriter.object { $0.field("id", id) })
            }
            try await owned(id, by: user)  // another's dispatch is 404, whatever the body
            let body = try GatewayBodies.cancel(request.body, id: id).get()
            try await publish(CommandKey.cancel, id: id, body: body)
            return json(responder, 202, JSONWriter.object { $0.field("id", id) })
        case .reroute(let id):
            let reroute = { try GatewayBodies.reroute(request.body, id: id, table: self.settings.table).get() }
            if try await deferred(id, user: user, key: CommandKey.reroute, body: reroute) {
                return json(responder, 202, JSONWriter.object { $0.field("id", id) })
            }
            try await owned(id, by: user)
            let body = try reroute()
            try await publish(CommandKey.reroute, id: id, body: body)
            return json(responder, 202, JSONWriter.object { $0.field("id", id) })
        case .activity(let id):
            if try await deferred(id, user: user, key: CommandKey.activity, body: { try GatewayBodies.activity(request.body, id: id).get() }) {
                responder.answer(status: 204, contentType: "application/json", body: Data())
                return 204
            }
            try await owned(id, by: user)
            let body = try GatewayBodies.activity(request.body, id: id).get()
            try await publish(CommandKey.activity, id: id, body: body)
            responder.answer(status: 204, contentType: "application/json", body: Data())
            return 204
        case .targets:
            let counts = await presence.current()
            return json(responder, 200, GatewayViews.targets(settings.table, presence: counts))
        case .route:
            guard let input = request.query["input"], (1...IntakeClassifier.maxInputScalars).contains(input.unicodeScalars.count) else {
                throw GatewayError.invalid("'input' must be 1–\(IntakeClassifier.maxInputScalars) characters")
            }
            switch resolver.resolve(input: input) {
            case .success(let resolution): return json(responder, 200, GatewayViews.route(resolution, table: settings.table))
            case .failure(let failure): throw GatewayError(422, failure.code, failure.message)
            }
        case .page, .notFound, .methodNotAllowed: return 500  // answered above
        }
    }

    private func publish(_ key: String, id: String, body: Data) async throws {
        do {
            let properties = AMQPProperties.persistentJSON(
                messageID: "\(id)/\(key)/\(UUID().uuidString)", correlationID: id, type: "frontdesk.\(key).v1")
            try await client.publish(OutboundMessage(
                exchange: SharedTopology.commandsExchange, routingKey: key, body: body,
                properties: properties.stamped(by: settings.login), mandatory: key != CommandKey.activity))
            state.metrics.published.increment(key)
        } catch {
            logger.warning("cannot publish", [("key", .string(key)), ("error", .string("\(error)"))])
            throw GatewayError(503, "unavailable", "the broker did not take the command; try again")
        }
    }
}

/// Each target's presence, read from the broker (agent queue consumers,
/// park queue depth) at most once a second.
actor Presence {
    struct Count: Sendable {
        var online: Bool
        var parked: Int
    }

    private let client: AMQPClient
    private let table: RoutingTable
    private var cached: [RoutingTable.Route: Count] = [:]
    private var readAt = ContinuousClock.now - .seconds(10)
    /// The read in progress: callers during it share it (one set of declares, not one per request).
    private var reading: Task<[RoutingTable.Route: Count], Never>?

    init(client: AMQPClient, table: RoutingTable) {
        self.client = client
        self.table = table
    }

    func current() async -> [RoutingTable.Route: Count] {
        guard ContinuousClock.now - readAt > .seconds(1) else { return cached }
        if let reading { return await reading.value }
        let task = Task { await self.read() }
        reading = task
        let fresh = await task.value
        cached = fresh
        readAt = .now
        reading = nil
        return fresh
    }

    private func read() async -> [RoutingTable.Route: Count] {
        var fresh: [RoutingTable.Route: Count] = [:]
        for route in table.routes {
            var count = Count(online: false, parked: 0)
            if let agents = try? await client.withChannel({ try await $0.queueDeclare(SharedTopology.agentQueue(route), passive: true) }) {
                count.online = agents.consumerCount > 0
            }
            if let park = try? await client.withChannel({ try await $0.queueDeclare(SharedTopology.parkQueue(route), passive: true) }) {
                count.parked = Int(park.messageCount)
            }
            fresh[route] = count
        }
        return fresh
    }
}

/// The JSON views of the routing table.
enum GatewayViews {
    static func targets(_ table: RoutingTable, presence: [RoutingTable.Route: Presence.Count]) -> Data {
        JSONWriter.object { json in
            json.beginArray("projects")
            for p in table.projects {
                json.beginObject()
                json.field("accent", p.accent)
                json.field("glyph", p.glyph)
                json.field("id", p.id)
                json.field("name", p.name)
                json.beginArray("targets")
                for t in p.targets {
                    let count = presence[.init(project: p.id, target: t.id)]
                    json.beginObject()
                    json.field("contacts", t.contacts)
                    json.field("id", t.id)
                    json.field("keywords", t.keywords)
                    json.field("name", t.name)
                    json.field("online", count?.online ?? false)
                    json.field("parked", count?.parked ?? 0)
                    json.endObject()
                }
                json.endArray()
                json.endObject()
            }
            json.endArray()
        }
    }

    /// The best guess as a `routing` event carries it: project, target, route.
    static func route(_ r: RouteResolution, table: RoutingTable) -> Data {
        let parts = table.eventParts(r.route)
        let event = StatusEvent.Route(
            confidence: r.confidence, reason: r.reason,
            alternatives: r.alternatives.map { .init(project: $0.route.project, target: $0.route.target, confidence: $0.confidence) })
        return JSONWriter.object { json in
            parts?.project.write("project", to: &json)
            event.write("route", to: &json)
            parts?.target.write("target", to: &json)
        }
    }
}
