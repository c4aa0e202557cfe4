import Foundation

/// Cancels and reroutes that came before their dispatch, kept for the
/// lifetime window and applied when it shows up. A value: the sender term
/// holds one; the tests drive it with any clock.
public struct PendingCommands: Sendable {
    private struct Entry: Sendable {
        var cancelReason: String?
        var reroute: RoutingTable.Route?
        var at: Date
    }

    private var entries: [String: Entry] = [:]

    public init() {}

    public var count: Int { entries.count }

    /// Keeps `command`; a cancel wins over any reroute, and a later reroute replaces an earlier one.
    public mutating func add(_ command: SenderCommand, at now: Date) {
        var e = entries[command.id] ?? Entry(at: now)
        e.at = now
        switch command {
        case .cancel(_, let reason): if e.cancelReason == nil { e.cancelReason = reason }
        case .reroute(_, let route): e.reroute = route
        }
        entries[command.id] = e
    }

    /// The reason of a cancel kept for `id`.
    public func cancelReason(_ id: String) -> String? { entries[id]?.cancelReason }

    /// The reroute kept for `id`, which is then used up.
    public mutating func takeReroute(_ id: String) -> RoutingTable.Route? {
        guard let route = entries[id]?.reroute else { return nil }
        entries[id]?.reroute = nil
        if entries[id]?.cancelReason == nil { entries[id] = nil }
        return route
    }

    /// Forgets commands kept longer than `seconds` (their dispatch can no longer come).
    public mutating func prune(olderThan seconds: Int, now: Date) {
        let horizon = now.addingTimeInterval(-TimeInterval(seconds))
        entries = entries.filter { $0.value.at > horizon }
    }
}
