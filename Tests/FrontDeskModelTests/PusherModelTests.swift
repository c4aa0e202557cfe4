import FrontDeskActivity
import Foundation
import Testing

@testable import FrontDeskModel

struct PushSchedulerTests {
    let t0 = Date(timeIntervalSince1970: 1_000_000)

    func update(_ seq: Int, priority: Int = 10, end: Bool = false, tag: UInt64? = nil) -> PushUpdate {
        PushUpdate(dispatchId: "d", seq: seq, payload: Data("\(seq)".utf8), priority: priority, isEnd: end, tag: tag ?? UInt64(seq), eventAt: t0)
    }

    func sent(_ actions: [PushScheduler.Action]) -> [Int] {
        actions.compactMap { if case .send(let u) = $0 { return u.seq } else { return nil } }
    }

    func acked(_ actions: [PushScheduler.Action]) -> [UInt64] {
        actions.flatMap { if case .ack(let tags) = $0 { return tags } else { return [] } }
    }

    @Test func onlyTheNewestPendingUpdateGoesOutAndTheRestAreAcked() {
        var s = PushScheduler()
        #expect(sent(s.submit(update(1), state: .drafted, now: t0)) == [1])
        // While 1 is in flight, 2, 3, 4 come: 2 and 3 are superseded (acked), 4 waits.
        #expect(s.submit(update(2), state: .routing, now: t0).isEmpty)
        #expect(acked(s.submit(update(3), state: .sending, now: t0)) == [2])
        #expect(acked(s.submit(update(4), state: .sending, now: t0)) == [3])
        let done = s.completed("d", .delivered, now: t0, jitter: 0)
        #expect(acked(done) == [1])
        #expect(sent(done) == [4])
        #expect(acked(s.submit(update(4), state: .sending, now: t0)) == [4], "a repeat is acked, not sent")
    }

    @Test func aStateChangeKeepsItsPriorityWhenAPreviewUpdateReplacesIt() {
        var s = PushScheduler()
        _ = s.submit(update(1), state: .routing, now: t0)
        _ = s.submit(update(2, priority: 10), state: .sending, now: t0)
        _ = s.submit(update(3, priority: 5), state: .sending, now: t0)
        let next = s.completed("d", .delivered, now: t0, jitter: 0)
        guard case .send(let u)? = next.first(where: { if case .send = $0 { true } else { false } }) else {
            Issue.record("nothing sent")
            return
        }
        #expect(u.seq == 3 && u.priority == 10)
    }

    @Test func previewOnlyUpdatesGoAtMostOnceAnInterval() {
        var s = PushScheduler(lowPriorityInterval: 2)
        _ = s.submit(update(1, priority: 5), state: .sending, now: t0)
        _ = s.completed("d", .delivered, now: t0, jitter: 0)
        #expect(sent(s.submit(update(2, priority: 5), state: .sending, now: t0 + 1)).isEmpty)
        #expect(s.nextDue() == t0 + 2)
        #expect(sent(s.due(now: t0 + 1.5)).isEmpty)
        #expect(sent(s.due(now: t0 + 2)) == [2])
        // A change of state does not wait.
        _ = s.completed("d", .delivered, now: t0 + 2, jitter: 0)
        #expect(sent(s.submit(update(3, priority: 10), state: .replied, now: t0 + 2.1)) == [3])
    }

    @Test func retryBacksOffWithJitterThatOnlyShortensAndSendsTheNewest() {
        var s = PushScheduler()
        _ = s.submit(update(1), state: .sending, now: t0)
        let first = s.completed("d", .retry(after: nil), now: t0, jitter: 0.999)
        #expect(first.isEmpty)
        #expect(sent(s.due(now: t0 + 0.4)).isEmpty)
        #expect(sent(s.due(now: t0 + 0.5)) == [1], "the same update again, 0.5 s later")
        _ = s.completed("d", .retry(after: nil), now: t0 + 0.5, jitter: 0)
        // Second failure: 1 s, jitter 0 halves it; a newer update replaces the failed one (acked as superseded).
        #expect(acked(s.submit(update(2), state: .sending, now: t0 + 0.6)) == [1])
        #expect(sent(s.due(now: t0 + 0.99)).isEmpty)
        let retried = s.due(now: t0 + 1.0)
        #expect(sent(retried) == [2])
        // APNs' own Retry-After is honoured when longer.
        _ = s.completed("d", .retry(after: 30), now: t0 + 1, jitter: 0)
        #expect(s.nextDue() == t0 + 31)
        // One beyond the longest back-off waits that long, not a day.
        _ = s.due(now: t0 + 31)
        _ = s.completed("d", .retry(after: 86_400), now: t0 + 31, jitter: 0)
        #expect(s.nextDue() == t0 + 31 + s.maxBackoff)
        // Jitter spreads a Retry-After over a tenth more, never less.
        _ = s.due(now: t0 + 31 + s.maxBackoff)
        _ = s.completed("d", .retry(after: 20), now: t0 + 100, jitter: 0.5)
        #expect(s.nextDue() == t0 + 121)
    }

