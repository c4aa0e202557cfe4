/// The dispatches a sender term parked whose copies it has not yet seen
/// surface. A new dispatch goes straight to an online target only while
/// none waits in its park queue (`TargetView.takesNew`), but that queue's
/// count comes from a poll every 300 ms, and counts only the messages ready
/// (not one its park consumer holds): a dispatch parked for want of room
/// would otherwise be overtaken by a newer one as soon as a slot freed.
///
/// A park counts from when it is issued until its copy surfaces (or
/// expires) in this term. Online, a copy surfaces within a poll or two; one
/// that has not after `hold` (its target went offline, or the copy was lost
/// with a queue) stops counting, so a lost copy cannot hold a target's new
/// dispatches on the park path. Pure: the caller passes the times.
public struct RecentParks<Route: Hashable & Sendable>: Sendable {
    public let hold: Duration
    /// By the copy's message id.
    private var parks: [String: (route: Route, at: ContinuousClock.Instant)] = [:]
    private var counts: [Route: Int] = [:]

    public init(hold: Duration = .seconds(5)) { self.hold = hold }

    /// A copy of a dispatch, `key` its message id, is parked at `route`.
    public mutating func parked(_ key: String, at route: Route, now: ContinuousClock.Instant) {
        remove(key)
        parks[key] = (route, now)
        counts[route, default: 0] += 1
    }

    /// The copy `key` came out of its queue (surfaced or expired).
    public mutating func surfaced(_ key: String) { remove(key) }

    /// Stops counting parks older than `hold`.
    public mutating func forgetOld(now: ContinuousClock.Instant) {
        guard !parks.isEmpty else { return }
        for (key, park) in parks where now - park.at >= hold { remove(key) }
    }

    /// Parks at `route` whose copies have not surfaced.
    public func count(_ route: Route) -> Int { counts[route] ?? 0 }

    public var isEmpty: Bool { parks.isEmpty }

    private mutating func remove(_ key: String) {
        guard let old = parks.removeValue(forKey: key) else { return }
        let n = (counts[old.route] ?? 1) - 1
        counts[old.route] = n > 0 ? n : nil
    }
}
