import Foundation
@testable import FrontDeskModel
import Testing

@Suite("Live Activity view model")
struct LiveActivityTests {
    let input = "Reply to Lisa about the AGM agenda — short, confirm 14:00"

    func event(_ state: DispatchState, seq: Int, step: Int, activity: String, at seconds: Double = 4) -> StatusEvent {
        var e = StatusEvent(
            dispatchId: "d-1", seq: seq, state: state, step: step, activity: activity, input: input,
            startedAt: RFC3339.format(Date(timeIntervalSince1970: 1_778_665_260)),
            at: RFC3339.format(Date(timeIntervalSince1970: 1_778_665_260 + seconds)), elapsedMs: Int(seconds * 1000),
            expiresAt: RFC3339.format(Date(timeIntervalSince1970: 1_778_665_260 + 14_400)))
        if state != .drafted {
            e.project = .init(id: "yemaya", name: "Yemaya", glyph: "YE", accent: "#6E56CF")
            e.target = .init(id: "board-prep", name: "Board Prep")
        }
        return e
    }

    let now = Date(timeIntervalSince1970: 1_778_665_264)

    @Test func sendingLooksLikeTheSeed() throws {
        var state = LiveActivityState()
        var e = event(.sending, seq: 5, step: 2, activity: "Drafting reply")
        e.preview = ["Hi Lisa, confirmed for 14:00 on Thursday.", "The agenda"]
        e.etaMs = 2000
        state.apply(e)
        let v = try #require(state.view(now: now))
        #expect(v.title == "Front Desk · live")
        #expect(v.routeLine == "Yemaya · Board Prep")
        #expect(v.glyph == "YE" && v.accent == "#6E56CF")
        #expect(v.input == input)
        #expect(v.statusLine == "Drafting reply · step 2 / 3")
        #expect(v.bars == [.done, .done, .current])
        #expect(v.elapsed == "0:04 elapsed" && v.eta == "~2s")
        #expect(v.preview == ["Hi Lisa, confirmed for 14:00 on Thursday.", "The agenda"])
        #expect(v.canCancel && !v.isQueued && v.bestGuess == nil)
    }

    @Test func offlineQueuedShowsTheBestGuessAndNoProgress() throws {
        var state = LiveActivityState()
        var e = event(.queued, seq: 3, step: 1, activity: "Queued — will dispatch on reconnect")
        e.queue = .init(reason: "agent_offline")
        e.etaMs = 5000  // never shown while queued
        state.apply(e)
        let v = try #require(state.view(now: now))
        #expect(v.title == "Front Desk · queued")
        #expect(v.bestGuess == "Best guess: Yemaya / Board Prep")
        #expect(v.footer == "will dispatch on reconnect")
        #expect(v.bars == [.done, .pending, .pending])
        #expect(v.eta == nil && v.isQueued && v.canCancel)
    }

    @Test(arguments: [
        (DispatchState.drafted, 0, [LiveActivity.Bar.current, .pending, .pending]),
        (.routing, 1, [.done, .current, .pending]),
        (.replied, 3, [.done, .done, .done]),
        (.failed, 2, [.done, .done, .pending]),
        (.cancelled, 1, [.done, .pending, .pending]),
    ])
    func barsForEachState(_ state: DispatchState, _ step: Int, _ bars: [LiveActivity.Bar]) throws {
        var s = LiveActivityState()
        s.apply(event(state, seq: 9, step: step, activity: "x"))
        #expect(try #require(s.view(now: now)).bars == bars)
    }

    @Test func endsStopTheClockAndHideCancel() throws {
        var s = LiveActivityState()
        var failed = event(.failed, seq: 7, step: 2, activity: "Failed", at: 75)
        failed.error = .init(code: "agent_error", message: "the agent failed")
        s.apply(failed)
        let v = try #require(s.view(now: now.addingTimeInterval(3600)))
        #expect(v.statusLine == "Failed — the agent failed")
        #expect(v.elapsed == "1:15 elapsed")
        #expect(!v.canCancel && v.isFinished)
    }