    /// Another dispatch's push, delivered at `now`: APNs is there.
    func deliverOther(_ s: inout PushScheduler, now: Date, id: String = "e", seq: Int = 1) {
        let other = PushUpdate(dispatchId: id, seq: seq, payload: Data(), priority: 10, isEnd: false, tag: 1000 + UInt64(seq), eventAt: t0)
        _ = s.submit(other, state: .sending, now: now)
        _ = s.completed(id, .delivered, now: now, jitter: 0)
    }

    /// Retries `id` whenever due, each failing, until it is given up or `until`: the actions of the last failure.
    func failWhenDue(_ s: inout PushScheduler, _ now: inout Date, until: Date) -> [PushScheduler.Action] {
        var last: [PushScheduler.Action] = []
        while !last.contains(.gaveUp("d")), let due = s.nextDue(), due < until {
            now = max(due, now)
            _ = s.due(now: now)
            last = s.completed("d", .retry(after: nil), now: now, jitter: 0.999)
        }
        return last
    }

    /// By default a failing token's events are let go (acked) before RabbitMQ's default
    /// `consumer_timeout` (30 minutes) would close the channel holding them, with its
    /// back-off's longest wait to spare.
    @Test func theDefaultGiveUpEndsInsideTheBrokersConsumerTimeout() {
        let s = PushScheduler()
        #expect(s.giveUpAfter + s.maxBackoff < 1800)
    }

    @Test func aDispatchWhosePushesFailForTheGiveUpTimeWhileOthersGoThroughIsLetGo() {
        var s = PushScheduler(maxBackoff: 60, giveUpAfter: 600)
        _ = s.submit(update(1), state: .sending, now: t0)
        var now = t0
        _ = s.completed("d", .retry(after: nil), now: now, jitter: 0.999)
        #expect(acked(s.submit(update(2), state: .sending, now: now + 0.1)) == [1], "1 waits out its back-off as the pending one: 2 replaces it")
        // An outage (nothing goes through for anyone): retried past the give-up time, never let go.
        #expect(!failWhenDue(&s, &now, until: t0 + 900).contains(.gaveUp("d")))
        #expect(s.heldTags() == [2])
        // Another dispatch's push goes through: APNs is back, and this token is the trouble. With 3
        // pending behind 2 in flight, the next failure lets both go.
        deliverOther(&s, now: now)
        now = s.nextDue()!
        #expect(sent(s.due(now: now)) == [2])
        #expect(s.submit(update(3), state: .sending, now: now).isEmpty)
        let last = s.completed("d", .retry(after: nil), now: now, jitter: 0.999)
        #expect(last.contains(.gaveUp("d")) && !last.contains(.finished("d")))
        #expect(acked(last).sorted() == [2, 3])
        #expect(s.nextDue() == nil && s.heldTags().isEmpty && s.inFlightCount == 0)
        #expect(acked(s.submit(update(3, tag: 30), state: .sending, now: now + 1)) == [30], "an older or repeated event is not pushed again")
        // The next event starts afresh: sent at once, its failure backs off from 0.5 s again.
        #expect(sent(s.submit(update(4), state: .replied, now: now + 2)) == [4])
        #expect(s.completed("d", .retry(after: nil), now: now + 2, jitter: 0.999).isEmpty)
        #expect(s.nextDue().map { $0 > now + 2 && $0 <= now + 2.5 } == true, "0.5 s at most, not the 60 s reached before")
    }

