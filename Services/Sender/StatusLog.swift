import AMQP
import Foundation
import Synchronization

/// What the status events published so far say about each dispatch: its
/// highest seq and whether it ended. Read from the stream
/// `frontdesk.status.log` (bound to every status event), so a new leader
/// knows what earlier leaders published before it decides anything.
/// Id, seq and state come from the message's properties and routing key:
/// no JSON is parsed.
final class StatusLog: Sendable {
    struct Entry: Sendable {
        var lastSeq: Int
        var terminal: Bool
        var seenAt: Date
    }

    private struct State {
        var entries: [String: Entry] = [:]
        var markers: [String: CheckedContinuation<Void, Never>] = [:]
        var arrivedMarkers: Set<String> = []
    }

    private let state = Mutex(State())

    subscript(id: String) -> Entry? { state.withLock { $0.entries[id] } }

    func ingest(_ d: AMQPDelivery) {
        if d.properties.type == "frontdesk.sender.marker.v1", let marker = d.properties.messageID {
            let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
                if let w = s.markers.removeValue(forKey: marker) { return w }
                s.arrivedMarkers.insert(marker)
                return nil
            }
            waiter?.resume()
            return
        }
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
        state.withLock { s in
            var e = s.entries[id] ?? Entry(lastSeq: 0, terminal: false, seenAt: Date())
            e.lastSeq = max(e.lastSeq, seq)
            e.terminal = e.terminal || terminal
            e.seenAt = Date()
            s.entries[id] = e
        }
    }

    /// Waits until the marker published with this id has been read.
    func waitFor(marker: String) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let arrived = state.withLock { s -> Bool in
                if s.arrivedMarkers.remove(marker) != nil { return true }
                s.markers[marker] = c
                return false
            }
            if arrived { c.resume() }
        }
    }

    /// Forgets dispatches not heard of for `seconds`.
    func prune(olderThan seconds: Int) {
        let horizon = Date().addingTimeInterval(-Double(seconds))
        state.withLock { s in s.entries = s.entries.filter { $0.value.seenAt > horizon } }
    }
}
