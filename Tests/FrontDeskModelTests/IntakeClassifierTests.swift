import Foundation
@testable import FrontDeskModel
import Testing

@Suite("Intake validation")
struct IntakeClassifierTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var key = "dispatch.request"
        var type: String? = nil
        var body: String
        var code: DeadLetterCode
        var failedID: String? = nil
        var testDescription: String { "\(key) \(body.prefix(40)) → \(code.rawValue)" }
    }

    static let rejects: [Case] = [
        .init(body: "{not json", code: .invalidJSON),
        .init(body: "", code: .invalidJSON),
        .init(body: "[1,2]", code: .invalidRequest),
        .init(body: "\"text\"", code: .invalidRequest),
        .init(body: #"{"input":"x"}"#, code: .invalidRequest),
        .init(body: #"{"id":42,"input":"x"}"#, code: .invalidRequest),
        .init(body: #"{"id":"a#b","input":"x"}"#, code: .invalidRequest),
        .init(body: #"{"id":"a*b","input":"x"}"#, code: .invalidRequest),
        .init(body: #"{"id":"a b","input":"x"}"#, code: .invalidRequest),
        .init(body: #"{"id":"","input":"x"}"#, code: .invalidRequest),
        .init(body: #"{"id":"ok"}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: #"{"id":"ok","input":""}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: #"{"id":"ok","input":7}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: #"{"id":"ok","input":"x","project":3}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: #"{"id":"ok","input":"x","createdAt":"yesterday"}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: #"{"id":"ok","input":"x","target":""}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: "{\"id\":\"ok\",\"input\":\"\(String(repeating: "é", count: 4001))\"}", code: .invalidRequest, failedID: "ok"),
        .init(type: "frontdesk.dispatch.v2", body: #"{"id":"ok","input":"x"}"#, code: .unsupportedVersion),
        .init(type: "v1", body: #"{"id":"ok","input":"x"}"#, code: .unsupportedVersion),
        .init(type: ".v1\u{0301}", body: #"{"id":"ok","input":"x"}"#, code: .unsupportedVersion),
        .init(key: "dispatch.other", body: #"{"id":"ok","input":"x"}"#, code: .invalidRequest),
        .init(key: "dispatch.cancel", body: #"{"reason":"user"}"#, code: .invalidRequest),
        .init(key: "dispatch.cancel", body: #"{"id":"ok","reason":5}"#, code: .invalidRequest),
        .init(key: "dispatch.reroute", body: #"{"id":"ok","project":"acme"}"#, code: .invalidRequest),
        // A malformed cancel or reroute is `invalid_request` (CONTRACT, Cancel), also when it is no JSON.
        .init(key: "dispatch.reroute", body: "nope", code: .invalidRequest),
        .init(key: "dispatch.cancel", body: #"{"id":"ok",}"#, code: .invalidRequest),
        .init(body: #"{"id":"ok","input":"x",}"#, code: .invalidJSON),
        .init(body: #"{"id":"ok","input":null}"#, code: .invalidRequest, failedID: "ok"),
        .init(body: #"{"id":"ok","input":"x","x":"# + String(repeating: "[", count: 600) + String(repeating: "]", count: 600) + "}", code: .invalidJSON),
    ]

    /// A leading byte order mark is skipped, null optional fields are absent,
    /// and unknown fields are ignored however they nest (to 512 levels).
    @Test func lenientWhereJSONAllows() {
        // A type whose bytes end in ".v1" is version 1, though U+0600 joins its dot into one character.
        #expect(IntakeClassifier.classify(routingKey: "dispatch.request", type: "x\u{0600}.v1", body: Data(#"{"id":"ok","input":"x"}"#.utf8))
            == .request(DispatchRequest(id: "ok", input: "x")))
        #expect(MessageVersion.isV1("x\u{0600}.v1") && !"x\u{0600}.v1".hasSuffix(".v1"))
        let bom = Data([0xEF, 0xBB, 0xBF]) + Data(#"{"id":"ok","input":"x"}"#.utf8)
        #expect(IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: bom)
            == .request(DispatchRequest(id: "ok", input: "x")))
        // A lone surrogate escape (valid JSON, no Unicode; Python writes them) reads as U+FFFD.
        #expect(IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: Data(#"{"id":"ok","input":"\ud800"}"#.utf8))
            == .request(DispatchRequest(id: "ok", input: "\u{FFFD}")))
        let nulls = Data(#"{"id":"ok","input":"x","user":null,"project":null}"#.utf8)
        #expect(IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: nulls)
            == .request(DispatchRequest(id: "ok", input: "x")))
        // 512 objects and arrays in all (JSONSerialization's limit): the request's own and 511 inside it.
        let nested = { (n: Int) in Data((#"{"id":"ok","input":"x","x":"# + String(repeating: "[", count: n) + String(repeating: "]", count: n) + "}").utf8) }
        #expect(IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: nested(511))
            == .request(DispatchRequest(id: "ok", input: "x")))
        guard case .reject(.invalidJSON, let reason, nil, _) = IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: nested(512))
        else { Issue.record("513 levels read"); return }
        #expect(reason.contains("deeper than 512"))
        // A number beyond a double's range in an unknown field is still JSON (RFC 8259), and ignored.
        for n in ["1e400", "-1E400", "1e-400", String(repeating: "9", count: 400)] {
            let body = Data(#"{"id":"ok","input":"x","n":\#(n)}"#.utf8)
            #expect(IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: body)
                == .request(DispatchRequest(id: "ok", input: "x")), "\(n)")
        }
        // An error's offset counts the byte order mark: the last byte, the `}` after the stray comma.
        let bad = Data([0xEF, 0xBB, 0xBF]) + Data(#"{"id":"ok","input":"x",}"#.utf8)
        guard case .reject(.invalidJSON, let where_, _, _) = IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: bad)
        else { Issue.record("a trailing comma read"); return }
        #expect(where_.contains("at byte \(bad.count - 1)"), "\(where_)")
    }

    @Test(arguments: rejects)
    func rejectsWithTheRightCode(_ c: Case) {
        let result = IntakeClassifier.classify(routingKey: c.key, type: c.type, body: Data(c.body.utf8))
        guard case .reject(let code, let reason, let failedID, _) = result else {
            Issue.record("accepted: \(result)")
            return
        }
        #expect(code == c.code)
        #expect(failedID == c.failedID)
        #expect(reason.count > 5)
    }

    @Test func tooLargeIsCheckedFirst() {
        let body = Data(repeating: UInt8(ascii: "x"), count: IntakeClassifier.maxBodyBytes + 1)
        guard case .reject(let code, _, nil, nil) = IntakeClassifier.classify(routingKey: "nope", type: "x.v2", body: body) else {
            Issue.record("not rejected")
            return
        }
        #expect(code == .tooLarge)
        let exactly = "{\"id\":\"a\",\"input\":\"" + String(repeating: "x", count: IntakeClassifier.maxBodyBytes - 21) + "\"}"
        #expect(Data(exactly.utf8).count == IntakeClassifier.maxBodyBytes)
        if case .reject(.tooLarge, _, _, _) = IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: Data(exactly.utf8)) {
            Issue.record("a body of exactly 64 KiB is not too large")
        }
    }

    @Test func validMessagesParse() {
        let request = IntakeClassifier.classify(
            routingKey: "dispatch.request", type: "frontdesk.dispatch.v1",
            body: Data(#"{"id":"0b7e-1","input":"Zoë — 14:00","user":"u-42","threadId":"t-9","project":"yemaya","target":"board-prep","createdAt":"2026-05-13T09:41:00.000Z","extra":{"ignored":true}}"#.utf8))
        guard case .request(let r) = request else {
            Issue.record("not a request: \(request)")
            return
        }
        #expect(r.id == "0b7e-1" && r.input == "Zoë — 14:00" && r.user == "u-42" && r.threadId == "t-9")
        #expect(r.project == "yemaya" && r.target == "board-prep")
        #expect(r.createdAt == Date(timeIntervalSince1970: 1_778_665_260))
        #expect(IntakeClassifier.classify(routingKey: "dispatch.cancel", type: nil, body: Data(#"{"id":"x"}"#.utf8))
            == .cancel(CancelCommand(id: "x", reason: "user")))
        #expect(IntakeClassifier.classify(routingKey: "dispatch.reroute", type: nil, body: Data(#"{"id":"x","project":"acme","target":"legal"}"#.utf8))
            == .reroute(RerouteCommand(id: "x", route: .init(project: "acme", target: "legal"))))
        // 4,000 code points is the limit, not 4,000 bytes.
        let long = String(repeating: "é", count: 4000)
        guard case .request = IntakeClassifier.classify(routingKey: "dispatch.request", type: nil, body: Data("{\"id\":\"a\",\"input\":\"\(long)\"}".utf8)) else {
            Issue.record("4,000 code points refused")
            return
        }
    }
}

@Suite("Router decisions and their events")
struct RouterDecisionTests {
    let resolver = RouteResolver(table: try! RoutingTable.example())
    let now = Date(timeIntervalSince1970: 1_778_665_264)

    func request(_ input: String, project: String? = nil, target: String? = nil, createdAt: Date? = nil) -> DispatchRequest {
        DispatchRequest(id: "d-1", input: input, user: "u-42", threadId: "t-9", project: project, target: target, createdAt: createdAt)
    }

    @Test func routedRecordGivesDraftedThenRouting() throws {
        let record = RouterDecision.decide(
            request("Reply to Lisa about the AGM agenda — short, confirm 14:00", createdAt: Date(timeIntervalSince1970: 1_778_665_260)),
            body: Data("b".utf8), resolver: resolver, now: now, lifetimeSeconds: 14_400)
        let events = record.events()
        #expect(events.map(\.state) == [.drafted, .routing])
        #expect(events.map(\.seq) == [1, 2])
        #expect(events.map(\.step) == [0, 1])
        #expect(events.map(\.routingKey) == ["status._._.drafted", "status.yemaya.board-prep.routing"])
        #expect(events.map(\.messageID) == ["d-1/1", "d-1/2"])
        #expect(events[1].project == .init(id: "yemaya", name: "Yemaya", glyph: "YE", accent: "#6E56CF"))
        #expect(events[1].route?.reason == "keywords: agm, agenda; contact: Lisa")
        #expect(events.allSatisfy { $0.startedAt == "2026-05-13T09:41:00.000Z" && $0.expiresAt == "2026-05-13T13:41:00.000Z" })
        #expect(events.allSatisfy { $0.elapsedMs == 4000 && $0.threadId == "t-9" && $0.activity.count > 3 })
        #expect(record.lastSeq == 2)
        let json = try JSONSerialization.jsonObject(with: events[0].jsonData()) as! [String: Any]
        #expect(json["project"] == nil && json["preview"] == nil && json["etaMs"] == nil)
        #expect(json["steps"] as? Int == 3)
    }

    @Test func failuresAfterDrafted() {
        let unknown = RouterDecision.decide(request("x", project: "acme", target: "nope"), body: Data(), resolver: resolver, now: now, lifetimeSeconds: 60)
        #expect(unknown.events().map(\.state) == [.drafted, .failed])
        #expect(unknown.events().last?.error?.code == "unknown_target")
        #expect(unknown.events().last?.routingKey == "status._._.failed")
        let expired = RouterDecision.decide(
            request("the agenda", createdAt: now.addingTimeInterval(-120)), body: Data(), resolver: resolver, now: now, lifetimeSeconds: 60)
        #expect(expired.events().last?.error?.code == "expired")
    }

    @Test func invalidRequestIsOneFailedEvent() {
        let record = RouterDecision.invalid(id: "bad", input: nil, reason: "'input' is missing", body: Data(), now: now, lifetimeSeconds: 60)
        let events = record.events()
        #expect(events.count == 1)
        #expect(events[0].state == .failed && events[0].seq == 1 && events[0].error?.code == "invalid_request")
    }

    @Test func fingerprintsTellBodiesApart() {
        #expect(DispatchRecord.fingerprint(Data("a".utf8)) == DispatchRecord.fingerprint(Data("a".utf8)))
        #expect(DispatchRecord.fingerprint(Data("a".utf8)) != DispatchRecord.fingerprint(Data("b".utf8)))
    }
}

@Suite("RFC 3339")
struct RFC3339Tests {
    @Test(arguments: [
        ("2026-05-13T09:41:00.000Z", 1_778_665_260.0),
        ("2026-05-13T09:41:00Z", 1_778_665_260.0),
        ("2026-05-13T09:41:00.5z", 1_778_665_260.5),
        ("2026-05-13T11:41:00.250+02:00", 1_778_665_260.25),
        ("2026-05-13 04:41:00-05:00", 1_778_665_260.0),
        ("1970-01-01T00:00:00.000Z", 0.0),
        ("2028-02-29T00:00:00Z", 1_835_395_200.0),
        ("2000-02-29T00:00:00Z", 951_782_400.0),
        ("2026-05-13T09:41:00+23:59", 1_778_578_920.0),
    ])
    func parses(_ text: String, _ seconds: Double) throws {
        let date = try #require(RFC3339.parse(text))
        #expect(abs(date.timeIntervalSince1970 - seconds) < 0.0005)
    }

    @Test(arguments: ["", "yesterday", "2026-13-01T00:00:00Z", "2026-05-13T09:41:00", "2026-05-13T09:41:00.Z", "2026-05-13T09:41:00Zjunk", "2026-05-13T25:00:00Z",
        // Days a month does not have, and offsets no clock has.
        "2026-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2026-04-31T00:00:00Z", "2026-05-32T00:00:00Z",
        "2026-05-13T09:41:00+99:99", "2026-05-13T09:41:00+24:00", "2026-05-13T09:41:00-00:60"])
    func refuses(_ text: String) {
        #expect(RFC3339.parse(text) == nil)
    }

    @Test func formatsUTCWithMilliseconds() {
        #expect(RFC3339.format(Date(timeIntervalSince1970: 1_778_665_260.0429)) == "2026-05-13T09:41:00.042Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00.000Z")
        let now = Date()
        #expect(abs(RFC3339.parse(RFC3339.format(now))!.timeIntervalSince(now)) < 0.001)
        // Before the epoch, milliseconds count forward from the second below.
        #expect(RFC3339.format(Date(timeIntervalSince1970: -0.25)) == "1969-12-31T23:59:59.750Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: -86_400.5)) == "1969-12-30T23:59:59.500Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: 951_782_400)) == "2000-02-29T00:00:00.000Z")
    }

    /// Out of years 0001–9999 (or not a number), the nearest instant inside: no trap.
    @Test func formatsEveryInstantWithoutTrapping() {
        #expect(RFC3339.format(Date(timeIntervalSince1970: .infinity)) == "9999-12-31T23:59:59.999Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: 1e300)) == "9999-12-31T23:59:59.999Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: -.infinity)) == "0001-01-01T00:00:00.000Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: .nan)) == "1970-01-01T00:00:00.000Z")
        #expect(RFC3339.format(Date.distantFuture) == "4001-01-01T00:00:00.000Z")
        #expect(RFC3339.format(Date(timeIntervalSince1970: -62_135_596_800)) == "0001-01-01T00:00:00.000Z")
    }
}