    @Test func aGivenUpEndFinishesTheActivity() {
        var s = PushScheduler(giveUpAfter: 10)
        _ = s.submit(update(1, end: true), state: .replied, now: t0)
        var now = t0
        _ = s.completed("d", .retry(after: nil), now: now, jitter: 0)
        deliverOther(&s, now: t0 + 5)
        let last = failWhenDue(&s, &now, until: t0 + 100)
        #expect(last.contains(.gaveUp("d")) && last.contains(.finished("d")) && acked(last) == [1])
        #expect(now >= t0 + 10 && s.heldTags().isEmpty)
    }

    @Test func anAnswerOrANewTokenEndsTheRunOfFailures() {
        var s = PushScheduler(giveUpAfter: 10)
        _ = s.submit(update(1), state: .sending, now: t0)
        _ = s.completed("d", .retry(after: nil), now: t0, jitter: 0)
        _ = s.due(now: t0 + 9)
        _ = s.completed("d", .delivered, now: t0 + 9, jitter: 0)
        _ = s.submit(update(2), state: .sending, now: t0 + 9.5)
        deliverOther(&s, now: t0 + 11)
        #expect(!s.completed("d", .retry(after: nil), now: t0 + 12, jitter: 0).contains(.gaveUp("d")), "a new run, 0 s long")
        _ = s.due(now: t0 + 13)
        #expect(acked(s.completed("d", .rejected, now: t0 + 13, jitter: 0)) == [2])
        _ = s.submit(update(3), state: .sending, now: t0 + 30)
        deliverOther(&s, now: t0 + 30, seq: 2)
        #expect(!s.completed("d", .retry(after: nil), now: t0 + 31, jitter: 0).contains(.gaveUp("d")), "a rejection ended the run")
        // 3 fails on for 10 s while others go through; a new token then sends it at once, on a new run.
        var now = t0 + 31
        deliverOther(&s, now: t0 + 35, seq: 3)
        _ = failWhenDue(&s, &now, until: t0 + 40.9)
        #expect(sent(s.tokenChanged("d", now: t0 + 41)) == [3])
        #expect(!s.completed("d", .retry(after: nil), now: t0 + 42, jitter: 0).contains(.gaveUp("d")))
        #expect(s.tokenChanged("unknown", now: t0 + 42).isEmpty)
    }

    @Test func aClockSetBackDoesNotStretchTheRun() {
        var s = PushScheduler(giveUpAfter: 10)
        _ = s.submit(update(1), state: .sending, now: t0)
        _ = s.completed("d", .retry(after: nil), now: t0, jitter: 0)
        #expect(sent(s.due(now: t0 + 1)) == [1])
        // The clock steps back an hour while 1 is in flight: the run counts from the earlier time.
        var now = t0 - 3600
        _ = s.completed("d", .retry(after: nil), now: now, jitter: 0)
        deliverOther(&s, now: now + 1)
        let last = failWhenDue(&s, &now, until: t0 - 3500)
        #expect(last.contains(.gaveUp("d")), "given up about 10 s after the failure at the earlier time")
        #expect(now >= t0 - 3590)
    }

    @Test func aResetKeepsTheSendCounterSoALateAnswerSettlesNothing() {
        var s = PushScheduler()
        guard case .send(let first)? = s.submit(update(1), state: .sending, now: t0).first else {
            Issue.record("nothing sent")
            return
        }
        s.reset()
        #expect(s.heldTags().isEmpty)
        guard case .send(let second)? = s.submit(update(1, tag: 11), state: .sending, now: t0 + 1).first else {
            Issue.record("nothing sent after the reset")
            return
        }
        #expect(first.sendID != second.sendID)
        #expect(s.completed("d", sendID: first.sendID, .retry(after: nil), now: t0 + 2, jitter: 0).isEmpty)
        #expect(s.inFlightCount == 1, "the answer to the send from before the reset settled nothing")
    }

    @Test func goneDropsTheTokenAndEndFinishes() {
        var s = PushScheduler()
        _ = s.submit(update(1), state: .sending, now: t0)
        _ = s.submit(update(2), state: .sending, now: t0)
        let gone = s.completed("d", .gone, now: t0, jitter: 0)
        #expect(acked(gone).sorted() == [1, 2])
        #expect(gone.contains(.dropToken("d")))
        var e = PushScheduler()
        _ = e.submit(update(5, end: true), state: .replied, now: t0)
        let finished = e.completed("d", .delivered, now: t0, jitter: 0)
        #expect(finished.contains(.finished("d")))
        #expect(e.heldTags().isEmpty)
    }