    @Test func olderOrRepeatedEventsAreDropped() {
        var s = LiveActivityState()
        let first = s.apply(event(.sending, seq: 5, step: 2, activity: "a"))
        let late = s.apply(event(.routing, seq: 2, step: 1, activity: "late"))
        let repeated = s.apply(event(.sending, seq: 5, step: 2, activity: "again"))
        #expect(first && !late && !repeated)
        #expect(s.latest?.activity == "a")
        let newer = s.apply(event(.replied, seq: 6, step: 3, activity: "Agent replied"))
        #expect(newer)
    }

    @Test(arguments: [(4.0, "0:04"), (75, "1:15"), (3723, "1:02:03"), (-3, "0:00")])
    func clock(_ seconds: Double, _ text: String) {
        #expect(LiveActivityState.clock(seconds) == text)
    }
}

@Suite("Topic patterns and explanations")
struct TopicPatternTests {
    @Test(arguments: [
        ("status.#", "status._._.drafted", true),
        ("status.yemaya.#", "status.yemaya.board-prep.sending", true),
        ("status.yemaya.#", "status.yemayab.x.sending", false),
        ("status.*.*.replied", "status.acme.legal.replied", true),
        ("status.*.*.replied", "status.acme.legal.failed", false),
        ("#", "anything.at.all", true),
        ("status.#.replied", "status.replied", true),
        ("a.*", "a", false),
    ])
    func matches(_ pattern: String, _ key: String, _ expected: Bool) {
        #expect(TopicPattern(pattern).matches(key) == expected)
    }

    @Test func explainListsEveryScoringTargetWithItsWords() throws {
        let resolver = RouteResolver(table: try RoutingTable.example())
        let scores = resolver.explain("Reply to Lisa about the AGM agenda and the donor gala")
        #expect(scores.map(\.route.description) == ["yemaya/board-prep", "yemaya/fundraising"])
        #expect(scores[0].score == 3 && scores[0].matched == ["agm", "agenda", "Lisa"])
        #expect(scores[1].matched == ["donor", "gala"])
    }
}

@Suite("ActivityKit push payloads")
struct ActivityPushTests {
    func push(_ e: StatusEvent) throws -> [String: Any] {
        var s = LiveActivityState()
        s.apply(e)
        let data = ActivityPush.payload(for: e, view: try #require(s.view(now: Date(timeIntervalSince1970: 1_778_665_264))))
        #expect(data.count <= ActivityPush.maxBytes)
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])["aps"] as! [String: Any]
    }

    func sending(preview: [String], input: String = "Reply to Lisa about the AGM agenda — short, confirm 14:00") -> StatusEvent {
        var e = StatusEvent(
            dispatchId: "d-1", seq: 5, state: .sending, step: 2, activity: "Drafting reply", input: input,
            startedAt: "2026-05-13T09:41:00.000Z", at: "2026-05-13T09:41:04.000Z", elapsedMs: 4000, expiresAt: "2026-05-13T13:41:00.000Z")
        e.project = .init(id: "yemaya", name: "Yemaya", glyph: "YE", accent: "#6E56CF")
        e.target = .init(id: "board-prep", name: "Board Prep")
        e.preview = preview
        e.etaMs = 2000
        return e
    }

    @Test func updateCarriesTheContentState() throws {
        let aps = try push(sending(preview: ["Hi Lisa,", "The agenda"]))
        #expect(aps["event"] as? String == "update")
        #expect(aps["timestamp"] as? Int == 1_778_665_264)
        // Stale once the agent's 2 s ETA (and a grace) has run out: a frozen "~2s left" must not look live.
        #expect(aps["stale-date"] as? Int == 1_778_665_264 + 2 + ActivityPush.etaGraceSeconds)
        #expect(aps["dismissal-date"] == nil)
        let c = try #require(aps["content-state"] as? [String: Any])
        #expect(c["routeLine"] as? String == "Yemaya · Board Prep")
        #expect(c["statusLine"] as? String == "Drafting reply · step 2 / 3")
        #expect(c["etaMs"] as? Int == 2000 && c["glyph"] as? String == "YE")
        #expect(c["preview"] as? [String] == ["Hi Lisa,", "The agenda"])
        #expect((aps["relevance-score"] as? Double ?? 0) > 0)
    }

    @Test func terminalStatesEndTheActivity() throws {
        var e = sending(preview: ["done"])
        e.state = .replied
        e.step = 3
        e.etaMs = nil
        let aps = try push(e)
        #expect(aps["event"] as? String == "end")
        #expect(aps["dismissal-date"] as? Int == 1_778_665_264 + 900)
    }

    @Test func oversizedPayloadsTrimThePreviewFirstAndStayUnder4KB() throws {
        let huge = String(repeating: "é", count: 3000)
        let aps = try push(sending(preview: [huge, huge, huge]))
        let c = try #require(aps["content-state"] as? [String: Any])
        #expect((c["input"] as? String) == "Reply to Lisa about the AGM agenda — short, confirm 14:00")
        let longInput = try push(sending(preview: [huge], input: String(repeating: "x", count: 4000)))
        #expect(((longInput["content-state"] as? [String: Any])?["input"] as? String)?.hasSuffix("…") == true)
    }
}

