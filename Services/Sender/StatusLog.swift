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
/// One compact entry per id (12 bytes and the key), because a term keeps it
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
        /// The seq of the dispatch's current waiting copy (park or delay
        /// queue): a copy that surfaces with a lower seq was superseded (by a
        /// reroute, or a newer wait) and is dropped.
        var copySeq: Int32 = 0

        func ended(term: UInt32) -> Bool { terminal || (finishedBy != 0 && finishedBy == term) }
    }

    fileprivate struct State {
        var entries: [String: Entry] = [:]
        /// The current waiting copy of each dispatch that waits, not ended:
        /// what a cancel or reroute needs to act at once, without the copy
        /// that sits in a park or delay queue.
        var waiting: [String: Data] = [:]
        /// When each waiting dispatch's lifetime ends (seconds since 1970),
        /// and its partition. A park queue expires a message only once it
        /// reaches the queue's head, so an older copy with a longer lifetime
        /// would hold a shorter one back for hours; the leader ends these
        /// itself (`dueWaiting`).
        var expiries: [String: (at: UInt32, partition: UInt8)] = [:]
        var terms: UInt32 = 0
        var markers: [String: CheckedContinuation<Bool, Never>] = [:]
        var arrivedMarkers: Set<String> = []
    }

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

    /// The partition of dispatch `id` as the log last saw it, if known.
    func partition(of id: String) -> Int? {
        state.withLock { s in s.entries[id].flatMap { $0.partitionPlusOne == 0 ? nil : Int($0.partitionPlusOne) - 1 } }
    }

    /// The partition of a status routing key's route (`status.<project>.<target>.<state>`), if it names one.
    private func partition(routingKey: String) -> UInt8 {
        let parts = routingKey.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[1] != "_", parts[2] != "_" else { return 0 }
        return UInt8(partitions.partition(of: RoutingTable.Route(project: String(parts[1]), target: String(parts[2]))) + 1)
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

    /// What is known of a dispatch, for the decisions of term `term`.
    func knowledge(_ id: String, term: UInt32) -> DispatchKnowledge? {
        state.withLock { s in
            guard let e = s.entries[id] else { return nil }
            return DispatchKnowledge(
                lastSeq: Int(e.lastSeq), copySeq: Int(e.copySeq), ended: e.ended(term: term), accepted: e.acceptedBy == term,
                waitingBody: s.waiting[id])
        }
    }

    /// The dispatch `id` now waits as the copy `body` with seq `copySeq`
    /// (noted by the leader as it publishes the copy, and read back from the
    /// log at takeover, where id and seq come from the record's properties:
    /// no JSON is parsed).
    func noteWaiting(id: String, copySeq: Int, body: Data, expiresAt: UInt32?, route: RoutingTable.Route?) {
        let seq = Int32(clamping: copySeq)
        let now = Self.now
        // A record without its lifetime or route (written by an older sender) is read for them.
        var expiry = expiresAt
        var route = route
        if expiry == nil || route == nil, let copy = try? ParkedDispatch(jsonData: body) {
            expiry = expiry ?? RFC3339.parse(copy.record.expiresAt).map(Self.seconds)
            route = route ?? RoutingTable.Route(project: copy.project.id, target: copy.target.id)
        }
        let partition = route.map { UInt8(partitions.partition(of: $0) + 1) } ?? 0
        state.withLock { s in
            var e = s.entries[id] ?? Entry()
            e.seenAt = now
            guard !e.terminal, e.finishedBy == 0, seq >= e.copySeq else { return s.entries[id] = e }
            e.copySeq = seq
            if partition != 0 { e.partitionPlusOne = partition }
            s.entries[id] = e
            s.waiting[id] = body
            s.expiries[id] = expiry.map { ($0, partition) }
        }
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
        let wanted = UInt8(clamping: partition + 1)
        let single = partitions.count == 1
        return state.withLock { s in
            var due: [String] = []
            for (id, e) in s.expiries where e.at <= now && (single || e.partition == wanted) {
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

    /// When the reader last took a message (seconds since 1970): a wait for a
    /// marker gives up only once the reader stops making progress.
    let lastIngest = Atomic<Double>(Date().timeIntervalSince1970)

    /// Ends every wait for a marker (the reader stopped: none will come).
    func giveUpAll() {
        let waiting = state.withLock { s -> [CheckedContinuation<Bool, Never>] in
            defer { s.markers = [:] }
            return Array(s.markers.values)
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
            guard let id = d.properties.correlationID, let messageID = d.properties.messageID,
                let slash = messageID.lastIndex(of: "/"), let seq = Int(messageID[messageID.index(after: slash)...])
            else { return }
            var expiresAt: UInt32?
            if case .int64(let t)? = d.properties.headers?[Self.expiresAtHeader] { expiresAt = UInt32(clamping: t) }
            var route: RoutingTable.Route?
            if case .string(let r)? = d.properties.headers?[Self.routeHeader], let dot = r.firstIndex(of: ".") {
                route = RoutingTable.Route(project: String(r[..<dot]), target: String(r[r.index(after: dot)...]))
            }
            noteWaiting(id: id, copySeq: seq, body: d.body, expiresAt: expiresAt, route: route)
            return
        }
        if d.properties.type == Self.markerType, d.routingKey == Self.stream, let marker = d.properties.messageID {
            let waiter = state.withLock { s -> CheckedContinuation<Bool, Never>? in
                if let w = s.markers.removeValue(forKey: marker) { return w }
                s.arrivedMarkers.insert(marker)
                return nil
            }
            waiter?.resume(returning: true)
            return
        }
        // Status events come through the status exchange, where only the services publish.
        guard d.routingKey != Self.stream else { return }
        note(properties: d.properties, routingKey: d.routingKey)
    }

    /// Records one status event by its properties and routing key. Also
    /// called by the leader for its own events as soon as they are confirmed,
    /// so that what it decides next never waits for the stream to catch up.
    func note(properties: AMQPProperties, routingKey: String) {
        guard let id = properties.correlationID, let messageID = properties.messageID,
            let slash = messageID.lastIndex(of: "/"), let seq = Int(messageID[messageID.index(after: slash)...])
        else { return }
        let stateName = routingKey.split(separator: ".").last.map(String.init) ?? ""
        let terminal = ["replied", "failed", "cancelled"].contains(stateName)
        let partition = partitions.count == 1 ? 1 : partition(routingKey: routingKey)
        update(id) { e in
            e.lastSeq = max(e.lastSeq, Int32(clamping: seq))
            e.terminal = e.terminal || terminal
            if partition != 0 { e.partitionPlusOne = partition }
        }
        if terminal { state.withLock { s in s.stopWaiting(id) } }
    }

    func markAccepted(_ id: String, term: UInt32) { update(id) { $0.acceptedBy = term } }

    func markFinished(_ id: String, term: UInt32) {
        update(id) { $0.finishedBy = term }
        state.withLock { s in s.stopWaiting(id) }
    }

    /// Waits until the marker published with this id has been read.
    /// Waits until `marker` has been read; false when `giveUp(marker:)` came first.
    func waitFor(marker: String) async -> Bool {
        await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            let arrived = state.withLock { s -> Bool in
                if s.arrivedMarkers.remove(marker) != nil { return true }
                s.markers[marker] = c
                return false
            }
            if arrived { c.resume(returning: true) }
        }
    }

    /// Ends a wait for `marker` that has not been read (the reader stopped, or took too long).
    func giveUp(marker: String) {
        state.withLock { $0.markers.removeValue(forKey: marker) }?.resume(returning: false)
    }

    /// Forgets dispatches not heard of for `seconds`.
    func prune(olderThan seconds: Int) {
        let horizon = Self.now &- UInt32(clamping: seconds)
        state.withLock { s in
            s.entries = s.entries.filter { $0.value.seenAt > horizon }
            s.waiting = s.waiting.filter { s.entries[$0.key] != nil }
            s.expiries = s.expiries.filter { s.entries[$0.key] != nil }
        }
    }
}

extension StatusLog.State {
    fileprivate mutating func stopWaiting(_ id: String) {
        waiting[id] = nil
        expiries[id] = nil
    }
}
