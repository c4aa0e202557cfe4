/// When a consumer that takes work in batches should wait a little for more
/// before it starts on a small batch: each batch costs the broker and the
/// service about the same wake-ups (a publish window, its confirms, an ack)
/// whatever its size, so at moderate rates two or three items a batch cost
/// much less than one each, for a few milliseconds of latency.
///
/// It waits only while items come often enough that at least one and a
/// half more are expected within `linger` (`expectedMore`, from the
/// smoothed time between items of the batches taken so far), and while its
/// waits gain something: items that come in clumps (ten at once every 30
/// ms) have a short average gap, but a wait after a clump gains nothing,
/// and after a few such waits it stops, trying again now and then. At a
/// low rate a lone item goes at once, and so does a batch half the limit
/// or larger. Time between items, not items a second, is what is smoothed:
/// two items that happen to come a millisecond apart at 166/s move it by a
/// quarter of 5 ms, not the rate to 1,000/s. A pure value: the caller
/// passes the clock's readings.
public struct BatchLinger: Sendable, Equatable {
    /// The longest wait for more; zero never waits.
    public let linger: Duration
    /// The consumer's batch limit: a batch half as large never waits.
    public let limit: Int
    /// Seconds between items (nil: no estimate yet): the smoothed time
    /// between takes over the smoothed items a take. A ratio of averages,
    /// not an average of ratios, which runs high while it waits (a wait
    /// that brings three items in 7.5 ms is 2.5 ms an item, not more).
    public var gap: Double? {
        guard let elapsed = meanElapsed, let count = meanCount, count > 0 else { return nil }
        return elapsed / count
    }
    private var meanElapsed: Double?
    private var meanCount: Double?
    /// How often a wait brought at least one item, smoothed over the waits;
    /// drifts back up (`retry`) while it keeps the consumer from waiting.
    public private(set) var gain: Double = 1
    private var lastTaken: ContinuousClock.Instant?

    /// The weight of the newest batch in `gap` and the newest wait in `gain`.
    static let smoothing = 0.25
    /// Waits only while at least this many items are expected within `linger`.
    static let expectedMore = 1.5
    /// Waits only while at least this share of waits bring something.
    static let worthwhileGain = 0.5
    /// How fast a `gain` below `worthwhileGain` drifts back to 1 with each batch that did not wait.
    static let retry = 1.0 / 64

    public init(linger: Duration, limit: Int) {
        self.linger = max(.zero, linger)
        self.limit = max(1, limit)
    }

    /// How long a batch of `count` items should wait for more: nil to take it as it is.
    public func wait(for count: Int) -> Duration? {
        guard linger > .zero, count < limit - limit / 2, let gap, gain >= Self.worthwhileGain else { return nil }
        return linger.inSeconds >= Self.expectedMore * gap ? linger : nil
    }

    /// Notes a batch taken at `now`: `count` items in all, `gained` of them
    /// during a wait (nil: it did not wait).
    public mutating func took(_ count: Int, gained: Int? = nil, at now: ContinuousClock.Instant) {
        defer { lastTaken = now }
        if let gained {
            gain += Self.smoothing * ((gained > 0 ? 1 : 0) - gain)
        } else if gain < Self.worthwhileGain {
            gain += Self.retry * (1 - gain)
        }
        guard let last = lastTaken, count > 0 else { return }
        let elapsed = max(0, (now - last).inSeconds), items = Double(count)
        meanElapsed = meanElapsed.map { $0 + Self.smoothing * (elapsed - $0) } ?? elapsed
        meanCount = meanCount.map { $0 + Self.smoothing * (items - $0) } ?? items
    }
}
