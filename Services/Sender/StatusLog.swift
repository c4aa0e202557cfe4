import AMQP
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// What is known of each dispatch within the lifetime window: its highest
/// seq and whether it ended, from the status events published so far (read
/// from the stream `frontdesk.status.log` at takeover, then noted by the
/// leader as its own events are confirmed), and whether this term took a
/// hand-off of it or finished it. A new leader knows what earlier leaders
/// published before it decides anything; a second hand-off or copy of a
/// dispatch is recognised by its entry. Id, seq and state come from the
/// message's properties and routing key: no JSON is parsed.
///
/// One compact entry per id (about 20 bytes and the key), because a term keeps it
/// for every dispatch it parks or finishes, for the whole 4-hour window.
final class StatusLog: Sendable {
    struct Entry: Sendable {
        var lastSeq: Int32 = 0
        /// When last heard of, in seconds since 1970: `prune` forgets old ones.
        var seenAt: UInt32 = 0
        /// A terminal event of it has been published.
        var terminal = false
        /// The term that took a hand-off of it (0: none): another hand-off
        /// is a duplicate for that term. A log shared by the terms of one
        /// replica (one a partition) tells its terms apart by number.
        var acceptedBy: UInt32 = 0
        /// The term that finished it (its terminal event may still await its confirm).
        var finishedBy: UInt32 = 0
        /// Its partition + 1, from the route of its latest event or waiting
        /// record (0: not known yet): where a reply for it goes.
        var partitionPlusOne: UInt8 = 0
        /// The partition + 1 that wrote its current waiting copy (0: not known).
        var copyWriterPlusOne: UInt8 = 0
        /// The seq of the dispatch's current waiting copy (park or delay
        /// queue): a copy that surfaces with a lower seq was superseded (by a
        /// reroute, or a newer wait) and is dropped.
        var copySeq: Int32 = 0

        func ended(term: UInt32) -> Bool { terminal || (finishedBy != 0 && finishedBy == term) }
    }

    /// A copy a term has just published and noted, not yet confirmed: only
    /// that term decides by it (a copy it supersedes may surface before the
    /// confirm). Confirmed, it becomes the entry's; if the term dies first,
    /// no other term is misled by a copy that may not exist.
    struct Tentative: Sendable {
        var term: UInt32
        var copySeq: Int32
        var body: Data
        var partitionPlusOne: UInt8
        var writerPlusOne: UInt8
    }

    fileprivate struct State {
        var entries: [String: Entry] = [:]
        /// The current waiting copy of each dispatch that waits, not ended:
        /// what a cancel or reroute needs to act at once, without the copy
        /// that sits in a park or delay queue.
        var waiting: [String: Data] = [:]
        var tentative: [String: Tentative] = [:]
        /// When each waiting dispatch's lifetime ends (seconds since 1970),
        /// by partition + 1. A park queue expires a message only once it
        /// reaches the queue's head, so an older copy with a longer lifetime
        /// would hold a shorter one back for hours; the leader ends these
        /// itself (`dueWaiting`).
        var expiries: [UInt8: [String: UInt32]] = [:]
        var terms: UInt32 = 0
        /// Markers this replica waits for (a continuation once someone
        /// waits), and those of them that arrived before the wait: markers
        /// of other replicas are not kept.
        var markers: [String: CheckedContinuation<Bool, Never>?] = [:]
        var arrivedMarkers: Set<String> = []
        /// Each sender replica's last heartbeat in the log: when it was read
        /// (seconds since 1970), the partitions it led, and whether it stood by.
        var heartbeats: [String: (at: Double, led: [Int], standingBy: Bool)] = [:]
        /// The terminal events read from the stream lately, by dispatch, and
        /// their ids oldest first (at most `maxRecentEnds`).
        var recentEnds: [String: RecentEnd] = [:]
        var recentEndOrder: [String] = []
        var recentEndHead = 0
    }

    /// A terminal event as the stream holds it. A nack does not unroute, and
    /// a node can die between routing to the stream and to a quorum queue:
    /// an end the log shows may never have reached the surfaces. A leader
    /// that drops a lease (or copy) of an ended dispatch publishes it again.
    struct RecentEnd: Sendable {
        let seq: Int
        let routingKey: String
        let body: Data
    }

    /// Terminal events kept for `recentEnd` (the last few seconds' worth at
    /// the maximum rate: a dead leader's last windows), and the largest body kept.
    static let maxRecentEnds = 10_000
    static let maxRecentEndBody = 32 * 1024

