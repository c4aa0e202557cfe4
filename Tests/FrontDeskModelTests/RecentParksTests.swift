import FrontDeskModel
import Testing

/// `RecentParks`: what a sender term parked that its presence poll may not
/// have counted yet, so that a newer dispatch does not overtake it.
@Suite("Parks the presence poll has not counted yet")
struct RecentParksTests {
    let t0 = ContinuousClock.now

    @Test func aParkCountsFromIssueUntilAPollThatBeganAfterItsConfirm() {
        var parks = RecentParks<String>()
        parks.issue("a")
        #expect(parks.uncounted("a") == 1)
        #expect(parks.uncounted("b") == 0)
        // A poll that began before the window was confirmed may not have seen it.
        parks.polled(startedAt: t0)
        #expect(parks.uncounted("a") == 1)
        parks.confirm(["a"], at: t0 + .milliseconds(10))
        #expect(parks.uncounted("a") == 1)
        parks.polled(startedAt: t0 + .milliseconds(5))
        #expect(parks.uncounted("a") == 1)
        // (One that began at the same instant may not have either.)
        parks.polled(startedAt: t0 + .milliseconds(10))
        #expect(parks.uncounted("a") == 1)
        // One that began after it counts it in its own figure.
        parks.polled(startedAt: t0 + .milliseconds(11))
        #expect(parks.uncounted("a") == 0)
    }

    @Test func parksOfOneWindowAndOfSeveralRoutesAreCountedApart() {
        var parks = RecentParks<String>()
        for route in ["a", "a", "b"] { parks.issue(route) }
        #expect(parks.uncounted("a") == 2)
        parks.confirm(["a", "b"], at: t0)
        #expect(parks.uncounted("a") == 2)  // one confirmed, one still issued
        #expect(parks.uncounted("b") == 1)
        parks.confirm(["a"], at: t0 + .milliseconds(300))
        parks.polled(startedAt: t0 + .milliseconds(100))
        #expect(parks.uncounted("a") == 1)
        #expect(parks.uncounted("b") == 0)
        parks.polled(startedAt: t0 + .milliseconds(400))
        #expect(parks.uncounted("a") == 0)
    }

    /// A confirm never counts below zero issued, whatever the order.
    @Test func aConfirmWithoutAnIssueStillCountsUntilPolled() {
        var parks = RecentParks<String>()
        parks.confirm(["a"], at: t0)
        #expect(parks.uncounted("a") == 1)
        parks.issue("a")
        #expect(parks.uncounted("a") == 2)
        parks.polled(startedAt: t0 + .seconds(1))
        #expect(parks.uncounted("a") == 1)
    }
}
