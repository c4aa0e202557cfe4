import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// The gateway's memory: the event book, the open event streams and the
/// requests waiting for a dispatch's first event. One lock; nothing under it
/// blocks (a stream write only queues bytes).
final class GatewayState: Sendable {
    fileprivate struct Subscriber {
        let stream: HTTPStream
        let user: String
        /// The client's Last-Event-ID (0 without one): a live event at or
        /// below it is one the client has. Every event `take` passes on is
        /// new to the book, so never written to this stream before; one with
        /// a lower seq than the last written (on a cluster a routing event can
        /// come after the sending one) is written too, and the client's
        /// Last-Event-ID then goes back to it: a reconnect replays the events
        /// above it again, each still once per stream.
        let after: Int
        /// What the replay queued: a live write may queue that much more
        /// than `HTTPStream.limit` before the client counts as not reading.
        var replayBytes: Int
        var liveLimit: Int { GatewayState.streamLimit(replayBytes: replayBytes) }
    }

    fileprivate struct Waiter {
        let token: UInt64
        let continuation: CheckedContinuation<Bool, Never>
    }

    fileprivate struct State {
        var book = EventBook()
        var subscribers: [String: [Subscriber]] = [:]
        var streams = 0
        var streamsByUser: [String: Int] = [:]
        /// When each user at the cap last had their streams looked at (`mayOpenStream`): at most once a second.
        var swept: [String: ContinuousClock.Instant] = [:]
        var waiters: [String: [Waiter]] = [:]
        var nextToken: UInt64 = 0
        /// Ids this replica published a request for, by user, until their first
        /// event: a cancel may come before it.
        var posted: [String: (user: String, at: Date)] = [:]
        /// Commands (cancel, reroute, activity) taken for posted ids before
        /// their first event, in order, published once that event shows whose
        /// the dispatch is: a second user may have posted the same id on
        /// another replica, and only the owner's commands go out.
        var deferred: [String: [DeferredCommand]] = [:]
    }

    /// A command kept until its dispatch's first event.
    struct DeferredCommand: Sendable {
        let user: String
        let key: String
        let body: Data
    }

    /// How long posted ids (and commands kept for them) are remembered
    /// without an event: the lifetime window, as the router keeps an early cancel.
    let postedFor: TimeInterval
    static let maxPosted = 100_000
    /// Commands kept for one posted id (a client repeating itself gains nothing).
    static let maxDeferredPerID = 8

    private let state = Mutex(State())
    let metrics: GatewayMetrics

    /// Open event streams one user may hold.
    let maxStreamsPerUser: Int
    /// What one stream's replay queues at most before it ends the stream (see `subscribe`).
    let maxReplayBytes: Int
    static let defaultMaxReplayBytes = 4 << 20
    /// What one stream may queue for its client: its replay, and
    /// `HTTPStream.limit` of live events past it.
    static func streamLimit(replayBytes: Int) -> Int { HTTPStream.limit + replayBytes }
    /// The memory all streams' buffers may hold together: 32 streams each at
    /// its own limit (256 MiB).
    static let defaultStreamBufferBytes = 32 * streamLimit(replayBytes: defaultMaxReplayBytes)

    init(
        metrics: GatewayMetrics, maxStreamsPerUser: Int = GatewayState.defaultMaxStreamsPerUser,
        maxReplayBytes: Int = GatewayState.defaultMaxReplayBytes, postedFor: TimeInterval = 14_400
    ) {
        self.metrics = metrics
        self.maxStreamsPerUser = maxStreamsPerUser
        self.maxReplayBytes = maxReplayBytes
        self.postedFor = postedFor
    }