    private let state = Mutex(State())
    /// The sender's login: waiting records and markers by anyone else are not read.
    private let writer: String
    let partitions: SenderPartitions

    init(writer: String, partitions: SenderPartitions = .one) {
        self.writer = writer
        self.partitions = partitions
    }

    /// A number for a new term that decides with this log (never 0).
    func newTerm() -> UInt32 {
        state.withLock { s in
            s.terms &+= 1
            if s.terms == 0 { s.terms = 1 }
            return s.terms
        }
    }

    subscript(id: String) -> Entry? { state.withLock { $0.entries[id] } }

    private static var now: UInt32 { UInt32(clamping: Int(Date().timeIntervalSince1970)) }

    private func update(_ id: String, _ change: (inout Entry) -> Void) {
        let now = Self.now
        state.withLock { s in
            var e = s.entries[id] ?? Entry()
            change(&e)
            e.seenAt = now
            s.entries[id] = e
        }
    }

    /// The stream this log is read from.
    static let stream = SharedTopology.statusLog

    /// A marker a new leader writes to know where the log ends.
    static let markerType = "frontdesk.sender.marker.v1"

    /// The type of a waiting record in the log: the body of a copy just parked or delayed.
    static let waitingType = "frontdesk.sender.waiting.v1"

    /// A sender replica's heartbeat (message_id: the replica's id; header
    /// `x-frontdesk-led`: the partitions it leads, e.g. "0,2";
    /// `x-frontdesk-standby`: "1" while a slot of it stands by, able to take
    /// a partition), every `SenderService.heartbeatInterval` with several
    /// partitions: the replicas count each other by them, and see which
    /// partitions have a live leader and which replica is short of its floor.
    static let heartbeatType = "frontdesk.sender.heartbeat.v1"
    static let ledHeader = "x-frontdesk-led"
    static let standbyHeader = "x-frontdesk-standby"

    /// The partition + 1 a route's copy belongs to (1 with one partition).
    private func partitionPlusOne(_ route: RoutingTable.Route?) -> UInt8 {
        guard partitions.count > 1 else { return 1 }
        return route.map { UInt8(partitions.partition(of: $0) + 1) } ?? 0
    }

    /// The partition of a status routing key's route (`status.<project>.<target>.<state>`) + 1, if it names one.
    private func partitionPlusOne(routingKey: String) -> UInt8 {
        guard partitions.count > 1 else { return 1 }
        let parts = routingKey.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[1] != "_", parts[2] != "_" else { return 0 }
        return partitionPlusOne(RoutingTable.Route(project: String(parts[1]), target: String(parts[2])))
    }

    /// The partition of dispatch `id` as this replica last saw it
    /// (confirmed: a dying term's unconfirmed move does not count), if known.
    func partition(of id: String) -> Int? {
        state.withLock { s in
            let p = s.entries[id]?.partitionPlusOne ?? 0
            return p == 0 ? nil : Int(p) - 1
        }
    }

    /// Forgets the unconfirmed notes of a term that ended.
    func dropTentatives(term: UInt32) {
        state.withLock { s in s.tentative = s.tentative.filter { $0.value.term != term } }
    }

    /// Forgets the heartbeats read so far: a new reader replays old ones
    /// (of replicas long gone) before it reaches the log's end.
    func clearHeartbeats() {
        state.withLock { $0.heartbeats = [:] }
    }

    /// What is known of a dispatch, for the decisions of term `term`.
    func knowledge(_ id: String, term: UInt32) -> DispatchKnowledge? {
        state.withLock { s in
            guard let e = s.entries[id] else { return nil }
            var copySeq = e.copySeq
            var body = s.waiting[id]
            var partition = e.partitionPlusOne
            var writer = e.copyWriterPlusOne
            if let t = s.tentative[id], t.term == term, t.copySeq >= copySeq {
                copySeq = t.copySeq
                body = t.body
                partition = t.partitionPlusOne
                writer = t.writerPlusOne
            }
            let ended = e.ended(term: term)
            return DispatchKnowledge(
                lastSeq: Int(e.lastSeq), copySeq: Int(copySeq), ended: ended, accepted: e.acceptedBy == term,
                waitingBody: ended ? nil : body, partition: partition == 0 ? nil : Int(partition) - 1,
                copyWriter: writer == 0 ? nil : Int(writer) - 1)
        }
    }

