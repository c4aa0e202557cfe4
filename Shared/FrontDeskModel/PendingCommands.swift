import Foundation

/// Cancels and reroutes that came before their dispatch, kept for the
/// lifetime window and applied when it shows up. A value: the sender term
/// holds one; the tests drive it with any clock.
///
/// Each command counts from when it reached the sender (for one read back
/// from the commands stream, when it was written there, to the second): one
/// that came more than the window before its request is not applied, as the
/// request can no longer be the one it was meant for (CONTRACT.md:
/// "remembered for the lifetime window"). Callers ask at the time the
/// request came, not when they handle it.
public struct PendingCommands: Sendable {
    private struct Entry: Sendable {
        var cancel: (reason: String, at: Date)?
        var reroute: (route: RoutingTable.Route, at: Date)?

        func newest() -> Date {
            max(cancel?.at ?? .distantPast, reroute?.at ?? .distantPast)
        }
    }

    private var entries: [String: Entry] = [:]

    public init() {}

    public var count: Int { entries.count }

    /// Keeps `command`; a cancel wins over any reroute, and a later reroute
    /// replaces an earlier one. Of two cancels the first one's reason stands
    /// and the newest one's time counts, unless the first came more than
    /// `window` seconds before (nil: no window): then the new one replaces it
    /// (an id cancelled again after the window must not look as old as the
    /// first cancel, nor show its reason).
    public mutating func add(_ command: SenderCommand, at now: Date, window: Int? = nil) {
        var e = entries[command.id] ?? Entry()
        switch command {
        case .cancel(_, let reason):
            if let first = e.cancel, window.map({ Self.within(first.at, now: now, window: $0) }) ?? true {
                e.cancel = (first.reason, max(now, first.at))
            } else {
                e.cancel = (reason, now)
            }
        case .reroute(_, let route): e.reroute = (route, now)
        }
        entries[command.id] = e
    }

    /// The reason of a cancel kept for `id` that came no more than `window` seconds before `now`.
    public func cancelReason(_ id: String, now: Date, window: Int) -> String? {
        guard let cancel = entries[id]?.cancel, Self.within(cancel.at, now: now, window: window) else { return nil }
        return cancel.reason
    }

    /// The reroute kept for `id`, which is then used up; nil if it came more than `window` seconds before `now`.
    public mutating func takeReroute(_ id: String, now: Date, window: Int) -> RoutingTable.Route? {
        guard let reroute = entries[id]?.reroute else { return nil }
        entries[id]?.reroute = nil
        if entries[id]?.cancel == nil { entries[id] = nil }
        return Self.within(reroute.at, now: now, window: window) ? reroute.route : nil
    }

    /// Forgets commands kept longer than `seconds`. A command counts for the
    /// window before its request came, and that request may wait up to its
    /// own lifetime before it is handled: a takeover's replay keeps two
    /// windows; at the cap, one (a flood must not hold it longer).
    public mutating func prune(olderThan seconds: Int, now: Date) {
        entries = entries.filter { Self.within($0.value.newest(), now: now, window: seconds) }
    }

    /// `at` is no more than `window` seconds before `now` (one from the future counts as now).
    private static func within(_ at: Date, now: Date, window: Int) -> Bool {
        now.timeIntervalSince(at) <= TimeInterval(max(0, window))
    }
}
