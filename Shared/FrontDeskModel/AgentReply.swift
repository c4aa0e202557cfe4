import Foundation

/// A reply from an agent (CONTRACT.md, Agent protocol), validated.
public struct AgentReply: Sendable, Equatable {
    public enum Kind: String, Sendable { case accepted, progress, final, error }

    public var dispatchId: String
    public var attempt: Int
    public var kind: Kind
    /// The whole reply so far, not a delta.
    public var text: String?
    public var activity: String?
    public var etaMs: Int?
    public var error: StatusEvent.ErrorInfo?
    public var retryable: Bool

    public init(
        dispatchId: String, attempt: Int, kind: Kind, text: String? = nil, activity: String? = nil,
        etaMs: Int? = nil, error: StatusEvent.ErrorInfo? = nil, retryable: Bool = false
    ) {
        self.dispatchId = dispatchId
        self.attempt = attempt
        self.kind = kind
        self.text = text
        self.activity = activity
        self.etaMs = etaMs
        self.error = error
        self.retryable = retryable
    }

    /// The reply as an agent sends it (what `classify` reads back).
    public func jsonData() -> Data {
        JSONWriter.object { json in
            json.field("dispatchId", dispatchId)
            json.field("attempt", attempt)
            json.field("kind", kind.rawValue)
            json.field("text", text)
            json.field("activity", activity)
            json.field("etaMs", etaMs)
            error?.write("error", to: &json)
            json.field("retryable", retryable)
        }
    }

    /// Why a body is no reply: the dead-letter code and one readable sentence.
    public struct Rejection: Error, Sendable, Equatable {
        public var code: DeadLetterCode
        public var reason: String
    }

    /// Parses a reply body; nil for anything that is not one.
    public static func parse(_ body: Data) -> AgentReply? { try? classify(body).get() }

    /// The largest reply body read: a reply is shown on a phone, and the
    /// whole text rides in every event of the dispatch.
    public static let maxBodyBytes = 256 * 1024
    /// Attempts past this are no attempt the sender makes.
    static let maxAttempt = 1_000_000
    /// An ETA past a day is no honest ETA; it is dropped, not shown.
    static let maxEtaMs = 86_400_000

    /// Parses a reply message by its AMQP `type` and body, or says why it is
    /// none: like every message the services consume, a `type` that is set
    /// must end in `.v1`.
    public static func classify(type: String?, body: Data) -> Result<AgentReply, Rejection> {
        if let type, !MessageVersion.isV1(type) {
            return .failure(Rejection(code: .unsupportedVersion, reason: "reply type '\(type.prefix(100))' is not a .v1 type"))
        }
        return classify(body)
    }

    /// An integer JSON number within `range`, else nil (never traps: a
    /// number too large for Int, or a fraction, is simply no such integer).
    private static func integer(_ value: JSONValue?, in range: ClosedRange<Int>) -> Int? {
        guard case .number(let d)? = value, d.rounded() == d, d >= Double(range.lowerBound), d <= Double(range.upperBound)
        else { return nil }
        return Int(d)
    }

    /// Parses a reply body, or says why it is none. With the project's own
    /// strict reader (`JSONReader.parseMessage`): this runs for every reply,
    /// and Foundation's JSONSerialization was most of its cost. Optional
    /// fields of the wrong type are ignored.
    public static func classify(_ body: Data) -> Result<AgentReply, Rejection> {
        if body.count > maxBodyBytes {
            return .failure(Rejection(code: .tooLarge, reason: "the reply is \(body.count) bytes; the limit is \(maxBodyBytes)"))
        }
        return read(body)
    }

    /// The largest reply over the limit still read for its dispatch and attempt
    /// (a parse of about 40 ms here, in the loop that handles every reply).
    static let maxOverLimitBytes = 1 << 20

    /// A reply over `maxBodyBytes` (dead-lettered `too_large`), read for whose
    /// it is: as an error of its attempt, so that the dispatch fails now with
    /// the reason rather than at the reply timeout (the agent's next attempt
    /// would write the same text); retryable only when it is an error the
    /// agent called retryable. Nil within the limit, far over it
    /// (`maxOverLimitBytes`), or when it names no dispatch and attempt.
    public static func overLimit(_ body: Data) -> AgentReply? {
        guard body.count > maxBodyBytes, body.count <= maxOverLimitBytes, case .success(let reply) = read(body) else { return nil }
        let message = "the agent's reply is \(body.count) bytes, over the limit of \(maxBodyBytes)"
        return AgentReply(
            dispatchId: reply.dispatchId, attempt: reply.attempt, kind: .error, text: nil, activity: nil, etaMs: nil,
            error: .init(code: "reply_too_large", message: message), retryable: reply.kind == .error && reply.retryable)
    }

