import Foundation
import Testing

@testable import FrontDeskModel

/// Values from outside, however extreme, are range-checked before use.
struct UntrustedValueTests {
    let resolver = RouteResolver(table: try! RoutingTable.example())
    let now = Date(timeIntervalSince1970: 1_778_665_264)

    @Test func aCreatedAtLaterThanIntakeCountsAsIntakeTime() {
        let aheads: [TimeInterval] = [60, 86_400 * 365 * 74, 1e12]
        for ahead in aheads {
            let request = DispatchRequest(
                id: "d-1", input: "the agm agenda", user: nil, threadId: nil, project: nil, target: nil,
                createdAt: now.addingTimeInterval(ahead))
            let record = RouterDecision.decide(request, body: Data(), resolver: resolver, now: now, lifetimeSeconds: 14_400)
            #expect(record.startedAt == RFC3339.format(now))
            #expect(record.expiresAt == RFC3339.format(now.addingTimeInterval(14_400)))
        }
    }

    @Test func repliesAreVersionedAndBounded() {
        let final = Data(#"{"dispatchId":"d-1","attempt":1,"kind":"final","text":"ok"}"#.utf8)
        #expect((try? AgentReply.classify(type: nil, body: final).get()) != nil)
        #expect((try? AgentReply.classify(type: "frontdesk.reply.v1", body: final).get()) != nil)
        func code(_ type: String?, _ body: String) -> DeadLetterCode? {
            if case .failure(let r) = AgentReply.classify(type: type, body: Data(body.utf8)) { return r.code }
            return nil
        }
        #expect(code("frontdesk.reply.v2", #"{"dispatchId":"d-1","attempt":1,"kind":"final"}"#) == .unsupportedVersion)
        #expect(code(nil, #"{"dispatchId":"d-1","attempt":1,"kind":"final","text":""# + String(repeating: "x", count: 300_000) + #""}"#) == .tooLarge)
        for attempt in ["1e300", "-9223372036854775808", "9223372036854775807", "1.5", "0", "NaN", "\"1\""] {
            #expect(code(nil, #"{"dispatchId":"d-1","attempt":\#(attempt),"kind":"final"}"#) != nil, "attempt \(attempt)")
        }
        // An ETA out of range is no ETA: dropped, not shown.
        for eta in ["1e300", "-1", "86400001", "2.5"] {
            let reply = AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1,"kind":"progress","etaMs":\#(eta)}"#.utf8))
            #expect(reply != nil && reply?.etaMs == nil, "etaMs \(eta)")
        }
    }

    /// An agent's activity is one short line in every later `sending` event,
    /// its error's code and message short lines in the `failed` one; reading
    /// a reply passed on (re-encoded) again changes nothing.
    @Test func anAgentsActivityAndErrorAreShortLines() throws {
        let long = String(repeating: "é", count: 300)
        let body = #"{"dispatchId":"d-1","attempt":1,"kind":"error","activity":"line one\nline two\u0000\u2028\#(long)","error":{"code":"\#(long)","message":"\#(long)\#(long)"}}"#
        let r = try AgentReply.classify(type: nil, body: Data(body.utf8)).get()
        let activity = try #require(r.activity)
        #expect(activity.count == AgentReply.maxActivity && activity.hasPrefix("line one line two  é") && activity.hasSuffix("é…"))
        #expect(!activity.contains("\n") && !activity.contains("\u{0}") && !activity.contains("\u{2028}"))
        #expect(r.error?.code.count == AgentReply.maxErrorCode && r.error?.message.count == AgentReply.maxErrorMessage)
        #expect(try AgentReply.classify(type: nil, body: r.jsonData()).get() == r)
        // Short lines stay as they are; a "\r\n" (one character) is one space.
        #expect(AgentReply.line("Drafting reply", max: 200) == "Drafting reply")
        #expect(AgentReply.line("a\r\nb", max: 200) == "a b")
        #expect(AgentReply.line(String(repeating: "x", count: 200), max: 200).count == 200)
        #expect(AgentReply.line(String(repeating: "x", count: 201), max: 200) == String(repeating: "x", count: 199) + "…")
        // One character of any number of combining marks is bounded too (4 × max bytes), and so is
        // a line of such characters; each reads back the same.
        let heavy = "a" + String(repeating: "\u{301}", count: 120_000)
        for text in [heavy, "ok " + heavy, String(repeating: "e\u{301}\u{302}\u{303}", count: 300), String(repeating: "😀", count: 300)] {
            let cut = AgentReply.line(text, max: 200)
            #expect(cut.utf8.count <= 800 && cut.count <= 200 && cut.hasSuffix("…"), "\(cut.utf8.count) bytes, \(cut.count) characters")
            #expect(AgentReply.line(cut, max: 200) == cut)
        }
        // An activity of nothing but spaces or breaks is none: the event keeps its own line.
        let blank = #"{"dispatchId":"d-1","attempt":1,"kind":"progress","activity":"\n \t"}"#
        #expect(try AgentReply.classify(type: nil, body: Data(blank.utf8)).get().activity == nil)
    }

    @Test func aReplyOverTheLimitIsReadAsAnErrorOfItsAttemptUpToAMegabyte() throws {
        func body(_ fields: String, text count: Int) -> Data {
            Data(("{" + fields + #","text":""# + String(repeating: "x", count: count) + #""}"#).utf8)
        }
        #expect(AgentReply.overLimit(body(#""dispatchId":"d-1","attempt":2,"kind":"final""#, text: 1000)) == nil, "within the limit: a reply")
        let over = try #require(AgentReply.overLimit(body(#""dispatchId":"d-1","attempt":2,"kind":"progress""#, text: 300_000)))
        #expect(over.dispatchId == "d-1" && over.attempt == 2 && over.kind == .error && !over.retryable && over.text == nil)
        #expect(over.error?.code == "reply_too_large" && over.error?.message.contains("over the limit of 262144") == true)
        #expect(AgentReply.overLimit(body(#""dispatchId":"d-1","attempt":2,"kind":"final""#, text: 1 << 20)) == nil, "far over: not read")
        #expect(AgentReply.overLimit(body(#""dispatchId":"d-1","attempt":2,"kind":"final""#, text: (1 << 20) - 100)) != nil)
        // Passed on to another partition as a reply of its own, which reads back the same.
        #expect(try AgentReply.classify(type: nil, body: over.jsonData()).get() == over)
        let full = AgentReply(dispatchId: "d-2", attempt: 3, kind: .progress, text: "line\n\"two\"", activity: "Writing", etaMs: 1200)
        #expect(try AgentReply.classify(type: nil, body: full.jsonData()).get() == full)
        let retryable = #""dispatchId":"d-1","attempt":2,"kind":"error","retryable":true"#
        #expect(AgentReply.overLimit(body(retryable, text: 300_000))?.retryable == true, "an error the agent called retryable stays so")
        #expect(AgentReply.overLimit(body(#""dispatchId":"d-1","attempt":2,"kind":"final","retryable":true"#, text: 300_000))?.retryable == false)
        #expect(AgentReply.overLimit(body(#""dispatchId":"d-1","attempt":0,"kind":"final""#, text: 300_000)) == nil, "no attempt")
        #expect(AgentReply.overLimit(Data(repeating: UInt8(ascii: "{"), count: 300_000)) == nil, "no JSON")
    }

    @Test func parkedCopiesWithSeqsOrAttemptsOutOfRangeAreNotRead() throws {
        let record = DispatchRecord(
            id: "d-1", bodyFingerprint: "x", outcome: .routed, input: "the agm agenda",
            project: .init(id: "yemaya", name: "Yemaya", glyph: "YE"), target: .init(id: "board-prep", name: "Board Prep"),
            invalid: false, startedAt: RFC3339.format(now), decidedAt: RFC3339.format(now),
            expiresAt: RFC3339.format(now.addingTimeInterval(60)), lastSeq: 2)
        let good = ParkedDispatch(
            record: record, project: record.project!, target: record.target!, attempt: 1, everDelivered: false, lastSeq: 3, stepReached: 1)
        let json = try #require(try JSONSerialization.jsonObject(with: good.jsonData()) as? [String: Any])
        #expect(try ParkedDispatch(jsonData: good.jsonData()) == good)
        for (key, value) in [("lastSeq", Int.max), ("lastSeq", -1), ("attempt", Int.min), ("attempt", 0), ("stepReached", 9)] {
            var bad = json
            bad[key] = value
            #expect(throws: (any Error).self, "\(key) \(value)") { try ParkedDispatch(jsonData: JSONSerialization.data(withJSONObject: bad)) }
        }
    }

    @Test func aLongCancelReasonIsCutAndStillCancels() {
        let long = String(repeating: "x", count: IntakeClassifier.maxReasonScalars + 100)
        let message = IntakeClassifier.classify(routingKey: "dispatch.cancel", type: nil, body: Data(#"{"id":"d-1","reason":"\#(long)"}"#.utf8))
        #expect(message == .cancel(CancelCommand(id: "d-1", reason: String(repeating: "x", count: IntakeClassifier.maxReasonScalars))))
    }
}

struct SenderCommandTests {
    @Test func commandsRoundTripThroughTheBodyTheRouterWrites() {
        let commands: [SenderCommand] = [
            .cancel(id: "d-1", reason: "changed my \"mind\"\n"), .reroute(id: "d.2:x", route: .init(project: "acme", target: "legal")),
        ]
        for c in commands { #expect(SenderCommand(type: c.type, body: c.jsonData()) == c) }
        #expect(SenderCommand(type: "frontdesk.handoff.other.v1", body: commands[0].jsonData()) == nil)
        #expect(SenderCommand(type: SenderCommand.cancelType, body: Data(#"{"id":"bad#id"}"#.utf8)) == nil)
        #expect(SenderCommand(type: SenderCommand.rerouteType, body: Data(#"{"id":"d-1","project":"acme"}"#.utf8)) == nil)
    }

    @Test func pendingCommandsKeepACancelOverAReroutePruneByAgeAndUseUpReroutes() {
        var pending = PendingCommands()
        let t0 = Date(timeIntervalSince1970: 1_000_000)
        pending.add(.reroute(id: "a", route: .init(project: "acme", target: "legal")), at: t0)
        pending.add(.cancel(id: "a", reason: "user"), at: t0)
        pending.add(.cancel(id: "a", reason: "second"), at: t0)
        pending.add(.reroute(id: "b", route: .init(project: "acme", target: "ops")), at: t0.addingTimeInterval(100))
        let now = t0.addingTimeInterval(100)
        #expect(pending.cancelReason("a", now: now, window: 3600) == "user")
        #expect(pending.takeReroute("b", now: now, window: 3600) == .init(project: "acme", target: "ops"))
        #expect(pending.takeReroute("b", now: now, window: 3600) == nil)
        #expect(pending.count == 1)
        pending.prune(olderThan: 50, now: t0.addingTimeInterval(60))
        #expect(pending.count == 0)
    }
}