    @Test func theSameEventRedeliveredMovesTheHoldToItsNewDelivery() {
        var s = PushScheduler()
        _ = s.submit(update(1, tag: 11), state: .sending, now: t0)
        _ = s.submit(update(2, tag: 12), state: .sending, now: t0)
        // After a reconnect both come again under new tags: the old tags are settled, the new ones held.
        #expect(acked(s.submit(update(1, tag: 21), state: .sending, now: t0)) == [11])
        #expect(acked(s.submit(update(2, tag: 22), state: .sending, now: t0)) == [12])
        #expect(Set(s.heldTags()) == [21, 22])
        let next = s.completed("d", .delivered, now: t0, jitter: 0)
        #expect(acked(next) == [21] && sent(next) == [2])
    }

    @Test func aRetriedStateChangeKeepsItsPriorityWhenANewerPreviewReplacesIt() {
        var s = PushScheduler(lowPriorityInterval: 2)
        _ = s.submit(update(1, priority: 10), state: .sending, now: t0)
        _ = s.submit(update(2, priority: 5), state: .sending, now: t0)
        _ = s.completed("d", .retry(after: nil), now: t0, jitter: 0)
        let resent = s.due(now: t0 + 1)
        guard case .send(let u)? = resent.first else {
            Issue.record("nothing sent")
            return
        }
        #expect(u.seq == 2 && u.priority == 10)
    }

    @Test func aLateAnswerToAnEarlierSendSettlesNothingLater() {
        var s = PushScheduler()
        guard case .send(let first)? = s.submit(update(1), state: .sending, now: t0).first else {
            Issue.record("nothing sent")
            return
        }
        _ = s.forget(idleSince: .distantFuture)  // in flight: kept
        _ = s.completed("d", sendID: first.sendID, .retry(after: nil), now: t0, jitter: 0)
        guard case .send(let second)? = s.due(now: t0 + 1).first else {
            Issue.record("not resent")
            return
        }
        #expect(second.sendID != first.sendID)
        #expect(s.completed("d", sendID: first.sendID, .delivered, now: t0 + 1, jitter: 0).isEmpty)
        #expect(acked(s.completed("d", sendID: second.sendID, .delivered, now: t0 + 1, jitter: 0)) == [1])
    }

    @Test func idleActivitiesAreForgotten() {
        var s = PushScheduler()
        _ = s.submit(update(1), state: .sending, now: t0)
        _ = s.completed("d", .delivered, now: t0, jitter: 0)
        #expect(s.forget(idleSince: t0 + 600).isEmpty)
        #expect(s.lastState("d") == nil)
    }

    @Test func aRejectedPushIsNotRetried() {
        var s = PushScheduler()
        _ = s.submit(update(1), state: .sending, now: t0)
        let r = s.completed("d", .rejected, now: t0, jitter: 0)
        #expect(acked(r) == [1])
        #expect(s.heldTags().isEmpty)
    }
}