    /// Takes one status event body from the log; writes it to the dispatch's
    /// open streams and wakes the requests waiting for it.
    /// Returns the commands kept for this event's dispatch that its owner
    /// gave: the caller publishes them, in order.
    @discardableResult
    func take(_ body: Data, messageID: String?, now: Date) -> [DeferredCommand] {
        // The second copy of an event (log and live queue) is known by its message id, `<id>/<seq>`: not parsed again.
        if let messageID, let slash = messageID.lastIndex(of: "/"), let seq = Int(messageID[messageID.index(after: slash)...]),
            state.withLock({ $0.book.has(messageID[..<slash], seq: seq) })
        {
            return []
        }
        guard let e = EventBook.read(body) else { return [] }
        var commands: [DeferredCommand] = []
        let woken: [Waiter]? = state.withLock { s in
            guard s.book.add(id: e.id, seq: e.seq, state: e.state, user: e.user, body: body, now: now) else { return nil }
            s.posted[e.id] = nil
            if let kept = s.deferred.removeValue(forKey: e.id) {
                let owner = s.book.owner(e.id) ?? nil
                commands = kept.filter { $0.user == owner }
            }
            if var subscribers = s.subscribers[e.id] {
                let frame = ServerSentEvents.frame(seq: e.seq, state: e.state.rawValue, data: body)
                let owner = s.book.owner(e.id) ?? nil
                subscribers = subscribers.compactMap { sub in
                    // A stream opened on a posted id before its first event: only its owner's events.
                    guard owner == sub.user else {
                        s.closed(sub)
                        sub.stream.endWithoutEvent()
                        return nil
                    }
                    guard e.seq > sub.after else {
                        // Not for this stream (it resumed past it), but the
                        // dispatch is over all the same: the stream ends, not
                        // left open for ever with a client that named a seq
                        // beyond the last.
                        guard e.state.isTerminal else { return sub }
                        s.closed(sub)
                        sub.stream.endWithoutEvent()
                        return nil
                    }
                    let open = sub.stream.write(frame, end: e.state.isTerminal, limit: sub.liveLimit)
                    guard open, !e.state.isTerminal else {
                        s.closed(sub)
                        return nil
                    }
                    return sub
                }
                s.subscribers[e.id] = subscribers.isEmpty ? nil : subscribers
            }
            metrics.dispatches.set(Double(s.book.count))
            metrics.streams.set(Double(s.streams))
            return s.waiters.removeValue(forKey: e.id) ?? []
        }
        guard let woken else { return [] }  // the other copy came first
        metrics.events.increment()
        if let at = e.at.flatMap(RFC3339.parse) { metrics.eventDelay.observe(max(0, now.timeIntervalSince(at))) }
        for w in woken { w.continuation.resume(returning: true) }
        return commands
    }

    func owner(_ id: String) -> String?? { state.withLock { $0.book.owner(id) } }

    func latest(_ id: String, user: String) -> EventBook.Event? {
        state.withLock { $0.book.isOwned(id, by: user) ? $0.book.latest(id) : nil }
    }

    func isOwned(_ id: String, by user: String) -> Bool { state.withLock { $0.book.isOwned(id, by: user) } }

    /// Remembers that `user` posted a request for `id` through this replica
    /// (the first poster's; when full, nothing more until housekeeping prunes).
    /// In one step with the check, so that two users posting one id at once
    /// do not both pass it: `.refused` when another user posted it here
    /// within the window (their request goes ahead), `.new` when this call
    /// recorded it, `.held` when it was this user's already.
    func claim(_ id: String, by user: String, now: Date) -> Claim {
        state.withLock { s in
            guard !s.book.knows(id) else { return s.book.isOwned(id, by: user) ? .held : .refused }  // its events decide
            if let p = s.posted[id], now.timeIntervalSince(p.at) < postedFor {
                return p.user == user ? .held : .refused
            }
            guard s.posted[id] != nil || s.posted.count < Self.maxPosted else { return .held }  // full: nothing recorded
            s.posted[id] = (user, now)
            return .new
        }
    }

    enum Claim { case refused, held, new }

    /// Takes back the claim `claim` made for `user` (the broker did not
    /// confirm its request): another user is not kept out for the window by
    /// a request that may never have arrived. Should it have arrived, the
    /// router keeps the first of the id, whoever posts it next, and its
    /// first event shows whose it is. One held from an earlier request stays.
    func unclaim(_ id: String, by user: String) {
        state.withLock { s in
            if s.posted[id]?.user == user { s.posted[id] = nil }
        }
    }

    /// Who posted `id` through this replica, while no event of it is known.
    func poster(_ id: String, now: Date) -> String? {
        state.withLock { s in
            guard !s.book.knows(id), let p = s.posted[id], now.timeIntervalSince(p.at) < postedFor else { return nil }
            return p.user
        }
    }

    /// Keeps `user`'s command for a posted id until its first event; false
    /// when the event came meanwhile (the caller checks ownership and publishes).
    func deferCommand(_ id: String, user: String, key: String, body: Data) -> Bool {
        state.withLock { s in
            guard !s.book.knows(id) else { return false }
            var list = s.deferred[id] ?? []
            if list.count >= Self.maxDeferredPerID {
                // Full: the oldest command goes, but never a cancel, which ends the
                // dispatch whatever follows (a page that retries its registration
                // must not push it out). Behind a cancel, nothing more changes anything.
                let cancelled = list.contains { $0.key == CommandKey.cancel }
                guard !(cancelled && key == CommandKey.cancel), let oldest = list.firstIndex(where: { $0.key != CommandKey.cancel }) else {
                    return true
                }
                list.remove(at: oldest)
            }
            list.append(DeferredCommand(user: user, key: key, body: body))
            s.deferred[id] = list
            return true
        }
    }

