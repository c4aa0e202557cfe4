import FrontDeskModel
import Testing

/// `RecentParks`: what a sender term parked and has not seen surface, which
/// the presence poll may not count, so that a newer dispatch does not
/// overtake it.
@Suite("Parks whose copies have not surfaced")
struct RecentParksTests {
    let t0 = ContinuousClock.now

    @Test func aParkCountsUntilItsCopySurfaces() {
        var parks = RecentParks<String>()
        parks.parked("d1/parked/2", at: "a", now: t0)
        parks.parked("d2/parked/2", at: "a", now: t0)
        parks.parked("d3/parked/2", at: "b", now: t0)
        #expect(parks.count("a") == 2)
        #expect(parks.count("b") == 1)
        #expect(parks.count("c") == 0)
        parks.surfaced("d1/parked/2")
        #expect(parks.count("a") == 1)
        parks.surfaced("d1/parked/2")  // a second copy of it: nothing more
        parks.surfaced("someone-else/parked/1")  // parked by an earlier term
        #expect(parks.count("a") == 1)
        parks.surfaced("d2/parked/2")
        parks.surfaced("d3/parked/2")
        #expect(parks.count("a") == 0)
        #expect(parks.count("b") == 0)
        #expect(parks.isEmpty)
    }

    /// The same copy parked again (its id and seq) counts once, at its latest route.
    @Test func aCopyParkedAgainCountsOnce() {
        var parks = RecentParks<String>()
        parks.parked("d1/parked/2", at: "a", now: t0)
        parks.parked("d1/parked/2", at: "b", now: t0)
        #expect(parks.count("a") == 0)
        #expect(parks.count("b") == 1)
    }

    /// A copy that never surfaces (its queue was deleted, its target left)
    /// stops counting after `hold`, so the target's new dispatches go straight again.
    @Test func aParkNotSeenToSurfaceStopsCountingAfterTheHold() {
        var parks = RecentParks<String>(hold: .seconds(5))
        parks.parked("d1/parked/2", at: "a", now: t0)
        parks.parked("d2/parked/2", at: "a", now: t0 + .seconds(3))
        parks.forgetOld(now: t0 + .milliseconds(4999))
        #expect(parks.count("a") == 2)
        parks.forgetOld(now: t0 + .seconds(5))
        #expect(parks.count("a") == 1)
        parks.forgetOld(now: t0 + .seconds(8))
        #expect(parks.count("a") == 0)
        #expect(parks.isEmpty)
    }
}