    /// The dispatch `id` now waits as the copy `body` with seq `copySeq`:
    /// noted by term `term` as it publishes the copy (tentative until
    /// confirmed), or confirmed (`term` nil: by the confirm, or read back
    /// from the log, where id and seq come from the record's properties: no
    /// JSON is parsed).
    func noteWaiting(
        id: String, copySeq: Int, body: Data, expiresAt: UInt32?, route: RoutingTable.Route?, writer: Int? = nil, term: UInt32? = nil
    ) {
        let seq = Int32(clamping: copySeq)
        let now = Self.now
        // A record without its lifetime or route (written by an older sender) is read for them.
        var expiry = expiresAt
        var route = route
        if expiry == nil || route == nil, let copy = try? ParkedDispatch(jsonData: body) {
            expiry = expiry ?? RFC3339.parse(copy.record.expiresAt).map(Self.seconds)
            route = route ?? copy.route
        }
        let partition = partitionPlusOne(route)
        let writerPlusOne = writer.map { UInt8(clamping: $0 + 1) } ?? 0
        state.withLock { s in
            var e = s.entries[id] ?? Entry()
            e.seenAt = now
            s.entries[id] = e
            guard !e.terminal, seq >= e.copySeq else { return }
            if let term {
                guard e.finishedBy != term, seq >= s.tentative[id].map({ $0.term == term ? $0.copySeq : 0 }) ?? 0 else { return }
                s.tentative[id] = Tentative(term: term, copySeq: seq, body: body, partitionPlusOne: partition, writerPlusOne: writerPlusOne)
                return
            }
            e.copySeq = seq
            e.copyWriterPlusOne = writerPlusOne
            // As for events (`note`): a record repeated after later events does not say where it is.
            if partition != 0, seq >= e.lastSeq { e.partitionPlusOne = partition }
            s.entries[id] = e
            s.waiting[id] = body
            if let t = s.tentative[id], t.copySeq <= seq { s.tentative[id] = nil }
            for k in Array(s.expiries.keys) where k != partition { s.expiries[k]?[id] = nil }
            s.expiries[partition, default: [:]][id] = expiry
        }
    }

    /// A waiting record (read from the log, or ours confirmed): id and seq
    /// from its properties, lifetime and route from its headers.
    func noteWaitingRecord(properties: AMQPProperties, body: Data) {
        guard let id = properties.correlationID, let messageID = properties.messageID,
            let slash = messageID.lastIndex(of: "/"), let seq = Int(messageID[messageID.index(after: slash)...])
        else { return }
        var expiresAt: UInt32?
        if case .int64(let t)? = properties.headers?[Self.expiresAtHeader] { expiresAt = UInt32(clamping: t) }
        var route: RoutingTable.Route?
        if case .string(let r)? = properties.headers?[Self.routeHeader], let dot = r.firstIndex(of: ".") {
            route = RoutingTable.Route(project: String(r[..<dot]), target: String(r[r.index(after: dot)...]))
        }
        var writer: Int?
        if case .int64(let w)? = properties.headers?[Self.writerHeader], (0..<Int64(SenderPartitions.maxCount)).contains(w) { writer = Int(w) }
        noteWaiting(id: id, copySeq: seq, body: body, expiresAt: expiresAt, route: route, writer: writer)
    }

    /// Seconds since 1970, rounded up (an expiry is never due early) and
    /// clamped to what a UInt32 holds (no trap for any date).
    static func seconds(_ date: Date) -> UInt32 {
        let t = date.timeIntervalSince1970.rounded(.up)
        return t.isFinite ? UInt32(clamping: Int(max(0, min(t, Double(UInt32.max))))) : 0
    }

    /// The waiting dispatches of partition `partition` whose lifetime has ended by `now`, at most `limit`.
    func dueWaiting(now: Date, limit: Int, partition: Int = 0) -> [String] {
        let now = UInt32(clamping: Int(max(0, min(now.timeIntervalSince1970.rounded(.down), Double(UInt32.max)))))
        let key = partitions.count == 1 ? 1 : UInt8(clamping: partition + 1)
        return state.withLock { s in
            var due: [String] = []
            for (id, at) in s.expiries[key] ?? [:] where at <= now {
                due.append(id)
                if due.count >= limit { break }
            }
            return due
        }
    }