    /// Waits until the dispatch has an event, at most `timeout`; true when it has one.
    func waitForEvent(_ id: String, timeout: Duration) async -> Bool {
        let token: UInt64? = state.withLock { s in
            guard !s.book.knows(id) else { return nil }
            s.nextToken += 1
            return s.nextToken
        }
        guard let token else { return true }
        return await withCheckedContinuation { continuation in
            let known = state.withLock { s -> Bool in
                if s.book.knows(id) { return true }
                s.waiters[id, default: []].append(Waiter(token: token, continuation: continuation))
                return false
            }
            if known {
                continuation.resume(returning: true)
                return
            }
            Task {
                try? await Task.sleep(for: timeout)
                let timedOut = self.state.withLock { s -> Waiter? in
                    guard var list = s.waiters[id], let i = list.firstIndex(where: { $0.token == token }) else { return nil }
                    let w = list.remove(at: i)
                    s.waiters[id] = list.isEmpty ? nil : list
                    return w
                }
                timedOut?.continuation.resume(returning: false)
            }
        }
    }

    /// Open event streams one user may hold: more answer 429, so one
    /// user's clients cannot take every connection of the gateway.
    /// A sixteenth of the connections the gateway serves at most: room for a
    /// user's many tabs and devices, never all of the gateway.
    static let defaultMaxStreamsPerUser = 1024

    /// At the limit, the user's streams whose clients have gone are let go
    /// first: a closed stream waits on no write (a keep-alive comes every 15 s)
    /// to make room, and a client that reconnects at once is not refused.
    func mayOpenStream(_ user: String) -> Bool {
        state.withLock { s in
            guard (s.streamsByUser[user] ?? 0) >= maxStreamsPerUser else { return true }
            // Once a second at most: a user's clients retrying at the cap must not hold the lock every stream needs.
            let now = ContinuousClock.now
            if let last = s.swept[user], now - last < .seconds(1) { return false }
            if s.swept.count >= 1024 { s.swept = s.swept.filter { now - $0.value < .seconds(1) } }
            s.swept[user] = now
            var kept: [String: [Subscriber]] = [:]
            for (id, subscribers) in s.subscribers where subscribers.contains(where: { $0.user == user }) {
                kept[id] = subscribers.filter { sub in
                    guard sub.user == user, sub.stream.isClientGone else { return true }
                    s.closed(sub)
                    return false
                }
            }
            for (id, open) in kept { s.subscribers[id] = open.isEmpty ? nil : open }
            metrics.streams.set(Double(s.streams))
            return (s.streamsByUser[user] ?? 0) < maxStreamsPerUser
        }
    }

    /// Whether `id` has ended and a client resuming after `seq` has all of it.
    func hasEnded(_ id: String, before seq: Int) -> Bool {
        state.withLock { s in s.book.isEnded(id) && s.book.events(id, after: seq).isEmpty }
    }

    /// Opens an event stream for `user`'s dispatch: the events after
    /// `lastSeq` now, the later ones as they come; ended after the terminal
    /// event. A live event may queue at most `HTTPStream.limit` more. The
    /// replay queues at most `maxReplayBytes` (and the event that crosses
    /// it): with more history left, the stream ends there, after a whole
    /// event, and the client resumes with that event's id as Last-Event-ID
    /// (an EventSource does by itself, after the `retry` interval). An agent
    /// sets the pace of a dispatch's events; without the bound a long
    /// history was queued whole once for every stream opened on it.
    func subscribe(_ id: String, user: String, after lastSeq: Int, stream: HTTPStream) {
        state.withLock { s in
            let postedHere = !s.book.knows(id) && s.posted[id]?.user == user  // its first event decides (see take)
            guard s.book.isOwned(id, by: user) || postedHere else {
                stream.endWithoutEvent()
                return
            }
            var replayed = ServerSentEvents.retry.count
            guard stream.write(ServerSentEvents.retry) else { return }
            let history = s.book.events(id, after: lastSeq)
            for i in history.indices {
                let e = history[i]
                let frame = ServerSentEvents.frame(seq: e.seq, state: e.state.rawValue, data: e.body)
                let more = i + 1 < history.endIndex
                let cut = more && replayed + frame.count >= maxReplayBytes
                guard stream.write(frame, end: e.state.isTerminal || cut, limit: Int.max / 2) else { return }
                replayed += frame.count
                if e.state.isTerminal || cut {
                    if cut { metrics.replaysCut.increment() }
                    return
                }
            }
            if s.book.isEnded(id) {  // resumed after the terminal event
                stream.endWithoutEvent()
                return
            }
            s.subscribers[id, default: []].append(Subscriber(stream: stream, user: user, after: lastSeq, replayBytes: replayed))
            s.streams += 1
            s.streamsByUser[user, default: 0] += 1
            metrics.streams.set(Double(s.streams))
        }
    }

