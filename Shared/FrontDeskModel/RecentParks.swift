/// The dispatches a sender term parked that its presence poll may not count
/// yet. A new dispatch goes straight to an online target only while none
/// waits in its park queue (`TargetView.takesNew`), but that queue's count
/// comes from a poll every 300 ms: a dispatch parked since the last poll
/// began would otherwise be overtaken by a newer one as soon as a slot frees.
///
/// A park counts here from when it is issued; once confirmed (stored in the
/// queue), until a poll that began after the confirm has reported, as that
/// poll's count includes it. Pure: the caller passes the times.
public struct RecentParks<Route: Hashable & Sendable>: Sendable {
    /// Issued, not yet confirmed.
    private var issued: [Route: Int] = [:]
    /// Confirmed at these instants, not yet covered by a poll.
    private var confirmed: [Route: [ContinuousClock.Instant]] = [:]

    public init() {}

    /// A park to `route` is in a window about to be published.
    public mutating func issue(_ route: Route) { issued[route, default: 0] += 1 }

    /// The window holding parks to `routes` (one entry a park) was confirmed at `at`.
    public mutating func confirm(_ routes: [Route], at: ContinuousClock.Instant) {
        for route in routes {
            if let n = issued[route] { issued[route] = n > 1 ? n - 1 : nil }
            confirmed[route, default: []].append(at)
        }
    }

    /// A poll that began at `startedAt` reported: it counts every park confirmed before then.
    public mutating func polled(startedAt: ContinuousClock.Instant) {
        for (route, times) in confirmed {
            let left = times.filter { $0 >= startedAt }
            confirmed[route] = left.isEmpty ? nil : left
        }
    }

    /// Parks to `route` the last poll may not have counted.
    public func uncounted(_ route: Route) -> Int {
        (issued[route] ?? 0) + (confirmed[route]?.count ?? 0)
    }
}