struct APNsTests {
    @Test func headersURLAndOutcomes() {
        let h = APNs.headers(bearer: "jwt", bundleID: "com.example.app", priority: 5, expiration: nil)
        #expect(h.contains("apns-push-type: liveactivity"))
        #expect(h.contains("apns-topic: com.example.app.push-type.liveactivity"))
        #expect(h.contains("apns-priority: 5"))
        #expect(h.contains("authorization: bearer jwt"))
        #expect(APNs.url(base: nil, environment: .sandbox, token: "ab") == "https://api.sandbox.push.apple.com/3/device/ab")
        #expect(APNs.url(base: "https://localhost:9/", environment: .production, token: "ab") == "https://localhost:9/3/device/ab")
        #expect(APNs.outcome(status: 200, body: nil).0 == .delivered)
        #expect(APNs.outcome(status: 410, body: Data(#"{"reason":"Unregistered"}"#.utf8)) == (.gone, "Unregistered"))
        #expect(APNs.outcome(status: 429, body: nil).0 == .retry(after: nil))
        #expect(APNs.outcome(status: 503, body: nil).0 == .retry(after: nil))
        #expect(APNs.outcome(status: 0, body: nil).0 == .retry(after: nil))
        // The answer's Retry-After goes with a 429 or 5xx; an unusable one is none, and a refusal stays one.
        #expect(APNs.outcome(status: 429, body: nil, retryAfter: 7).0 == .retry(after: 7))
        #expect(APNs.outcome(status: 503, body: nil, retryAfter: 2).0 == .retry(after: 2))
        #expect(APNs.outcome(status: 429, body: nil, retryAfter: .infinity).0 == .retry(after: nil))
        #expect(APNs.outcome(status: 429, body: nil, retryAfter: -3).0 == .retry(after: nil))
        #expect(APNs.outcome(status: 400, body: nil, retryAfter: 7).0 == .rejected)
        #expect(APNs.outcome(status: 400, body: Data(#"{"reason":"BadDeviceToken"}"#.utf8)) == (.rejected, "BadDeviceToken"))
        // A peer's reason is cut for the logs, and counted as one of APNs' own or "other".
        let long = String(repeating: "é", count: 5000)
        let (outcome, cut) = APNs.outcome(status: 400, body: try! JSONSerialization.data(withJSONObject: ["reason": long]))
        #expect(outcome == .rejected && cut.map { $0.utf8.count <= APNs.maxReasonBytes && long.hasPrefix($0) } == true)
        // A cut through a scalar backs off to the scalar's start (no U+FFFD, within the limit).
        for lead in ["a", "ab", "abc"] {
            let odd = lead + String(repeating: "€", count: 3000)  // 3 bytes each
            let oddCut = APNs.outcome(status: 400, body: try! JSONSerialization.data(withJSONObject: ["reason": odd])).1 ?? ""
            #expect(oddCut.utf8.count <= APNs.maxReasonBytes && oddCut.utf8.count > APNs.maxReasonBytes - 3 && odd.hasPrefix(oddCut))
            #expect(!oddCut.unicodeScalars.contains("\u{FFFD}"))
        }
        #expect(APNs.wholeScalars("😀😀", upTo: 5) == "😀" && APNs.wholeScalars("😀", upTo: 3) == "" && APNs.wholeScalars("ab", upTo: 5) == "ab")
        #expect(APNs.reasonLabel("BadDeviceToken") == "BadDeviceToken")
        #expect(APNs.reasonLabel(cut) == "other" && APNs.reasonLabel("x\(UUID())") == "other" && APNs.reasonLabel(nil) == "unknown")
        #expect(APNs.outcome(status: 403, body: nil).0 == .rejected)
        // An old token called expired is renewed and the push tried again; a young one would fare no
        // better renewed (a clock off): refused like any 403, not retried for ever.
        let expired = Data(#"{"reason":"ExpiredProviderToken"}"#.utf8)
        #expect(APNs.outcome(status: 403, body: expired, tokenAge: 45 * 60).0 == .retry(after: nil))
        #expect(APNs.outcome(status: 403, body: expired, tokenAge: 30) == (.rejected, "ExpiredProviderToken"))
    }

    @Test func theProviderTokenIsAnES256JWTRenewedBeforeAnHour() throws {
        let token = try #require(APNs.providerToken(keyID: "K1", teamID: "T1", issuedAt: Date(timeIntervalSince1970: 1000)) { _ in Data(repeating: 7, count: 64) })
        let parts = token.split(separator: ".").map(String.init)
        #expect(parts.count == 3)
        func decode(_ s: String) -> [String: Any] {
            var b = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while b.count % 4 != 0 { b += "=" }
            return (try? JSONSerialization.jsonObject(with: Data(base64Encoded: b) ?? Data()) as? [String: Any]) ?? [:]
        }
        #expect(decode(parts[0])["alg"] as? String == "ES256" && decode(parts[0])["kid"] as? String == "K1")
        #expect(decode(parts[1])["iss"] as? String == "T1" && decode(parts[1])["iat"] as? Int == 1000)
        #expect(!token.contains("=") && !token.contains("+") && !token.contains("/"))
        #expect(APNs.providerToken(keyID: "K", teamID: "T", issuedAt: Date()) { _ in nil } == nil)

        var cache = ProviderTokenCache()
        var made = 0
        let start = Date(timeIntervalSince1970: 10_000)
        let make: (Date) -> String? = { _ in
            made += 1
            return "t\(made)"
        }
        #expect(cache.current(now: start, make: make) == "t1")
        #expect(cache.current(now: start + 49 * 60, make: make) == "t1")
        #expect(cache.current(now: start + 50 * 60, make: make) == "t2")
        let issued = cache.issuedAt
        cache.expired(issuedAt: issued, now: start + 55 * 60)  // APNs called t2 young: kept (no churn of tokens)
        #expect(cache.current(now: start + 55 * 60, make: make) == "t2")
        cache.expired(issuedAt: start, now: start + 75 * 60)  // t1 expired, but t2 is kept: not renewed again
        #expect(cache.current(now: start + 75 * 60, make: make) == "t2")
        cache.expired(issuedAt: issued, now: start + 75 * 60)  // APNs called t2 expired at 25 minutes: renewed at once
        #expect(cache.current(now: start + 76 * 60, make: make) == "t3")
    }

    @Test func registrationsAreValidated() {
        #expect((try? PushRegistration.parse(type: nil, body: Data(#"{"id":"d-1","pushToken":"ABcd","environment":"sandbox"}"#.utf8)).get())
            == PushRegistration(id: "d-1", pushToken: "abcd", environment: .sandbox))
        #expect((try? PushRegistration.parse(type: nil, body: Data(#"{"id":"d-1","pushToken":"ab"}"#.utf8)).get())?.environment == .production)
        for (body, code) in [
            ("nope", DeadLetterCode.invalidJSON), (#"{"id":"a b","pushToken":"ab"}"#, .invalidRequest),
            (#"{"id":"d","pushToken":"abc"}"#, .invalidRequest), (#"{"id":"d","pushToken":"zz"}"#, .invalidRequest),
            (#"{"id":"d","pushToken":"ab","environment":"dev"}"#, .invalidRequest), (#"{"id":"d","pushToken":"ab","environment":7}"#, .invalidRequest),
            // JSON, but no object: the same code the router gives it.
            ("42", .invalidRequest), (#""x""#, .invalidRequest), ("true", .invalidRequest),
        ] {
            guard case .failure(let r) = PushRegistration.parse(type: nil, body: Data(body.utf8)) else {
                Issue.record("accepted \(body)")
                continue
            }
            #expect(r.code == code, "\(body)")
        }
        if case .failure(let r) = PushRegistration.parse(type: "frontdesk.activity.v2", body: Data("{}".utf8)) {
            #expect(r.code == .unsupportedVersion)
        }
    }
}

struct FrontDeskActivityTests {
    @Test func thePushersPayloadsDecodeWithTheSharedModel() throws {
        var e = StatusEvent(
            dispatchId: "d-1", seq: 5, state: .sending, step: 2, activity: "Drafting reply",
            input: "Reply to Lisa about the AGM agenda — short, confirm 14:00",
            startedAt: "2026-05-13T09:41:00.000Z", at: "2026-05-13T09:41:04.000Z", elapsedMs: 4000, expiresAt: "2026-05-13T13:41:00.000Z")
        e.project = .init(id: "yemaya", name: "Yemaya", glyph: "YE", accent: "#6E56CF")
        e.target = .init(id: "board-prep", name: "Board Prep")
        e.preview = ["Hi Lisa,", "Confirmed for 14:00 on Thursday."]
        e.etaMs = 2000
        var s = LiveActivityState()
        s.apply(e)
        let data = ActivityPush.payload(for: e, view: try #require(s.view(now: Date())))
        let push = try JSONDecoder().decode(ActivityPushPayload.self, from: data)
        #expect(push.aps.event == "update")
        #expect(push.aps.contentState.routeLine == "Yemaya · Board Prep")
        #expect(push.aps.contentState.bars == [.done, .done, .current])
        #expect(push.aps.contentState.etaMs == 2000)
        // Stale once the ETA has run out (and a grace), not hours later.
        #expect(push.aps.staleDate == push.aps.timestamp + 2 + ActivityPush.etaGraceSeconds)
        var end = e
        end.seq = 6
        end.state = .replied
        end.step = 3
        end.etaMs = nil
        var t = LiveActivityState()
        t.apply(end)
        let ended = try JSONDecoder().decode(ActivityPushPayload.self, from: ActivityPush.payload(for: end, view: try #require(t.view(now: Date()))))
        #expect(ended.aps.event == "end")
        #expect(ended.aps.dismissalDate == ended.aps.timestamp + ActivityPush.dismissalSeconds)
        let route = ActivityPush.route(of: e)
        #expect(route == "yemaya/board-prep")
        #expect(ActivityPush.priority(for: end, previousState: .sending, previousRoute: route) == 10)
        #expect(ActivityPush.priority(for: e, previousState: .sending, previousRoute: route) == 5)
        #expect(ActivityPush.priority(for: e, previousState: .routing, previousRoute: route) == 10)
        // A reroute in the same state is news, not a preview.
        #expect(ActivityPush.priority(for: e, previousState: .sending, previousRoute: "acme/legal") == 10)
    }

    @Test func aPayloadStaysUnder4KBWhateverTheText() throws {
        // 40 characters of ~100 combining marks each: a valid input (≤ 4,000 scalars), ~8 KB of UTF-8.
        let heavy = String(repeating: "a" + String(repeating: "\u{0301}", count: 99), count: 40)
        var e = StatusEvent(
            dispatchId: "d-1", seq: 5, state: .sending, step: 2, activity: heavy, input: heavy,
            startedAt: "2026-05-13T09:41:00.000Z", at: "2026-05-13T09:41:04.000Z", elapsedMs: 4000, expiresAt: "2026-05-13T13:41:00.000Z")
        e.project = .init(id: "yemaya", name: heavy, glyph: "YE", accent: "#6E56CF")
        e.target = .init(id: "board-prep", name: heavy)
        e.preview = [heavy, heavy, heavy]
        var s = LiveActivityState()
        s.apply(e)
        let data = ActivityPush.payload(for: e, view: try #require(s.view(now: Date())))
        #expect(data.count <= ActivityPush.maxBytes)
        #expect((try? JSONDecoder().decode(ActivityPushPayload.self, from: data)) != nil)
    }

    @Test func aLongInputIsShortenedBeforeThePreviewIsDropped() throws {
        var e = StatusEvent(
            dispatchId: "d-1", seq: 5, state: .sending, step: 2, activity: "Drafting reply",
            input: String(repeating: "Reply to Lisa about the AGM agenda. ", count: 111),  // ~4,000 characters
            startedAt: "2026-05-13T09:41:00.000Z", at: "2026-05-13T09:41:04.000Z", elapsedMs: 4000, expiresAt: "2026-05-13T13:41:00.000Z")
        e.preview = ["Hi Lisa,", "Confirmed for 14:00 on Thursday."]
        var s = LiveActivityState()
        s.apply(e)
        let data = ActivityPush.payload(for: e, view: try #require(s.view(now: Date())))
        let push = try JSONDecoder().decode(ActivityPushPayload.self, from: data)
        #expect(data.count <= ActivityPush.maxBytes)
        #expect(push.aps.contentState.preview == ["Hi Lisa,", "Confirmed for 14:00 on Thursday."])
        #expect(push.aps.contentState.input.hasPrefix("Reply to Lisa"))
    }

    @Test func anETANearIntMaxNeitherTrapsNorOutlivesTheExpiry() throws {
        // Status events can be published by anyone who may write to the exchange.
        var e = StatusEvent(
            dispatchId: "d-1", seq: 5, state: .sending, step: 2, activity: "Drafting reply", input: "Reply to Lisa",
            startedAt: "2026-05-13T09:41:00.000Z", at: "2026-05-13T09:41:04.000Z", elapsedMs: 4000, expiresAt: "2026-05-13T13:41:00.000Z")
        for eta in [Int.max, Int.max - 998, 86_400_000 * 400] {
            e.etaMs = eta
            var s = LiveActivityState()
            s.apply(e)
            let push = try JSONDecoder().decode(ActivityPushPayload.self, from: ActivityPush.payload(for: e, view: try #require(s.view(now: Date()))))
            #expect(push.aps.staleDate == Int(try #require(RFC3339.parse(e.expiresAt)).timeIntervalSince1970))
        }
    }
}