    /// The header on a waiting record that carries the dispatch's expiry (seconds since 1970).
    static let expiresAtHeader = "x-frontdesk-expires-at"
    /// The header on a waiting record that carries the copy's route, `<project>.<target>`.
    static let routeHeader = "x-frontdesk-route"
    /// The header on a waiting record that carries the partition that wrote it.
    static let writerHeader = "x-frontdesk-writer"

    /// When the reader last took a message (seconds since 1970): a wait for a
    /// marker gives up only once the reader stops making progress.
    let lastIngest = Atomic<Double>(Date().timeIntervalSince1970)

    /// Ends every wait for a marker (the reader stopped: none will come).
    func giveUpAll() {
        let waiting = state.withLock { s -> [CheckedContinuation<Bool, Never>] in
            defer {
                s.markers = [:]
                s.arrivedMarkers = []
            }
            return s.markers.values.compactMap { $0 }
        }
        for w in waiting { w.resume(returning: false) }
    }

    func ingest(_ d: AMQPDelivery) {
        lastIngest.store(Date().timeIntervalSince1970, ordering: .relaxed)
        // Waiting records and markers are published straight to the stream
        // (routing key = its name); anything routed in from the status
        // exchange is a status event, whatever its type says.
        if d.routingKey == Self.stream, d.properties.userID != writer {
            return  // put in the stream by name, by someone other than a sender: not read
        }
        if d.properties.type == Self.waitingType, d.routingKey == Self.stream {
            return noteWaitingRecord(properties: d.properties, body: d.body)
        }
        if d.properties.type == Self.markerType, d.routingKey == Self.stream, let marker = d.properties.messageID {
            let waiter = state.withLock { s -> CheckedContinuation<Bool, Never>? in
                guard let expected = s.markers.removeValue(forKey: marker) else { return nil }  // not one of ours
                if let w = expected { return w }
                s.arrivedMarkers.insert(marker)
                return nil
            }
            waiter?.resume(returning: true)
            return
        }
        if d.properties.type == Self.heartbeatType, d.routingKey == Self.stream, let replica = d.properties.messageID {
            var led: [Int] = []
            if case .string(let list)? = d.properties.headers?[Self.ledHeader] {
                led = list.split(separator: ",").prefix(SenderPartitions.maxCount).compactMap { Int($0) }
            }
            // Without the header (a replica of an older build): standing by,
            // as every replica was taken to be before the header.
            var standingBy = true
            if case .string(let flag)? = d.properties.headers?[Self.standbyHeader] { standingBy = flag == "1" }
            let now = Date().timeIntervalSince1970
            state.withLock { s in s.heartbeats[String(replica.prefix(64))] = (now, led, standingBy) }
            return
        }
        // Status events come through the status exchange, where only the services publish.
        guard d.routingKey != Self.stream else { return }
        note(properties: d.properties, routingKey: d.routingKey)
        if Self.isTerminal(routingKey: d.routingKey), d.body.count <= Self.maxRecentEndBody,
            let id = d.properties.correlationID, let seq = Self.seq(of: d.properties)
        {
            keepRecentEnd(id, RecentEnd(seq: seq, routingKey: d.routingKey, body: d.body))
        }
    }

    private func keepRecentEnd(_ id: String, _ end: RecentEnd) {
        state.withLock { s in
            if s.recentEnds.updateValue(end, forKey: id) != nil { return }  // kept already: its place stays
            if s.recentEndOrder.count < Self.maxRecentEnds {
                s.recentEndOrder.append(id)
            } else {
                // A ring: the oldest id gives its place up.
                let oldest = s.recentEndOrder[s.recentEndHead]
                if oldest != id { s.recentEnds[oldest] = nil }
                s.recentEndOrder[s.recentEndHead] = id
                s.recentEndHead = (s.recentEndHead + 1) % Self.maxRecentEnds
            }
        }
    }

    /// The terminal event of `id` read from the stream lately, if kept.
    func recentEnd(_ id: String) -> RecentEnd? { state.withLock { $0.recentEnds[id] } }

    /// Whether the key's last word is a terminal state: read in place, with
    /// no array of words or strings made (called for every event confirmed).
    static func isTerminal(routingKey: String) -> Bool {
        let utf8 = routingKey.utf8
        let last = utf8.lastIndex(of: UInt8(ascii: ".")).map { utf8[utf8.index(after: $0)...] } ?? utf8[...]
        return last.elementsEqual("replied".utf8) || last.elementsEqual("failed".utf8) || last.elementsEqual("cancelled".utf8)
    }

