import Foundation

/// A parsed JSON value (RFC 8259). Numbers are doubles: the bodies read
/// with it hold small integers (seq, attempt) and confidences.
public enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])
}

public struct JSONReadError: Error, Equatable, CustomStringConvertible {
    public let message: String
    public let offset: Int
    public var description: String { "invalid JSON at byte \(offset): \(message)" }
}

/// A small strict JSON parser for the hot paths (hand-offs, parked
/// dispatches, agent tasks), where JSONDecoder's generic machinery was the
/// largest single cost per dispatch. Strict like JSONDecoder: UTF-8 only,
/// no trailing commas, no leading zeros, nothing after the value (a lone
/// surrogate escape reads as U+FFFD); nesting deeper than `maxDepth` is an
/// error, not a crash.
public struct JSONReader {
    public static let maxDepth = 64

    private let bytes: [UInt8]
    private let depthLimit: Int
    /// A number beyond a double's range reads as ±infinity instead of an
    /// error: RFC 8259's grammar allows it, and in an unknown field of a
    /// message it must change nothing. Known fields range-check every number.
    private let overflowIsInfinite: Bool
    private var i = 0

    private init(_ bytes: [UInt8], start: Int = 0, depthLimit: Int, overflowIsInfinite: Bool = false) {
        self.bytes = bytes
        self.depthLimit = depthLimit
        self.overflowIsInfinite = overflowIsInfinite
        i = start
    }

    /// How deep unknown fields of a message from outside may nest
    /// (JSONSerialization's limit, which read those messages before).
    public static let messageMaxDepth = 512

    /// A message from outside (a request, an agent's reply): a leading UTF-8
    /// byte order mark is skipped (RFC 8259 allows it; error offsets still
    /// count it), unknown fields, which are ignored, may nest to
    /// `messageMaxDepth` objects and arrays, and a number beyond a double's
    /// range reads as ±infinity, which no known field accepts.
    public static func parseMessage(_ data: Data) throws -> JSONValue {
        let bytes = Array(data)
        let bom = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
        var reader = JSONReader(bytes, start: bom, depthLimit: messageMaxDepth, overflowIsInfinite: true)
        return try reader.whole()
    }

    public static func parse(_ data: Data, maxDepth: Int = maxDepth) throws -> JSONValue {
        var reader = JSONReader(Array(data), depthLimit: maxDepth)
        return try reader.whole()
    }

    /// The one value the bytes hold, with nothing but white space around it.
    private mutating func whole() throws -> JSONValue {
        skipSpace()
        let value = try value(depth: 0)
        skipSpace()
        guard i == bytes.count else { throw error("unexpected data after the value") }
        return value
    }

    private func error(_ message: String) -> JSONReadError { JSONReadError(message: message, offset: i) }

    private mutating func skipSpace() {
        while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
    }

    /// `depth`: the objects and arrays around this value (JSONSerialization's count).
    private mutating func value(depth: Int) throws -> JSONValue {
        guard i < bytes.count else { throw error("unexpected end") }
        switch bytes[i] {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        default: return .number(try number())
        }
    }

    private mutating func literal(_ word: StaticString) throws {
        let n = word.utf8CodeUnitCount
        guard i + n <= bytes.count, word.withUTF8Buffer({ $0.elementsEqual(bytes[i..<(i + n)]) }) else {
            throw error("unknown literal")
        }
        i += n
    }

