import ServiceKit
import Testing

@Suite("ConfirmWait")
struct ConfirmWaitTests {
    let t0 = ContinuousClock.now

    @Test func theOldestWindowIsReportedOnceWhenOverdue() {
        var w = ConfirmWait()
        w.published(at: t0)
        w.published(at: t0 + .seconds(3))
        #expect(w.overdue(after: .seconds(5), now: t0 + .seconds(4)) == nil)
        #expect(w.overdue(after: .seconds(5), now: t0 + .seconds(6)) == .seconds(6))
        #expect(w.overdue(after: .seconds(5), now: t0 + .seconds(7)) == nil)  // reported already
        w.settledOldest()
        // The next window counts from its own publish.
        #expect(w.overdue(after: .seconds(5), now: t0 + .seconds(7)) == nil)
        #expect(w.overdue(after: .seconds(5), now: t0 + .seconds(9)) == .seconds(6))
        w.settledOldest()
        #expect(w.count == 0)
        #expect(w.overdue(after: .seconds(5), now: t0 + .seconds(100)) == nil)
        w.settledOldest()  // more settles than windows: no trap
        #expect(w.count == 0)
    }

    @Test func manyWindowsSettledKeepTheCountAndCompact() {
        var w = ConfirmWait()
        for i in 0..<1000 { w.published(at: t0 + .milliseconds(i)) }
        for _ in 0..<990 { w.settledOldest() }
        #expect(w.count == 10)
        #expect(w.overdue(after: .seconds(1), now: t0 + .milliseconds(1990)) == .seconds(1))
        w.published(at: t0 + .seconds(5))
        for _ in 0..<10 { w.settledOldest() }
        #expect(w.count == 1)
        #expect(w.overdue(after: .seconds(1), now: t0 + .seconds(6)) == .seconds(1))
    }
}
