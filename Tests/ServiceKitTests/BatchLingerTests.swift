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

    @Test func itemsComingOftenMakeASmallBatchWaitButNotAHalfFullOne() {
        // 400 a second: 2.5 ms apart, two expected within 5 ms.
        let (l, _) = taking(BatchLinger(linger: .milliseconds(5), limit: 8), batches: 20, of: 1, every: .microseconds(2500), from: t0)
        #expect(l.wait(for: 1) == .milliseconds(5))
        #expect(l.wait(for: 3) == .milliseconds(5))
        #expect(l.wait(for: 4) == nil)
        #expect(l.wait(for: 8) == nil)
        // Half the limit, rounded up, never waits; nor does any batch with a limit of 1 or 2.
        for (limit, largestWaiting) in [(1, 0), (2, 0), (3, 1), (256, 127), (Int.max, Int.max / 2)] {
            let (m, _) = taking(BatchLinger(linger: .milliseconds(5), limit: limit), batches: 20, of: 1, every: .microseconds(2500), from: t0)
            if largestWaiting > 0 {
                #expect(m.wait(for: largestWaiting) != nil, "limit \(limit)")
            }
            #expect(m.wait(for: largestWaiting + 1) == nil, "limit \(limit)")
        }
    }

    @Test func itemsComingSeldomGoAtOnce() {
        // 166 a second: 6 ms apart, 0.83 more expected within 5 ms.
        let (l, _) = taking(BatchLinger(linger: .milliseconds(5), limit: 256), batches: 50, of: 1, every: .milliseconds(6), from: t0)
        #expect(l.wait(for: 1) == nil)
        // 250 a second: 1.25 more expected, still fewer than one and a half.
        let (m, _) = taking(l, batches: 50, of: 1, every: .milliseconds(4), from: t0 + .seconds(1))
        #expect(m.wait(for: 1) == nil)
    }

    @Test func oneAndAHalfExpectedIsJustEnough() {
        // 4 ms apart with a 6 ms linger: exactly 1.5 expected (exact in binary: 0.004 × 1.5 ≤ 0.006).
        let (l, _) = taking(BatchLinger(linger: .milliseconds(6), limit: 256), batches: 40, of: 1, every: .milliseconds(4), from: t0)
        #expect(l.wait(for: 1) == .milliseconds(6))
        let (m, _) = taking(BatchLinger(linger: .microseconds(5990), limit: 256), batches: 40, of: 1, every: .milliseconds(4), from: t0)
        #expect(m.wait(for: 1) == nil)
    }

    @Test func twoItemsThatHappenToComeCloseAtALowRateDoNotStartTheWaits() {
        let (steady, next) = taking(BatchLinger(linger: .milliseconds(5), limit: 256), batches: 50, of: 1, every: .milliseconds(6), from: t0)
        var l = steady
        // The last take was at `next` - 6 ms: one more a millisecond after it.
        let close = next - .milliseconds(5)
        l.took(1, at: close)
        // The smoothed gap moves a quarter of the way from 6 ms to 1 ms: 4.75 ms.
        #expect(abs((l.gap ?? 0) - 0.00475) < 0.0001)
        #expect(l.wait(for: 1) == nil)
        l.took(1, at: close + .milliseconds(6))
        #expect(l.wait(for: 1) == nil)
    }

    @Test func clumpsThatWaitingCannotGrowStopTheWaitsAndAreTriedAgainNowAndThen() {
        // Ten at once every 30 ms: 3 ms apart on average, but a wait after a clump brings nothing.
        var l = BatchLinger(linger: .milliseconds(5), limit: 256)
        var now = t0
        var waits = 0, lastWait = -1
        for i in 0..<200 {
            if l.wait(for: 10) != nil {
                waits += 1
                lastWait = i
                l.took(10, gained: 0, at: now + .milliseconds(5))
            } else {
                l.took(10, at: now)
            }
            now += .milliseconds(30)
        }
        // A few waits to learn, then a try every ten to fifteen clumps: not every clump, and not never.
        #expect(waits >= 8 && waits <= 25, "waited after \(waits) of 200 clumps")
        #expect(lastWait >= 150, "no wait was tried again in the last 50 clumps")
        // Waits that bring something keep it waiting.
        var m = BatchLinger(linger: .milliseconds(5), limit: 256)
        var t = t0
        var kept = 0
        for _ in 0..<200 {
            if m.wait(for: 1) != nil {
                kept += 1
                m.took(3, gained: 2, at: t + .milliseconds(5))
                t += .milliseconds(5)
            } else {
                m.took(1, at: t)
                t += .milliseconds(2)
            }
        }
        #expect(kept >= 190)
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