    private mutating func object(depth: Int) throws -> JSONValue {
        guard depth < depthLimit else { throw error("nested deeper than \(depthLimit)") }
        i += 1
        var fields: [String: JSONValue] = [:]
        skipSpace()
        if i < bytes.count, bytes[i] == UInt8(ascii: "}") {
            i += 1
            return .object(fields)
        }
        while true {
            skipSpace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw error("expected a key") }
            let key = try string()
            skipSpace()
            guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw error("expected ':'") }
            i += 1
            skipSpace()
            fields[key] = try value(depth: depth + 1)
            skipSpace()
            guard i < bytes.count else { throw error("unexpected end") }
            if bytes[i] == UInt8(ascii: ",") {
                i += 1
            } else if bytes[i] == UInt8(ascii: "}") {
                i += 1
                return .object(fields)
            } else {
                throw error("expected ',' or '}'")
            }
        }
    }

    private mutating func array(depth: Int) throws -> JSONValue {
        guard depth < depthLimit else { throw error("nested deeper than \(depthLimit)") }
        i += 1
        var items: [JSONValue] = []
        skipSpace()
        if i < bytes.count, bytes[i] == UInt8(ascii: "]") {
            i += 1
            return .array(items)
        }
        while true {
            skipSpace()
            items.append(try value(depth: depth + 1))
            skipSpace()
            guard i < bytes.count else { throw error("unexpected end") }
            if bytes[i] == UInt8(ascii: ",") {
                i += 1
            } else if bytes[i] == UInt8(ascii: "]") {
                i += 1
                return .array(items)
            } else {
                throw error("expected ',' or ']'")
            }
        }
    }

    private mutating func string() throws -> String {
        i += 1
        let start = i
        // Fast path: no escapes.
        while i < bytes.count, bytes[i] != UInt8(ascii: "\""), bytes[i] != UInt8(ascii: "\\") {
            guard bytes[i] >= 0x20 else { throw error("control character in a string") }
            i += 1
        }
        guard i < bytes.count else { throw error("unterminated string") }
        if bytes[i] == UInt8(ascii: "\"") {
            i += 1
            return try validated(bytes[start..<(i - 1)])
        }
        var buffer = Array(bytes[start..<i])
        while true {
            guard i < bytes.count else { throw error("unterminated string") }
            let b = bytes[i]
            if b == UInt8(ascii: "\"") {
                i += 1
                return try validated(buffer[...])
            }
            guard b >= 0x20 else { throw error("control character in a string") }
            guard b == UInt8(ascii: "\\") else {
                buffer.append(b)
                i += 1
                continue
            }
            i += 1
            guard i < bytes.count else { throw error("unterminated escape") }
            let e = bytes[i]
            i += 1
            switch e {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): buffer.append(e)
            case UInt8(ascii: "b"): buffer.append(0x08)
            case UInt8(ascii: "f"): buffer.append(0x0C)
            case UInt8(ascii: "n"): buffer.append(0x0A)
            case UInt8(ascii: "r"): buffer.append(0x0D)
            case UInt8(ascii: "t"): buffer.append(0x09)
            case UInt8(ascii: "u"): buffer.append(contentsOf: try unicodeEscape())
            default: throw error("unknown escape")
            }
        }
    }

    private func validated(_ utf8: ArraySlice<UInt8>) throws -> String {
        // ASCII is valid UTF-8 as it is: most keys and values are, and
        // `String(validating:)` runs unspecialised, with metadata look-ups.
        if utf8.allSatisfy({ $0 < 0x80 }) { return String(decoding: utf8, as: UTF8.self) }
        guard let s = String(validating: utf8, as: UTF8.self) else { throw error("invalid UTF-8") }
        return s
    }

    /// After `\u`: four hex digits, and for a high surrogate the `\uXXXX` of
    /// its low half. A lone half is valid JSON (RFC 8259 allows it) but no
    /// Unicode: it reads as U+FFFD, as most readers do (Python's writes
    /// them), rather than failing the whole message.
    private mutating func unicodeEscape() throws -> [UInt8] {
        var value = try hex4()
        if (0xD800..<0xDC00).contains(value) {
            let mark = i
            if i + 1 < bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") {
                i += 2
                let low = try hex4()
                if (0xDC00..<0xE000).contains(low) {
                    value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                } else {
                    i = mark  // another escape: read on its own
                    value = 0xFFFD
                }
            } else {
                value = 0xFFFD
            }
        } else if (0xDC00..<0xE000).contains(value) {
            value = 0xFFFD
        }
        guard let scalar = Unicode.Scalar(value) else { throw error("invalid code point") }
        return Array(String(Character(scalar)).utf8)
    }

    private mutating func hex4() throws -> UInt32 {
        guard i + 4 <= bytes.count else { throw error("short \\u escape") }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let b = bytes[i]
            let digit: UInt8
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = b - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = b - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = b - UInt8(ascii: "A") + 10
            default: throw error("bad hex digit")
            }
            v = v << 4 | UInt32(digit)
            i += 1
        }
        return v
    }

    /// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    private mutating func number() throws -> Double {
        let start = i
        func digits() -> Int {
            let from = i
            while i < bytes.count, bytes[i] >= UInt8(ascii: "0"), bytes[i] <= UInt8(ascii: "9") { i += 1 }
            return i - from
        }
        let negative = i < bytes.count && bytes[i] == UInt8(ascii: "-")
        if negative { i += 1 }
        guard i < bytes.count, bytes[i] >= UInt8(ascii: "0"), bytes[i] <= UInt8(ascii: "9") else { throw error("unexpected character") }
        let integerStart = i
        if bytes[i] == UInt8(ascii: "0") {
            i += 1
        } else {
            _ = digits()
        }
        // An integer of up to 15 digits (exact in a double, no overflow in
        // an Int) without a string and strtod: seq, attempt, etaMs, and a
        // body of 64 KiB of small numbers costs a third as much to read.
        if i - integerStart <= 15, i == bytes.count || !Self.continuesNumber(bytes[i]) {
            var v = 0
            for b in bytes[integerStart..<i] { v = v * 10 + Int(b - UInt8(ascii: "0")) }
            return negative ? (v == 0 ? -0.0 : -Double(v)) : Double(v)
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            i += 1
            guard digits() > 0 else { throw error("digits expected after '.'") }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard digits() > 0 else { throw error("digits expected in the exponent") }
        }
        guard let value = Double(String(decoding: bytes[start..<i], as: UTF8.self)), value.isFinite || overflowIsInfinite else {
            throw error("number out of range")
        }
        return value
    }

    /// A byte that makes the number go on past its integer part.
    private static func continuesNumber(_ b: UInt8) -> Bool {
        b == UInt8(ascii: ".") || b == UInt8(ascii: "e") || b == UInt8(ascii: "E")
    }
}

