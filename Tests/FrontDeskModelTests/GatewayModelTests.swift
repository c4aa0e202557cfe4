import Foundation
import Testing

@testable import FrontDeskModel

struct GatewayEndpointTests {
    @Test(arguments: [
        ("POST", "/v1/dispatches", GatewayEndpoint.createDispatch),
        ("GET", "/v1/dispatches/d-1", .latest(id: "d-1")),
        ("HEAD", "/v1/dispatches/d-1", .latest(id: "d-1")),
        ("GET", "/v1/dispatches/a.b:c_d-9/events", .events(id: "a.b:c_d-9")),
        ("POST", "/v1/dispatches/d-1/cancel", .cancel(id: "d-1")),
        ("POST", "/v1/dispatches/d-1/reroute", .reroute(id: "d-1")),
        ("PUT", "/v1/dispatches/d-1/activity", .activity(id: "d-1")),
        ("GET", "/v1/targets", .targets),
        ("GET", "/v1/route", .route),
        ("GET", "/", .page(file: "index.html")),
        ("GET", "/app.js", .page(file: "app.js")),
        ("GET", "/v1/dispatches", .methodNotAllowed(allowed: "POST")),
        ("DELETE", "/v1/dispatches/d-1", .methodNotAllowed(allowed: "GET")),
        ("GET", "/v1/dispatches/d-1/cancel", .methodNotAllowed(allowed: "POST")),
        ("GET", "/v1/dispatches/d 1", .notFound),
        ("GET", "/v1/dispatches/" + String(repeating: "x", count: 129), .notFound),
        ("GET", "/v1/dispatches//events", .notFound),
        ("GET", "/v1/dispatches/d-1/events/more", .notFound),
        ("GET", "/v1/dispatches/d-1/other", .notFound),
        ("GET", "/v2/targets", .notFound),
        ("GET", "/../etc/passwd", .notFound),
        // Paths come as sent: each segment decoded on its own.
        ("GET", "/v1/dispatches/a%3Ab/events", .events(id: "a:b")),
        ("GET", "/v1/dispatches/d-1%2Fevents", .notFound),
        ("GET", "/v1/dispatches/d-1%2fcancel", .notFound),
        ("GET", "/v1/dispatches/d-1%00/events", .notFound),
        ("GET", "/v1/dispatches/d-1%zz", .notFound),
        ("POST", "/v1%2Fdispatches", .notFound),
        ("GET", "/v1/%74argets", .targets),
    ])
    func endpoints(method: String, path: String, expected: GatewayEndpoint) {
        #expect(GatewayEndpoint.parse(method: method, path: path) == expected)
    }

    @Test func theRouterLeavesActivityRegistrationsToThePusher() {
        for body in ["{}", "not json", String(repeating: "x", count: 70_000)] {
            #expect(IntakeClassifier.classify(routingKey: CommandKey.activity, type: nil, body: Data(body.utf8)) == .notForRouter)
        }
    }

    @Test func everyV1EndpointNeedsAToken() {
        #expect(GatewayEndpoint.createDispatch.needsToken)
        #expect(GatewayEndpoint.targets.needsToken)
        #expect(!GatewayEndpoint.page(file: "index.html").needsToken)
    }
}

struct GatewayTokensTests {
    let digest = String(repeating: "ab", count: 32)