    /// Writes a keep-alive comment to every open stream; drops the closed ones.
    func keepAlive() {
        state.withLock { s in
            for (id, subscribers) in s.subscribers {
                var open: [Subscriber] = []
                for sub in subscribers {
                    if sub.stream.write(ServerSentEvents.keepAlive, limit: sub.liveLimit) { open.append(sub) } else { s.closed(sub) }
                }
                s.subscribers[id] = open.isEmpty ? nil : open
            }
            metrics.streams.set(Double(s.streams))
        }
    }

    func prune(heardBefore cutoff: Date, maxBytes: Int, now: Date) {
        state.withLock { s in
            s.book.prune(heardBefore: cutoff, maxBytes: maxBytes)
            s.posted = s.posted.filter { now.timeIntervalSince($0.value.at) < postedFor }
            s.deferred = s.deferred.filter { s.posted[$0.key] != nil }
            metrics.dispatches.set(Double(s.book.count))
        }
    }

    /// Ends every stream (shutdown): clients reconnect to another replica.
    func endAllStreams() {
        state.withLock { s in
            for subscribers in s.subscribers.values {
                for sub in subscribers { sub.stream.endWithoutEvent() }
            }
            s.subscribers = [:]
            s.streams = 0
            s.streamsByUser = [:]
        }
    }
}

extension GatewayState.State {
    /// Counts a stream as gone.
    fileprivate mutating func closed(_ sub: GatewayState.Subscriber) {
        streams -= 1
        let left = (streamsByUser[sub.user] ?? 1) - 1
        streamsByUser[sub.user] = left > 0 ? left : nil
    }
}

struct GatewayMetrics: Sendable {
    let requests: Counter
    let streams: Gauge
    let dispatches: Gauge
    let events: Counter
    let published: Counter
    /// Replays that ended their stream at `maxReplayBytes`, for the client to resume.
    let replaysCut: Counter
    /// Messages read from the status log, copies and markers included: what
    /// catching up costs (a reconnect resumes where the reading left off).
    let logReads: Counter
    /// From an event's `at` to the gateway taking it (the first of its two copies).
    let eventDelay: Histogram
    /// The tokens file read again after a change: `taken`, or `kept` (the tokens in use) when it was not valid.
    let tokenReads: Counter

    init(_ registry: MetricsRegistry) {
        requests = registry.counter("frontdesk_gateway_requests_total", "HTTP requests by status code", labels: ["status"])
        streams = registry.gauge("frontdesk_gateway_streams", "open event streams")
        dispatches = registry.gauge("frontdesk_gateway_dispatches", "dispatches known from the status log")
        events = registry.counter("frontdesk_gateway_events_total", "status events read from the status log")
        eventDelay = registry.histogram(
            "frontdesk_gateway_event_delay_seconds", "from a status event's at to the gateway reading it", buckets: Histogram.latencyBuckets)
        published = registry.counter("frontdesk_gateway_published_total", "commands published, by routing key", labels: ["key"])
        replaysCut = registry.counter(
            "frontdesk_gateway_replays_cut_total", "event streams ended at the replay limit, for the client to resume with Last-Event-ID")
        logReads = registry.counter("frontdesk_gateway_log_reads_total", "messages read from the status log, copies and markers included")
        tokenReads = registry.counter(
            "frontdesk_gateway_token_reads_total", "the tokens file read again after a change: taken, or kept (not valid)", labels: ["result"])
    }
}

extension HTTPStream {
    /// Ends an event stream that has no event left to end it (see `ServerSentEvents.end`).
    fileprivate func endWithoutEvent() { write(ServerSentEvents.end, end: true) }
}
