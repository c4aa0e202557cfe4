import Foundation
import Testing

@testable import FrontDeskModel

/// The hand-written encoders must give exactly JSONEncoder's bytes, so that a
/// re-sent event stays byte-identical whichever path wrote it.
@Suite struct JSONWriterTests {
    static func reference<T: Encodable>(_ value: T) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return try! encoder.encode(value)
    }

    /// Commas at every level, past the 64 the writer keeps as bits too.
    @Test func separatesMembersAtEveryDepth() {
        var json = JSONWriter()
        json.beginObject()
        for level in 0..<70 {
            json.field("a", level)
            json.beginObject("n")
        }
        json.field("z", true)
        for level in (0..<70).reversed() {
            json.endObject()
            json.field("b", level)
        }
        json.endObject()
        let expected = "{" + (0..<70).map { "\"a\":\($0),\"n\":{" }.joined() + "\"z\":true"
            + (0..<70).reversed().map { "},\"b\":\($0)" }.joined() + "}"
        #expect(String(decoding: json.data, as: UTF8.self) == expected)
    }

    static let awkwardText = "Zoë said \"hi\"\\ / \n\t\r\u{08}\u{0C}\u{01}\u{1F} 🎉 — end"

    static let events: [StatusEvent] = {
        var minimal = StatusEvent(
            dispatchId: "d-1", seq: 1, state: .drafted, step: 0, activity: "Drafted",
            startedAt: "2026-11-29T10:00:00Z", at: "2026-11-29T10:00:00Z", elapsedMs: 0,
            expiresAt: "2026-11-29T14:00:00Z")
        var full = minimal
        full.seq = 7
        full.state = .sending
        full.step = 2
        full.activity = awkwardText
        full.input = awkwardText
        full.project = .init(id: "yemaya", name: "Yemaya", glyph: "🌊", accent: "#0A84FF")
        full.target = .init(id: "board-prep", name: "Board Prep")
        full.route = .init(
            confidence: 0.8333333333333334, reason: "keyword \"agm\"",
            alternatives: [.init(project: "acme", target: "ops", confidence: 1), .init(project: "p", target: "t", confidence: 0.05)])
        full.attempt = 2
        full.preview = ["line one", "", awkwardText]
        full.etaMs = 12_000
        full.queue = .init(reason: "retry_wait", retryAt: "2026-11-29T10:00:01.500Z")
        full.reply = awkwardText
        full.error = .init(code: "agent_error", message: awkwardText)
        full.cancel = .init(reason: "user")
        full.threadId = "thread-9"
        var noAccent = full
        noAccent.project?.accent = nil
        noAccent.queue?.retryAt = nil
        noAccent.route?.alternatives = []
        noAccent.route?.confidence = 0
        minimal.preview = []
        return [minimal, full, noAccent]
    }()

    @Test(arguments: events)
    func statusEventMatchesJSONEncoder(_ event: StatusEvent) throws {
        let written = event.jsonData()
        #expect(written == Self.reference(event), "\(String(decoding: written, as: UTF8.self))")
        #expect(try JSONDecoder().decode(StatusEvent.self, from: written) == event)
    }

    static let records: [DispatchRecord] = {
        let full = events[1]
        return [
            DispatchRecord(
                id: "a.b#c*", bodyFingerprint: "cbf29ce484222325", outcome: .routed, input: awkwardText,
                user: "lisa", threadId: "t", project: full.project, target: full.target, route: full.route,
                invalid: false, startedAt: full.startedAt, decidedAt: full.at, expiresAt: full.expiresAt, lastSeq: 2),
            DispatchRecord(
                id: "x", bodyFingerprint: "0", outcome: .failed, error: .init(code: "invalid_request", message: "bad"),
                invalid: true, startedAt: full.startedAt, decidedAt: full.at, expiresAt: full.expiresAt, lastSeq: 1),
        ]
    }()

    /// JSON has no infinity or NaN: such a double is written null, and the bytes stay JSON.
    @Test func nonFiniteNumbersAreWrittenNull() throws {
        let data = JSONWriter.object { w in
            w.field("a", Double.infinity)
            w.field("b", -Double.infinity)
            w.field("c", Double.nan)
            w.field("d", 2.5)
        }
        #expect(String(decoding: data, as: UTF8.self) == #"{"a":null,"b":null,"c":null,"d":2.5}"#)
        #expect(try JSONReader.parse(data) == .object(["a": .null, "b": .null, "c": .null, "d": .number(2.5)]))
    }

    @Test func dispatchRecordMatchesJSONEncoder() throws {
        for record in Self.records {
            let written = record.jsonData()
            #expect(written == Self.reference(record), "\(String(decoding: written, as: UTF8.self))")
            #expect(try JSONDecoder().decode(DispatchRecord.self, from: written) == record)
        }
    }

    @Test func agentTaskAndParkedDispatchMatchJSONEncoder() throws {
        let full = Self.events[1]
        let record = DispatchRecord(
            id: "d-9", bodyFingerprint: "cbf29ce484222325", outcome: .routed, input: Self.awkwardText,
            user: "lisa", threadId: "t/1", project: full.project, target: full.target, route: full.route,
            invalid: false, startedAt: full.startedAt, decidedAt: full.at, expiresAt: full.expiresAt, lastSeq: 2)
        let tasks = [
            AgentTask(
                dispatchId: "d-9", attempt: 3, input: Self.awkwardText, project: full.project!, target: full.target!,
                user: "lisa", threadId: "t/1", deadline: full.expiresAt),
            AgentTask(
                dispatchId: "d-9", attempt: 1, input: "", project: .init(id: "p", name: "P", glyph: "•"),
                target: .init(id: "t", name: "T"), user: nil, threadId: nil, deadline: full.expiresAt),
        ]
        for task in tasks {
            #expect(task.jsonData() == Self.reference(task), "\(String(decoding: task.jsonData(), as: UTF8.self))")
            #expect(try JSONDecoder().decode(AgentTask.self, from: task.jsonData()) == task)
        }
        let parked = [
            ParkedDispatch(
                record: record, project: full.project!, target: full.target!, attempt: 2, everDelivered: true,
                lastSeq: 6, stepReached: 2, retryAt: "2026-11-29T10:00:01.500Z"),
            ParkedDispatch(
                record: record, project: .init(id: "p", name: "P", glyph: "•"), target: .init(id: "t", name: "T"),
                attempt: 1, everDelivered: false, lastSeq: 3, stepReached: 1, retryAt: nil),
        ]
        for p in parked {
            #expect(p.jsonData() == Self.reference(p), "\(String(decoding: p.jsonData(), as: UTF8.self))")
            #expect(try JSONDecoder().decode(ParkedDispatch.self, from: p.jsonData()) == p)
        }
    }

    @Test(arguments: [0.0, 1.0, -3.0, 0.5, 0.1, 0.8333333333333334, 1e-7, 123456.789])
    func doublesMatchJSONEncoder(_ value: Double) {
        var json = JSONWriter()
        json.beginObject()
        json.field("v", value)
        json.endObject()
        #expect(json.data == Self.reference(["v": value]))
    }
}

extension JSONWriterTests {
    /// Escapes at the start, the end, back to back and between runs of plain
    /// text, every control byte, and strings with no escape at all (copied as
    /// one run): each as JSONEncoder writes it.
    @Test(arguments: [
        "", "plain", "\"", "\\", "\"\"", "a\"", "\"a", "a\\\"b", "\n\n\n", "é\u{0}ü", "tail\u{1F}",
        String((0..<0x20).map { Character(Unicode.Scalar(UInt8($0))) }), "🎉\"🎉\\🎉", String(repeating: "x", count: 300),
    ])
    func stringsEscapeAsJSONEncoderDoes(_ text: String) throws {
        var event = Self.events[0]
        event.activity = text
        event.input = text + "/" + text
        #expect(event.jsonData() == Self.reference(event))
        #expect(try JSONDecoder().decode(StatusEvent.self, from: event.jsonData()).activity == text)
    }
}
