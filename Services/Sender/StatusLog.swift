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
        /// This term took a hand-off of it: another hand-off is a duplicate.
        var accepted = false
        /// This term finished it (its terminal event may still await its confirm).
        var finished = false
        /// The seq of the dispatch's current waiting copy (park or delay
        /// queue): a copy that surfaces with a lower seq was superseded (by a
        /// reroute, or a newer wait) and is dropped.
        var copySeq: Int32 = 0

        var ended: Bool { terminal || finished }
    }

    fileprivate struct State {
        var entries: [String: Entry] = [:]
        /// The current waiting copy of each dispatch that waits, not ended:
        /// what a cancel or reroute needs to act at once, without the copy
        /// that sits in a park or delay queue.
        var waiting: [String: Data] = [:]
        /// When each waiting dispatch's lifetime ends (seconds since 1970).
        /// A park queue expires a message only once it reaches the queue's
        /// head, so an older copy with a longer lifetime would hold a shorter
        /// one back for hours; the leader ends these itself (`dueWaiting`).
        var expiries: [String: UInt32] = [:]
        var markers: [String: CheckedContinuation<Bool, Never>] = [:]
        var arrivedMarkers: Set<String> = []
    }

    private let state = Mutex(State())
    /// The sender's login: waiting records and markers by anyone else are not read.
    private let writer: String

    init(writer: String) { self.writer = writer }

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

    /// What is known of a dispatch, for the term's decisions.
    func knowledge(_ id: String) -> DispatchKnowledge? {
        state.withLock { s in
            guard let e = s.entries[id] else { return nil }
            return DispatchKnowledge(
                lastSeq: Int(e.lastSeq), copySeq: Int(e.copySeq), ended: e.ended, accepted: e.accepted, waitingBody: s.waiting[id])
        }
    }

    /// The dispatch `id` now waits as the copy `body` with seq `copySeq`
    /// (noted by the leader as it publishes the copy, and read back from the
    /// log at takeover, where id and seq come from the record's properties:
    /// no JSON is parsed).
    func noteWaiting(id: String, copySeq: Int, body: Data, expiresAt: UInt32?) {
        let seq = Int32(clamping: copySeq)
        let now = Self.now
        // A record without its lifetime (written by an older sender) is read for it.
        let expiry = expiresAt ?? (try? ParkedDispatch(jsonData: body)).flatMap { RFC3339.parse($0.record.expiresAt) }.map(Self.seconds)
        state.withLock { s in
            var e = s.entries[id] ?? Entry()
            e.seenAt = now
            guard !e.ended, seq >= e.copySeq else { return s.entries[id] = e }
            e.copySeq = seq
            s.entries[id] = e
            s.waiting[id] = body
            s.expiries[id] = expiry
        }
    }

    /// Seconds since 1970, rounded up (an expiry is never due early) and
    /// clamped to what a UInt32 holds (no trap for any date).
    static func seconds(_ date: Date) -> UInt32 {
        let t = date.timeIntervalSince1970.rounded(.up)
        return t.isFinite ? UInt32(clamping: Int(max(0, min(t, Double(UInt32.max))))) : 0
    }

    /// The waiting dispatches whose lifetime has ended by `now`, at most `limit`.
    func dueWaiting(now: Date, limit: Int) -> [String] {
        let now = UInt32(clamping: Int(max(0, min(now.timeIntervalSince1970.rounded(.down), Double(UInt32.max)))))
        return state.withLock { s in
            var due: [String] = []
            for (id, at) in s.expiries where at <= now {
                due.append(id)
                if due.count >= limit { break }
            }
            return due
        }
    }

    /// The header on a waiting record that carries the dispatch's expiry (seconds since 1970).
    static let expiresAtHeader = "x-frontdesk-expires-at"

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
            noteWaiting(id: id, copySeq: seq, body: d.body, expiresAt: expiresAt)
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
        update(id) { e in
            e.lastSeq = max(e.lastSeq, Int32(clamping: seq))
            e.terminal = e.terminal || terminal
        }
        if terminal { state.withLock { s in s.stopWaiting(id) } }
    }

    func markAccepted(_ id: String) { update(id) { $0.accepted = true } }

    func markFinished(_ id: String) {
        update(id) { $0.finished = true }
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
