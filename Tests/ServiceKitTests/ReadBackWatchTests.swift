import ServiceKit
import Testing

@Suite("ReadBackWatch")
struct ReadBackWatchTests {
    let t0 = ContinuousClock.now

    func watch() -> ReadBackWatch { ReadBackWatch(limit: .seconds(10), gap: .seconds(60)) }

    /// `#expect` cannot call a mutating method itself.
    func verdict(_ w: inout ReadBackWatch, writtenAt: ContinuousClock.Instant, mark: UInt64, now: ContinuousClock.Instant) -> Bool {
        w.unread(writtenAt: writtenAt, mark: mark, now: now)
    }

    @Test func aWriteUnreadPastTheLimitWithNothingReadMeansTheReaderHangs() {
        var w = watch()
        w.read()
        let mark = w.mark
        #expect(!verdict(&w, writtenAt: t0, mark: mark, now: t0 + .seconds(9)))
        #expect(verdict(&w, writtenAt: t0, mark: mark, now: t0 + .seconds(10)))
    }

    @Test func aReaderThatLagsButStillReadsDoesNotHang() {
        var w = watch()
        let mark = w.mark
        w.read()  // a backlog still moving, this write not read back yet
        #expect(!verdict(&w, writtenAt: t0, mark: mark, now: t0 + .seconds(30)))
        #expect(!verdict(&w, writtenAt: t0, mark: mark, now: t0 + .seconds(300)))
    }

    @Test func aVerdictComesAtMostOnceAGap() {
        var w = watch()
        let mark = w.mark
        #expect(verdict(&w, writtenAt: t0, mark: mark, now: t0 + .seconds(10)))
        // The new connection has not read yet: no second verdict within the gap.
        #expect(!verdict(&w, writtenAt: t0 + .seconds(12), mark: mark, now: t0 + .seconds(25)))
        #expect(!verdict(&w, writtenAt: t0 + .seconds(12), mark: mark, now: t0 + .seconds(69)))
        #expect(verdict(&w, writtenAt: t0 + .seconds(12), mark: mark, now: t0 + .seconds(70)))
    }
}