    /// The seq in a status event's message id (`<dispatch>/<seq>`).
    static func seq(of properties: AMQPProperties) -> Int? {
        guard let messageID = properties.messageID, let slash = messageID.lastIndex(of: "/") else { return nil }
        return Int(messageID[messageID.index(after: slash)...])
    }

    /// The replicas whose heartbeat was read within the last `seconds` (older
    /// ones are forgotten), the partitions those other than `me` lead, and
    /// those others as their heartbeats show them.
    func replicas(within seconds: Double, me: String) -> (count: Int, claimed: Set<Int>, peers: [PartitionBalance.Peer]) {
        let horizon = Date().timeIntervalSince1970 - seconds
        return state.withLock { s in
            s.heartbeats = s.heartbeats.filter { $0.value.at >= horizon }
            var claimed = Set<Int>()
            var peers: [PartitionBalance.Peer] = []
            for (replica, beat) in s.heartbeats where replica != me {
                claimed.formUnion(beat.led)
                peers.append(.init(id: replica, led: Set(beat.led).count, standingBy: beat.standingBy))
            }
            return (s.heartbeats.count, claimed, peers)
        }
    }

    /// Records one status event by its properties and routing key. Also
    /// called by the leader for its own events as soon as they are confirmed,
    /// so that what it decides next never waits for the stream to catch up.
    func note(properties: AMQPProperties, routingKey: String) {
        guard let id = properties.correlationID, let seq = Self.seq(of: properties) else { return }
        let terminal = Self.isTerminal(routingKey: routingKey)
        let partition = partitionPlusOne(routingKey: routingKey)
        update(id) { e in
            // A repeated event may come after later ones (published again
            // when its confirm was overdue): only the latest says where it is.
            if partition != 0, Int32(clamping: seq) >= e.lastSeq { e.partitionPlusOne = partition }
            e.lastSeq = max(e.lastSeq, Int32(clamping: seq))
            e.terminal = e.terminal || terminal
        }
        if terminal { state.withLock { s in s.stopWaiting(id) } }
    }

    func markAccepted(_ id: String, term: UInt32) { update(id) { $0.acceptedBy = term } }

    /// Term `term` finished it: for that term it has ended at once; for
    /// others once its terminal event is confirmed (the term may die first).
    func markFinished(_ id: String, term: UInt32) { update(id) { $0.finishedBy = term } }

    /// Says that this replica will wait for `marker`: call before publishing it.
    func expect(marker: String) { state.withLock { $0.markers[marker] = .some(nil) } }

    /// Waits until `marker` (expected) has been read; false when `giveUp(marker:)` came first.
    func waitFor(marker: String) async -> Bool {
        await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            let arrived = state.withLock { s -> Bool? in
                if s.arrivedMarkers.remove(marker) != nil { return true }
                guard s.markers[marker] != nil else { return false }  // given up already
                s.markers[marker] = c
                return nil
            }
            if let arrived { c.resume(returning: arrived) }
        }
    }

    /// Ends a wait for `marker` that has not been read (the reader stopped, or took too long).
    func giveUp(marker: String) {
        let waiter = state.withLock { s -> CheckedContinuation<Bool, Never>? in
            s.arrivedMarkers.remove(marker)
            return s.markers.removeValue(forKey: marker) ?? nil
        }
        waiter?.resume(returning: false)
    }

    /// Forgets dispatches not heard of for `seconds`.
    func prune(olderThan seconds: Int) {
        let horizon = Self.now &- UInt32(clamping: seconds)
        state.withLock { s in
            s.entries = s.entries.filter { $0.value.seenAt > horizon }
            s.waiting = s.waiting.filter { s.entries[$0.key] != nil }
            s.tentative = s.tentative.filter { s.entries[$0.key] != nil }
            for k in Array(s.expiries.keys) { s.expiries[k] = s.expiries[k]?.filter { s.entries[$0.key] != nil } }
        }
    }
}

extension StatusLog.State {
    fileprivate mutating func stopWaiting(_ id: String) {
        waiting[id] = nil
        tentative[id] = nil
        // Over a copy of the keys: iterating the dictionary's own keys while
        // editing it copies each inner dictionary whole (O(n) a call).
        for k in Array(expiries.keys) { expiries[k]?[id] = nil }
    }
}
