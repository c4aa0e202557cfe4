import Foundation
import Testing

@testable import FrontDeskModel

@Suite struct JSONReaderTests {
    func parse(_ text: String) throws -> JSONValue { try JSONReader.parse(Data(text.utf8)) }

    @Test func readsEveryKindOfValue() throws {
        let v = try parse(#" {"s":"a\"b\\c\/d\b\f\n\r\t\u00e9\ud83d\ude00","n":[0,-0,1.5,-2e3,1E-7,12345678],"t":true,"f":false,"z":null,"o":{},"a":[]} "#)
        guard case .object(let o) = v else { Issue.record("not an object"); return }
        #expect(o["s"] == .string("a\"b\\c/d\u{08}\u{0C}\n\r\té😀"))
        #expect(o["n"] == .array([.number(0), .number(-0.0), .number(1.5), .number(-2000), .number(1e-7), .number(12_345_678)]))
        #expect(o["t"] == .bool(true) && o["f"] == .bool(false) && o["z"] == .null)
        #expect(o["o"] == .object([:]) && o["a"] == .array([]))
    }

    /// Objects are built from one stack of fields: nested objects, objects
    /// in arrays and siblings after them each keep exactly their own fields,
    /// and a repeated key keeps its last value (as JSONSerialization does).
    @Test func nestedObjectsKeepTheirOwnFieldsAndTheLastOfARepeatedKey() throws {
        let v = try parse(#"{"a":1,"o":{"b":2,"o":{"c":3},"b":4},"l":[{"d":5},{},{"e":6,"e":7}],"a":8,"z":{"y":null}}"#)
        #expect(v == .object([
            "a": .number(8),
            "o": .object(["b": .number(4), "o": .object(["c": .number(3)])]),
            "l": .array([.object(["d": .number(5)]), .object([:]), .object(["e": .number(7)])]),
            "z": .object(["y": .null]),
        ]))
        let wide = "{" + (0..<100).map { "\"k\($0)\":\($0)" }.joined(separator: ",") + "}"
        guard case .object(let o) = try parse(wide) else { Issue.record("not an object"); return }
        #expect(o.count == 100 && o["k0"] == .number(0) && o["k99"] == .number(99))
    }

    /// Short integers are read without strtod: the same doubles as strtod gives, at the edges too.
    @Test func integersReadAsStrtodReadsThem() throws {
        let texts = ["0", "-0", "7", "-7", "999999999999999", "-999999999999999", "1000000000000000", "9007199254740993",
                     "123456789012345678901234567890", "10", "1.0", "1e2", "-0.0", "0e0", "15E-1"]
        for t in texts {
            guard case .number(let d) = try parse(t) else { Issue.record("\(t): no number"); continue }
            let expected = try #require(Double(t))
            #expect(d == expected && d.sign == expected.sign, "\(t): \(d) vs \(expected)")
        }
    }

    @Test func keepsNonASCIITextAsIs() throws {
        let text = "Zoë — ✓ 👩🏽‍💻 cafe\u{301}"
        #expect(try parse("\"\(text)\"") == .string(text))
    }

    static let malformed: [String] = [
        "", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "[1 2]", "01", "+1", "1.", ".5", "1e", "-",
        "NaN", "Infinity", "1e999", "tru", "nul", "\"abc", "\"a\\x\"", "\"\\u12\"", "\"\\ud800\\u12\"", "\"tab\there\"", "{} {}", "[1]x", "'single'",
    ]

    /// A lone surrogate escape is valid JSON but no Unicode: U+FFFD, and the
    /// escape after a lone high half is read on its own.
    @Test func readsALoneSurrogateAsTheReplacementCharacter() throws {
        #expect(try parse(#""\ud800""#) == .string("\u{FFFD}"))
        #expect(try parse(#""\udc00x""#) == .string("\u{FFFD}x"))
        #expect(try parse(#""\ud800\u0041""#) == .string("\u{FFFD}A"))
        #expect(try parse(#""\ud800\ud800\udc00""#) == .string("\u{FFFD}\u{10000}"))
        #expect(try parse(#""a\ud83d""#) == .string("a\u{FFFD}"))
    }

    @Test(arguments: malformed)
    func rejectsMalformedInput(_ text: String) {
        #expect(throws: JSONReadError.self) { try parse(text) }
    }

    @Test func rejectsInvalidUTF8AndDeepNesting() {
        #expect(throws: JSONReadError.self) { try JSONReader.parse(Data([0x22, 0xC3, 0x28, 0x22])) }
        #expect(throws: JSONReadError.self) { try JSONReader.parse(Data([0x22, 0xFF, 0x22])) }
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        #expect(throws: JSONReadError.self) { try parse(deep) }
        let fine = String(repeating: "[", count: JSONReader.maxDepth) + String(repeating: "]", count: JSONReader.maxDepth)
        #expect((try? parse(fine)) != nil)
    }

    /// The model readers must decode what the writers wrote exactly as JSONDecoder does.
    @Test func modelReadersAgreeWithJSONDecoder() throws {
        let full = JSONWriterTests.events[1]
        for r in JSONWriterTests.records {
            let data = r.jsonData()
            #expect(try DispatchRecord(jsonData: data) == r)
            #expect(try DispatchRecord(jsonData: data) == JSONDecoder().decode(DispatchRecord.self, from: data))
            let parked = ParkedDispatch(
                record: r, project: full.project!, target: full.target!, attempt: 2, everDelivered: true, lastSeq: 6,
                stepReached: 2, retryAt: r.invalid ? nil : "2026-11-29T10:00:01.500Z")
            #expect(try ParkedDispatch(jsonData: parked.jsonData()) == parked)
        }
        let task = AgentTask(
            dispatchId: "d-9", attempt: 3, input: JSONWriterTests.awkwardText, project: full.project!, target: full.target!,
            user: nil, threadId: "t/1", deadline: full.expiresAt)
        #expect(try AgentTask(jsonData: task.jsonData()) == task)
        // JSONSerialization's escapes (\/ and \u) decode to the same task.
        let other = try JSONSerialization.data(withJSONObject: [
            "dispatchId": "d-9", "attempt": 3, "input": JSONWriterTests.awkwardText, "threadId": "t/1", "user": NSNull(),
            "project": ["id": "yemaya", "name": "Yemaya", "glyph": "🌊", "accent": "#0A84FF"],
            "target": ["id": "board-prep", "name": "Board Prep"], "deadline": full.expiresAt,
        ])
        #expect(try AgentTask(jsonData: other) == task)
    }

    @Test func modelReadersRejectWrongTypes() {
        let bad = [
            #"{"dispatchId":"d","attempt":"1","input":"","project":{"id":"p","name":"P","glyph":"g"},"target":{"id":"t","name":"T"},"deadline":"x"}"#,
            #"{"dispatchId":"d","attempt":1.5,"input":"","project":{"id":"p","name":"P","glyph":"g"},"target":{"id":"t","name":"T"},"deadline":"x"}"#,
            #"{"dispatchId":"d","attempt":1,"input":"","project":{"id":"p","name":"P","glyph":"g"},"target":"t","deadline":"x"}"#,
            #"{"dispatchId":"d","attempt":1,"input":"","project":{"id":"p","name":"P","glyph":"g"},"target":{"id":"t","name":"T"}}"#,
            #"[]"#,
        ]
        for text in bad {
            #expect(throws: (any Error).self) { try AgentTask(jsonData: Data(text.utf8)) }
            #expect(throws: (any Error).self) { try JSONDecoder().decode(AgentTask.self, from: Data(text.utf8)) }
        }
    }
}
