/// When a consumer that takes work in batches should wait a little for more
/// before it starts on a small batch: each batch costs the broker and the
/// service about the same wake-ups (a publish window, its confirms, an ack)
/// whatever its size, so at moderate rates two or three items a batch cost
/// much less than one each, for a few milliseconds of latency.
///
/// It waits only while items come often enough that more than one more is
/// expected within `linger` (`expectedMore`, from the smoothed time between
/// items of the batches taken so far): at a low rate a lone item goes at
/// once, and so does a batch that is full. Time between items, not items a
/// second, is what is smoothed: two items that happen to come a millisecond
/// apart at 166/s move it by a quarter of 5 ms, not the rate to 1,000/s.
/// A pure value: the caller passes the clock's readings.
public struct BatchLinger: Sendable, Equatable {
    /// The longest wait for more; zero never waits.
    public let linger: Duration
    /// A batch this large (the consumer's limit) never waits.
    public let limit: Int
    /// Seconds between items, smoothed over the batches taken (nil: none yet).
    public private(set) var gap: Double?
    private var lastTaken: ContinuousClock.Instant?

    /// The weight of the newest batch in `gap`.
    static let smoothing = 0.25
    /// Waits only while more than this many items are expected within `linger`.
    static let expectedMore = 1.5

    public init(linger: Duration, limit: Int) {
        self.linger = max(.zero, linger)
        self.limit = max(1, limit)
    }

    /// How long a batch of `count` items should wait for more: nil to take it as it is.
    public func wait(for count: Int) -> Duration? {
        guard linger > .zero, count < limit, let gap else { return nil }
        return Self.seconds(linger) >= Self.expectedMore * gap ? linger : nil
    }

    /// Notes a batch of `count` items taken (after any wait) at `now`.
    public mutating func took(_ count: Int, at now: ContinuousClock.Instant) {
        defer { lastTaken = now }
        guard let last = lastTaken, count > 0 else { return }
        let current = max(0, Self.seconds(now - last)) / Double(count)
        gap = gap.map { $0 + Self.smoothing * (current - $0) } ?? current
    }

    static func seconds(_ d: Duration) -> Double {
        let (s, atto) = d.components
        return Double(s) + Double(atto) / 1e18
    }
}