@Suite("Terminal rendering, one snapshot a state")
struct ActivityRendererTests {
    let base = LiveActivity(
        title: "Front Desk · live", routeLine: "Yemaya · Board Prep", glyph: "YE", accent: "#6E56CF",
        input: "Reply to Lisa about the AGM agenda — short, confirm 14:00", statusLine: "Drafting reply · step 2 / 3",
        bars: [.done, .done, .current], preview: ["Hi Lisa, confirmed for 14:00 on Thursday.", "The agenda"],
        elapsed: "0:04 elapsed", eta: "~2s", isQueued: false, bestGuess: nil, footer: nil, canCancel: true, isFinished: false)

    @Test func compact() {
        #expect(ActivityRenderer.render(base, .compact) == "[YE] ■■▣")
        #expect(ActivityRenderer.render(base, .compact, colour: true) == "\u{1B}[1;38;2;110;86;207m[YE]\u{1B}[0m ■■▣")
    }

    @Test func expanded() {
        #expect(ActivityRenderer.render(base, .expanded) == """
            [YE] ■■▣  Front Desk · live
                Yemaya · Board Prep
                Drafting reply · step 2 / 3
                0:04 elapsed ~2s
            """)
    }

    @Test func lockScreen() {
        #expect(ActivityRenderer.render(base, .lockScreen) == """
            [YE] ■■▣  Front Desk · live
                Yemaya · Board Prep
                ┃ Reply to Lisa about the AGM agenda — short, confirm 14:00
                Drafting reply · step 2 / 3
                │ Hi Lisa, confirmed for 14:00 on Thursday.
                │ The agenda
                0:04 elapsed ~2s left   [Cancel]  Open ›
            """)
    }

    @Test func offlineQueuedIsMutedWithNoProgress() {
        var v = base
        v.title = "Front Desk · queued"
        v.statusLine = "Queued — will dispatch on reconnect"
        v.bars = [.done, .pending, .pending]
        v.preview = []
        v.eta = nil
        v.isQueued = true
        v.bestGuess = "Best guess: Yemaya / Board Prep"
        v.footer = "will dispatch on reconnect"
        #expect(ActivityRenderer.render(v, .lockScreen, colour: true) == """
            [YE] ■□□  Front Desk · queued
                Yemaya · Board Prep
                ┃ Reply to Lisa about the AGM agenda — short, confirm 14:00
                Queued — will dispatch on reconnect
                Best guess: Yemaya / Board Prep   Edit ›
                0:04 elapsed · will dispatch on reconnect   [Cancel]  Open ›
            """)
    }

    @Test(arguments: [("Agent replied", [LiveActivity.Bar.done, .done, .done]), ("Failed — the agent failed", [.done, .done, .pending]), ("Cancelled", [.done, .pending, .pending])])
    func ends(_ status: String, _ bars: [LiveActivity.Bar]) {
        var v = base
        v.statusLine = status
        v.bars = bars
        v.eta = nil
        v.canCancel = false
        v.isFinished = true
        let text = ActivityRenderer.render(v, .lockScreen)
        #expect(text.contains(status))
        #expect(text.hasSuffix("0:04 elapsed   Open ›"))
        #expect(!text.contains("Cancel]"))
    }
}