    private static func read(_ body: Data) -> Result<AgentReply, Rejection> {
        func invalid(_ reason: String) -> Result<AgentReply, Rejection> { .failure(Rejection(code: .invalidRequest, reason: reason)) }
        let parsed: JSONValue
        do {
            parsed = try JSONReader.parseMessage(body)
        } catch {
            return .failure(Rejection(code: .invalidJSON, reason: "the reply is not JSON: \(error)"))
        }
        guard case .object(let o) = parsed else {
            return .failure(Rejection(code: .invalidRequest, reason: "the reply is JSON but not an object"))
        }
        guard let id = o["dispatchId"]?.stringValue, Identifiers.isValidDispatchID(id) else {
            return invalid("the reply has no valid dispatchId (1–128 of A–Z a–z 0–9 . _ : -)")
        }
        guard let attempt = integer(o["attempt"], in: 1...maxAttempt) else {
            return invalid("the reply's attempt must be a number from 1")
        }
        guard let kindText = o["kind"]?.stringValue, let kind = Kind(rawValue: kindText) else {
            return invalid("the reply's kind must be accepted, progress, final or error")
        }
        var error: StatusEvent.ErrorInfo? = nil
        if case .object(let e)? = o["error"] {
            error = .init(
                code: line(e["code"]?.stringValue ?? "agent_error", max: maxErrorCode),
                message: line(e["message"]?.stringValue ?? "", max: maxErrorMessage))
        }
        var retryable = false
        if case .bool(let b)? = o["retryable"] { retryable = b }
        return .success(AgentReply(
            dispatchId: id, attempt: attempt, kind: kind, text: o["text"]?.stringValue,
            activity: o["activity"]?.stringValue.map { line($0, max: maxActivity) }.flatMap { $0.allSatisfy(\.isWhitespace) ? nil : $0 },
            etaMs: integer(o["etaMs"], in: 0...maxEtaMs), error: error, retryable: retryable))
    }

    /// An agent's `activity` is "a short human line" (CONTRACT) copied into
    /// every later `sending` event; its error code and message go into the
    /// `failed` one. Each is kept to one line of at most this many characters.
    static let maxActivity = 200
    static let maxErrorCode = 64
    static let maxErrorMessage = 500

    /// `text` as one line: line breaks and other control characters become
    /// spaces, and past `max` characters, or 4 × `max` bytes of UTF-8 (one
    /// character may carry any number of combining marks), it is cut, ending
    /// in "…" (within both limits, so that reading it again changes nothing).
    static func line(_ text: String, max: Int) -> String {
        let maxBytes = 4 * max
        var out = ""
        var count = 0, bytes = 0
        for c in text {
            let breaks = c.unicodeScalars.contains {
                [.control, .lineSeparator, .paragraphSeparator].contains($0.properties.generalCategory)
            }
            let next: Character = breaks ? " " : c
            let size = next.utf8.count
            if count < max, bytes + size <= maxBytes {
                out.append(next)
                count += 1
                bytes += size
                continue
            }
            // Cut: "…" (one character, 3 bytes) takes the place of what does not fit with it.
            var scalars = Array(out.unicodeScalars)
            var kept = bytes
            if count >= max, let last = out.last {
                kept -= last.utf8.count
                scalars.removeLast(last.unicodeScalars.count)
            }
            while kept > maxBytes - 3, let scalar = scalars.popLast() { kept -= scalar.utf8.count }
            return String(String.UnicodeScalarView(scalars)) + "…"
        }
        return out
    }

    /// The last ≤ 3 non-empty lines of a reply, for the preview.
    /// Read from the end, one scalar at a time: a long reply costs what its
    /// last lines cost. Lines end at any Unicode newline; the spaces trimmed
    /// are those of `CharacterSet.whitespaces` (tab and the Zs category).
    public static func preview(of text: String) -> [String] {
        let scalars = text.unicodeScalars
        var lines: [String] = []
        func keep(_ line: Substring.UnicodeScalarView) {
            guard let first = line.firstIndex(where: { !isSpace($0) }), let last = line.lastIndex(where: { !isSpace($0) })
            else { return }
            lines.append(String(Substring(line[first...last])))
        }
        var end = scalars.endIndex, i = end
        while i > scalars.startIndex, lines.count < 3 {
            let before = scalars.index(before: i)
            if isNewline(scalars[before]) {
                keep(scalars[i..<end])
                end = before
            }
            i = before
        }
        if lines.count < 3 { keep(scalars[scalars.startIndex..<end]) }
        return lines.reversed()
    }

    private static func isNewline(_ s: Unicode.Scalar) -> Bool {
        switch s.value {
        case 0x0A...0x0D, 0x85, 0x2028, 0x2029: true
        default: false
        }
    }

    private static func isSpace(_ s: Unicode.Scalar) -> Bool {
        s == "\t" || s.properties.generalCategory == .spaceSeparator
    }
}