extension JSONValue {
    /// The string, or nil for any other value.
    public var stringValue: String? {
        if case .string(let s) = self { s } else { nil }
    }
}

/// Typed access to a JSON object's fields, with JSONDecoder's rules: a
/// missing or null optional field is nil; a present field of the wrong type
/// is an error.
public struct JSONFields {
    public let fields: [String: JSONValue]

    public init(_ value: JSONValue) throws {
        guard case .object(let fields) = value else { throw JSONReadError(message: "expected an object", offset: 0) }
        self.fields = fields
    }

    public init(_ data: Data) throws { try self.init(try JSONReader.parse(data)) }

    private func mismatch(_ key: String, _ type: String) -> JSONReadError {
        JSONReadError(message: "\"\(key)\" is not \(type)", offset: 0)
    }

    private func present(_ key: String) -> JSONValue? {
        guard let v = fields[key], v != .null else { return nil }
        return v
    }

    public func string(_ key: String) throws -> String {
        guard let v = try optionalString(key) else { throw mismatch(key, "a string") }
        return v
    }

    public func optionalString(_ key: String) throws -> String? {
        guard let v = present(key) else { return nil }
        guard case .string(let s) = v else { throw mismatch(key, "a string") }
        return s
    }

    public func int(_ key: String) throws -> Int {
        guard let v = try optionalInt(key) else { throw mismatch(key, "an integer") }
        return v
    }

    public func optionalInt(_ key: String) throws -> Int? {
        guard let v = present(key) else { return nil }
        guard case .number(let d) = v, let n = Int(exactly: d) else { throw mismatch(key, "an integer") }
        return n
    }

    /// An integer within `range`: values read from outside are range-checked before any arithmetic.
    public func int(_ key: String, in range: ClosedRange<Int>) throws -> Int {
        let n = try int(key)
        guard range.contains(n) else { throw JSONReadError(message: "\"\(key)\" is out of range", offset: 0) }
        return n
    }

    public func double(_ key: String) throws -> Double {
        guard case .number(let d)? = present(key) else { throw mismatch(key, "a number") }
        return d
    }

    public func bool(_ key: String) throws -> Bool {
        guard case .bool(let b)? = present(key) else { throw mismatch(key, "a boolean") }
        return b
    }

    public func object(_ key: String) throws -> JSONFields {
        guard let v = try optionalObject(key) else { throw mismatch(key, "an object") }
        return v
    }

    public func optionalObject(_ key: String) throws -> JSONFields? {
        guard let v = present(key) else { return nil }
        return try JSONFields(v)
    }

    public func array(_ key: String) throws -> [JSONValue] {
        guard case .array(let a)? = present(key) else { throw mismatch(key, "an array") }
        return a
    }
}