    @Test func aBearerTokenNamesItsUser() throws {
        let tokens = try GatewayTokens(json: Data(#"{"\#(digest.uppercased())":"u-42"}"#.utf8))
        let hash: (String) -> String = { $0 == "secret" ? self.digest : "other" }
        #expect(tokens.user(authorization: "Bearer secret", digest: hash) == "u-42")
        #expect(tokens.user(authorization: "bearer   secret", digest: hash) == "u-42")
        for bad in [nil, "", "Bearer", "Bearer ", "Basic secret", "secret", "Bearer wrong", "Bearer " + String(repeating: "x", count: 5000)] {
            #expect(tokens.user(authorization: bad, digest: hash) == nil, "\(bad ?? "nil")")
        }
    }

    @Test(arguments: [#"[]"#, #"{"abc":"u"}"#, #"{"\#(String(repeating: "zz", count: 32))":"u"}"#,
                      #"{"\#(String(repeating: "ab", count: 32))":""}"#, #"{"\#(String(repeating: "ab", count: 32))":7}"#, "not json",
                      // One digest twice, as JSON keys of different case: which user would it be?
                      #"{"\#(String(repeating: "ab", count: 32))":"a","\#(String(repeating: "AB", count: 32))":"b"}"#])
    func aBadTokensFileIsRefused(json: String) {
        #expect(throws: GatewayConfigError.self) { try GatewayTokens(json: Data(json.utf8)) }
    }
}

struct GatewayBodiesTests {
    let table = try! RoutingTable.example()

    func object(_ data: Data) -> [String: Any] { (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:] }

    @Test func aRequestKeepsTheContractsFieldsAndTakesTheUserFromTheToken() throws {
        let body = Data(#"{"id":"d-1","input":"the agm","user":"someone-else","threadId":"t-9","project":"yemaya","extra":1}"#.utf8)
        let (id, out) = try GatewayBodies.dispatchRequest(body, user: "u-42", makeID: { "made" }).get()
        #expect(id == "d-1")
        let o = object(out)
        #expect(o["user"] as? String == "u-42")
        #expect(o["threadId"] as? String == "t-9")
        #expect(o["extra"] == nil)
    }

    /// Read as the router reads it: a byte order mark skipped, unknown fields ignored whatever they hold.
    @Test func theRoutersJSONRules() throws {
        let body = Data([0xEF, 0xBB, 0xBF]) + Data(#"{"input":"x","n":1e400,"deep":[[[{}]]],"id":null}"#.utf8)
        let (id, out) = try GatewayBodies.dispatchRequest(body, user: "u", makeID: { "made-2" }).get()
        #expect(id == "made-2")
        #expect(object(out)["input"] as? String == "x" && object(out)["n"] == nil && object(out)["user"] as? String == "u")
        #expect((try? GatewayBodies.reroute(Data(#"[1]"#.utf8), id: "d", table: table).get()) == nil)
    }

    @Test func anIDIsMadeWhenNoneIsGiven() throws {
        let (id, out) = try GatewayBodies.dispatchRequest(Data(#"{"input":"x"}"#.utf8), user: "u", makeID: { "made-1" }).get()
        #expect(id == "made-1")
        #expect(object(out)["id"] as? String == "made-1")
    }

    @Test(arguments: [
        (#"not json"#, 400, "invalid_json"),
        (#"[1]"#, 400, "invalid_request"),  // JSON, but no object: as on the broker
        (#"{"input":"x",}"#, 400, "invalid_json"),  // the router's JSON rules (RFC 8259)
        (#"{"input":"x","threadId":5}"#, 400, "invalid_request"),
        (#"{"id":"a b","input":"x"}"#, 400, "invalid_request"),
        (#"{"id":7,"input":"x"}"#, 400, "invalid_request"),
        (#"{"input":""}"#, 400, "invalid_request"),
        (#"{"input":5}"#, 400, "invalid_request"),
        (#"{}"#, 400, "invalid_request"),
        (#"{"input":"x","createdAt":"yesterday"}"#, 400, "invalid_request"),
        (#"{"input":"x","project":""}"#, 400, "invalid_request"),
    ])
    func badRequestsAreRefusedWithACode(body: String, status: Int, code: String) {
        guard case .failure(let e) = GatewayBodies.dispatchRequest(Data(body.utf8), user: "u", makeID: { "m" }) else {
            Issue.record("accepted \(body)")
            return
        }
        #expect(e.status == status)
        #expect(e.code == code)
    }

    @Test func anOversizedRequestIs413() {
        let body = Data(#"{"input":""#.utf8) + Data(repeating: 97, count: 70_000) + Data(#""}"#.utf8)
        guard case .failure(let e) = GatewayBodies.dispatchRequest(body, user: "u", makeID: { "m" }) else {
            Issue.record("accepted")
            return
        }
        #expect(e.status == 413)
    }

    @Test func cancelRerouteAndActivity() throws {
        #expect(object(try GatewayBodies.cancel(Data(), id: "d").get())["reason"] as? String == "user")
        #expect(object(try GatewayBodies.cancel(Data(#"{"reason":"later"}"#.utf8), id: "d").get())["reason"] as? String == "later")
        #expect((try? GatewayBodies.cancel(Data(#"{"reason":3}"#.utf8), id: "d").get()) == nil)
        let reroute = object(try GatewayBodies.reroute(Data(#"{"project":"acme","target":"ops"}"#.utf8), id: "d", table: table).get())
        #expect(reroute["target"] as? String == "ops")
        if case .failure(let e) = GatewayBodies.reroute(Data(#"{"project":"acme","target":"nope"}"#.utf8), id: "d", table: table) {
            #expect(e.status == 422 && e.code == "unknown_target")
        } else {
            Issue.record("an unknown target was accepted")
        }
        let activity = object(try GatewayBodies.activity(Data(#"{"pushToken":"ABcd01","environment":"sandbox"}"#.utf8), id: "d").get())
        #expect(activity["pushToken"] as? String == "abcd01")
        for bad in [#"{"pushToken":"xyz"}"#, #"{"pushToken":"abc"}"#, #"{"pushToken":"ab","environment":"dev"}"#, #"{}"#] {
            #expect((try? GatewayBodies.activity(Data(bad.utf8), id: "d").get()) == nil, "\(bad)")
        }
    }
}

struct ServerSentEventsTests {
    @Test func aFrameHasIDEventAndOneDataLinePerLine() {
        let frame = ServerSentEvents.frame(seq: 5, state: "sending", data: Data("{\"a\":1}\n{\"b\":\r\n2}".utf8))
        #expect(String(decoding: frame, as: UTF8.self) == "id: 5\nevent: sending\ndata: {\"a\":1}\ndata: {\"b\":\ndata: 2}\n\n")
    }

    @Test func lastEventIDIsASeq() {
        #expect(ServerSentEvents.lastSeq("7") == 7)
        #expect(ServerSentEvents.lastSeq(" 12 ") == 12)
        for bad in [nil, "", "-3", "+3", "abc", "1 2", "٣"] { #expect(ServerSentEvents.lastSeq(bad) == 0) }
        // A seq past Int.max is after every event: nothing is replayed, nothing traps.
        #expect(ServerSentEvents.lastSeq("99999999999999999999999") == Int.max)
    }
}

struct EventBookTests {
    let t0 = Date(timeIntervalSince1970: 1_000_000)

    func body(_ id: String, _ seq: Int, _ state: String, user: String? = "u") -> Data {
        Data(#"{"dispatchId":"\#(id)","seq":\#(seq),"state":"\#(state)"\#(user.map { #","user":"\#($0)""# } ?? "")}"#.utf8)
    }

    mutating func add(_ book: inout EventBook, _ id: String, _ seq: Int, _ state: String, at: Date? = nil) -> Bool {
        let b = body(id, seq, state)
        let e = EventBook.read(b)!
        return book.add(id: e.id, seq: e.seq, state: e.state, user: e.user, body: b, now: at ?? t0)
    }

    @Test mutating func eventsAreKeptInSeqOrderOnceEach() {
        var book = EventBook()
        #expect(add(&book, "d", 2, "routing"))
        #expect(add(&book, "d", 1, "drafted"))
        #expect(!add(&book, "d", 2, "routing"))
        #expect(add(&book, "d", 3, "sending"))
        #expect(book.events("d", after: 0).map(\.seq) == [1, 2, 3])
        #expect(book.events("d", after: 2).map(\.seq) == [3])
        #expect(book.latest("d")?.state == .sending)
        #expect(book.has("d", seq: 3) && !book.has("d", seq: 4) && !book.has("e", seq: 1))
        #expect(book.isOwned("d", by: "u"))
        #expect(!book.isOwned("d", by: "v"))
        #expect(!book.isOwned("other", by: "u"))
    }

    @Test mutating func nothingFollowsATerminalEvent() {
        var book = EventBook()
        _ = add(&book, "d", 1, "drafted")
        _ = add(&book, "d", 2, "cancelled")
        #expect(!add(&book, "d", 3, "sending"))
        #expect(book.isEnded("d"))
        #expect(book.has("d", seq: 3))  // after the end: a copy needs no reading
    }

    @Test mutating func theEarlierEventsStillComeWhenTheTerminalOneCameFirst() {
        // The live queue can deliver `replied` while the log is still being read from the start.
        var book = EventBook()
        _ = add(&book, "d", 4, "replied")
        #expect(!book.has("d", seq: 1) && !book.has("d", seq: 3))
        #expect(add(&book, "d", 1, "drafted") && add(&book, "d", 2, "routing") && add(&book, "d", 3, "sending"))
        #expect(book.events("d", after: 0).map(\.seq) == [1, 2, 3, 4])
        #expect(book.has("d", seq: 2) && book.has("d", seq: 5))
    }

    /// Events in any order, with repeats, end up once each in seq order.
    @Test mutating func shuffledAndRepeatedEventsEndUpInOrder() {
        var book = EventBook()
        var rng = SystemRandomNumberGenerator()
        var seqs = Array(1...500) + (1...200).map { _ in Int.random(in: 1...500, using: &rng) }
        seqs.shuffle(using: &rng)
        var firsts = Set<Int>()
        for seq in seqs {
            #expect(add(&book, "d", seq, "sending") == firsts.insert(seq).inserted)
        }
        #expect(book.events("d", after: 0).map(\.seq) == Array(1...500))
        #expect(book.events("d", after: 250).map(\.seq) == Array(251...500))
        #expect(book.events("d", after: Int.max).isEmpty && book.events("d", after: Int.min).count == 500)
        #expect(book.has("d", seq: 1) && book.has("d", seq: 500) && !book.has("d", seq: 501) && !book.has("d", seq: 0))
    }

    /// An agent sets the pace of a dispatch's events (a progress reply each):
    /// 200,000 of them are added in well under the limit. Adding one used to
    /// scan and copy all before it (about 2·10^10 steps for these).
    @Test(.timeLimit(.minutes(1))) func aDispatchWithVeryManyEventsIsCheapToAddTo() {
        var book = EventBook()
        let body = Data(#"{"dispatchId":"d","seq":1,"state":"sending","user":"u"}"#.utf8)
        let started = ContinuousClock.now
        for seq in 1...200_000 {
            book.add(id: "d", seq: seq, state: .sending, user: "u", body: body, now: t0)
        }
        #expect(book.events("d", after: 199_990).count == 10)
        #expect(book.bytes == 200_000 * body.count)
        print("200,000 events added in \(ContinuousClock.now - started)")
    }

    @Test func bodiesThatAreNoStatusEventsAreNotRead() {
        for bad in ["{}", "[]", "x", #"{"dispatchId":"a b","seq":1,"state":"drafted"}"#, #"{"dispatchId":"d","seq":0,"state":"drafted"}"#,
                    #"{"dispatchId":"d","seq":1e300,"state":"drafted"}"#, #"{"dispatchId":"d","seq":1,"state":"gone"}"#] {
            #expect(EventBook.read(Data(bad.utf8)) == nil, "\(bad)")
        }
    }

    @Test mutating func pruningForgetsTheOldThenTheEndedOverTheLimit() {
        var book = EventBook()
        _ = add(&book, "old", 1, "drafted", at: t0)
        _ = add(&book, "ended", 1, "failed", at: t0 + 10)
        _ = add(&book, "open", 1, "drafted", at: t0 + 20)
        book.prune(heardBefore: t0 + 5, maxBytes: 1 << 20)
        #expect(!book.knows("old") && book.knows("ended") && book.knows("open"))
        book.prune(heardBefore: t0, maxBytes: 0)
        #expect(!book.knows("ended") && book.knows("open"))
    }
}
