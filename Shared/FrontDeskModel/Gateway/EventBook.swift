import Foundation

/// What the gateway knows of each dispatch: its status events in seq order
/// (the bodies as published), and whose it is. Filled from the status log,
/// pruned by age and size. Pure: the caller supplies the time.
public struct EventBook: Sendable {
    public struct Event: Sendable, Equatable {
        public var seq: Int
        public var state: DispatchState
        public var body: Data
    }

    struct Entry: Sendable {
        var user: String?
        var events: [Event] = []
        var heardAt: Date
        var bytes = 0
        var terminal: Bool { events.last?.state.isTerminal ?? false }
    }

    private var entries: [String: Entry] = [:]
    public private(set) var bytes = 0
    public var count: Int { entries.count }

    public init() {}

    /// The fields of a status event body the gateway reads; nil for anything else.
    public static func read(_ body: Data) -> (id: String, seq: Int, state: DispatchState, user: String?, at: String?)? {
        guard let fields = try? JSONFields(body), let id = try? fields.string("dispatchId"), Identifiers.isValidDispatchID(id),
            let seq = try? fields.int("seq", in: 1...Int(Int32.max)),
            let stateText = try? fields.string("state"), let state = DispatchState(rawValue: stateText)
        else { return nil }
        return (id, seq, state, (try? fields.optionalString("user")) ?? nil, (try? fields.optionalString("at")) ?? nil)
    }

    /// Adds an event; false when it is already known (same seq) or the
    /// dispatch ended before it (nothing follows a terminal event). An agent
    /// sets the pace of a dispatch's events: adding one costs O(log n) to
    /// find its place and, in seq order (the usual case), O(1) to store, as
    /// the entry is changed where it lies (a copy would copy all its events).
    @discardableResult
    public mutating func add(id: String, seq: Int, state: DispatchState, user: String?, body: Data, now: Date) -> Bool {
        let added = Self.add(to: &entries[id, default: Entry(user: user, heardAt: now)], seq: seq, state: state, user: user, body: body, now: now)
        if added { bytes += body.count }
        return added
    }

    private static func add(to entry: inout Entry, seq: Int, state: DispatchState, user: String?, body: Data, now: Date) -> Bool {
        let i = entry.events.start(after: seq)
        if i > 0, entry.events[i - 1].seq == seq { return false }
        if let last = entry.events.last, last.state.isTerminal, seq > last.seq { return false }
        if entry.user == nil { entry.user = user }
        let event = Event(seq: seq, state: state, body: body)
        if i == entry.events.count {
            entry.events.append(event)
        } else {
            entry.events.insert(event, at: i)
        }
        entry.heardAt = now
        entry.bytes += body.count
        return true
    }

    public func knows(_ id: String) -> Bool { entries[id] != nil }

    /// Whether the event `seq` of `id` is known, or comes after the dispatch
    /// ended: a second copy needs no reading. An earlier event of an ended
    /// dispatch is not known yet when the terminal one came first (by the live
    /// queue, while the log was still being read): it is still wanted.
    public func has(_ id: Substring, seq: Int) -> Bool {
        guard let e = entries[String(id)] else { return false }
        if let last = e.events.last, last.state.isTerminal, seq > last.seq { return true }
        let i = e.events.start(after: seq)
        return i > 0 && e.events[i - 1].seq == seq
    }

    /// The dispatch's owner, when the dispatch is known (nil inside: a request without a user).
    public func owner(_ id: String) -> String?? { entries[id].map { $0.user } }

    /// Whether `user` may see the dispatch: it is known and theirs.
    public func isOwned(_ id: String, by user: String) -> Bool { entries[id]?.user == user }

    public func latest(_ id: String) -> Event? { entries[id]?.events.last }

    /// The events after `seq`, in seq order: a view of the book's own, not a
    /// copy (a replay in parts looks at a long history once per part).
    public func events(_ id: String, after seq: Int) -> ArraySlice<Event> {
        guard let events = entries[id]?.events else { return [] }
        return events[events.start(after: seq)...]
    }

    public func isEnded(_ id: String) -> Bool { entries[id]?.terminal ?? false }

    /// Forgets dispatches not heard of since `cutoff`, then, while over
    /// `maxBytes`, the ended ones heard of longest ago.
    public mutating func prune(heardBefore cutoff: Date, maxBytes: Int) {
        for (id, e) in entries where e.heardAt < cutoff {
            bytes -= e.bytes
            entries[id] = nil
        }
        guard bytes > maxBytes else { return }
        let ended = entries.filter { $0.value.terminal }.sorted { $0.value.heardAt < $1.value.heardAt }
        for (id, e) in ended {
            guard bytes > maxBytes else { break }
            bytes -= e.bytes
            entries[id] = nil
        }
    }
}

extension Array where Element == EventBook.Event {
    /// The index of the first event whose seq is above `seq` (`count` if
    /// none): the events are in seq order.
    func start(after seq: Int) -> Int {
        var low = 0, high = count
        while low < high {
            let mid = low + (high - low) / 2
            if self[mid].seq <= seq { low = mid + 1 } else { high = mid }
        }
        return low
    }
}
