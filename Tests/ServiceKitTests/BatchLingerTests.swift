import ServiceKit
import Testing

@Suite("BatchLinger")
struct BatchLingerTests {
    let t0 = ContinuousClock.now

    /// Takes `count` batches of `size` items every `every`, starting at `t0`; returns the linger and the time after.
    func taking(_ linger: BatchLinger, batches count: Int, of size: Int, every: Duration, from start: ContinuousClock.Instant)
        -> (BatchLinger, ContinuousClock.Instant)
    {
        var l = linger
        var now = start
        for _ in 0..<count {
            l.took(size, at: now)
            now += every
        }
        return (l, now)
    }

    @Test func theFirstBatchGoesAtOnce() {
        let l = BatchLinger(linger: .milliseconds(5), limit: 256)
        #expect(l.wait(for: 1) == nil)
    }

    @Test func itemsComingOftenMakeASmallBatchWaitButNotAFullOne() {
        // 400 a second: 2.5 ms apart, two expected within 5 ms.
        let (l, _) = taking(BatchLinger(linger: .milliseconds(5), limit: 4), batches: 20, of: 1, every: .microseconds(2500), from: t0)
        #expect(l.wait(for: 1) == .milliseconds(5))
        #expect(l.wait(for: 3) == .milliseconds(5))
        #expect(l.wait(for: 4) == nil)
    }

    @Test func itemsComingSeldomGoAtOnce() {
        // 166 a second: 6 ms apart, less than one more expected within 5 ms.
        let (l, _) = taking(BatchLinger(linger: .milliseconds(5), limit: 256), batches: 50, of: 1, every: .milliseconds(6), from: t0)
        #expect(l.wait(for: 1) == nil)
        // 250 a second: 0.8 more expected, still not worth a wait.
        let (m, _) = taking(l, batches: 50, of: 1, every: .milliseconds(4), from: t0 + .seconds(1))
        #expect(m.wait(for: 1) == nil)
    }

    @Test func twoItemsThatHappenToComeCloseAtALowRateDoNotStartTheWaits() {
        var (l, now) = taking(BatchLinger(linger: .milliseconds(5), limit: 256), batches: 50, of: 1, every: .milliseconds(6), from: t0)
        l.took(1, at: now + .milliseconds(1))
        #expect(l.wait(for: 1) == nil)
        now += .milliseconds(7)
        l.took(1, at: now)
        #expect(l.wait(for: 1) == nil)
    }

    @Test func largerBatchesCountAsMoreItems() {
        // A batch of 5 every 10 ms is 500 a second.
        let (l, _) = taking(BatchLinger(linger: .milliseconds(5), limit: 256), batches: 20, of: 5, every: .milliseconds(10), from: t0)
        #expect(l.wait(for: 5) == .milliseconds(5))
    }

    @Test func afterAQuietSpellTheWaitsStop() {
        var (l, now) = taking(BatchLinger(linger: .milliseconds(5), limit: 256), batches: 20, of: 1, every: .milliseconds(1), from: t0)
        #expect(l.wait(for: 1) != nil)
        now += .seconds(1)
        l.took(1, at: now)
        #expect(l.wait(for: 1) == nil)
    }

    @Test func noLingerNeverWaitsAndOddInputDoesNotTrap() {
        let (l, _) = taking(BatchLinger(linger: .zero, limit: 256), batches: 20, of: 1, every: .microseconds(10), from: t0)
        #expect(l.wait(for: 1) == nil)
        // Negative settings are read as none; two takes at one instant, or time going back, do not trap.
        var m = BatchLinger(linger: .milliseconds(-5), limit: -3)
        #expect(m.limit == 1 && m.linger == .zero)
        var n = BatchLinger(linger: .milliseconds(5), limit: 256)
        for _ in 0..<3 { n.took(1, at: t0) }
        n.took(1, at: t0 - .seconds(1))
        n.took(0, at: t0)
        n.took(Int.max, at: t0 + .seconds(1))
        #expect(n.wait(for: 1) == .milliseconds(5))
        m.took(1, at: t0)
        #expect(m.wait(for: 0) == nil)
    }
}
