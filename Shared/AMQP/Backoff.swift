/// Capped exponential backoff with "full jitter downwards": attempt n waits
/// a random time in [d/2, d] where d = min(max, base × 2^(n−1)).
public struct Backoff: Sendable, Equatable {
    public var baseMs: Int
    public var maxMs: Int

    /// Between attempts to connect to a broker (`AMQPClient`, the sender's
    /// own connections): at most 2 s, so a service is back within about 2 s
    /// of its broker (with 10 s it could be 10 s after a restart, while
    /// cancels and events waited); a refused connection costs the broker
    /// next to nothing.
    public static let reconnect = Backoff(baseMs: 200, maxMs: 2000)

    public init(baseMs: Int, maxMs: Int) {
        self.baseMs = max(0, baseMs)
        self.maxMs = max(0, maxMs)
    }

    /// The delay before attempt `n + 1`, without jitter (n ≥ 1).
    public func ceilingMs(afterAttempt n: Int) -> Int {
        let exponent = min(max(n - 1, 0), 40)
        let (product, overflow) = baseMs.multipliedReportingOverflow(by: 1 << exponent)
        return overflow ? maxMs : min(maxMs, product)
    }

    /// The delay with jitter: `unit` in [0, 1) picks a point in [ceiling/2, ceiling].
    public func delayMs(afterAttempt n: Int, unit: Double) -> Int {
        let ceiling = ceilingMs(afterAttempt: n)
        let floor = (ceiling + 1) / 2
        let span = ceiling - floor
        return floor + Int((Double(span) * min(max(unit, 0), 1)).rounded(.down))
    }

    public func delayMs(afterAttempt n: Int) -> Int {
        delayMs(afterAttempt: n, unit: Double.random(in: 0..<1))
    }
}
