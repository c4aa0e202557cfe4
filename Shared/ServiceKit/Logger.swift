import AMQP
import Foundation
import FrontDeskModel
import Synchronization

public enum LogLevel: String, Sendable, Comparable, CaseIterable {
    case debug, info, warning, error

    var rank: Int { Self.allCases.firstIndex(of: self)! }
    public static func < (a: LogLevel, b: LogLevel) -> Bool { a.rank < b.rank }
}

/// A value in a log line.
public enum LogValue: Sendable, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral, ExpressibleByBooleanLiteral {
    case string(String)
    case int(Int)
    case double(Double)
    case bool(Bool)

    public init(stringLiteral v: String) { self = .string(v) }
    public init(integerLiteral v: Int) { self = .int(v) }
    public init(floatLiteral v: Double) { self = .double(v) }
    public init(booleanLiteral v: Bool) { self = .bool(v) }
}

/// Writes one JSON object a line: `ts`, `level`, `service`, `msg`, then the
/// fields. Anything shaped like a URL with a password is redacted first.
public struct Logger: Sendable {
    public var service: String
    public var level: LogLevel
    /// Fields added to every line (e.g. a replica id).
    public var metadata: [(String, LogValue)]
    let sink: LogSink

    public init(service: String, level: LogLevel = .info, sink: LogSink = .standardError) {
        self.service = service
        self.level = level
        self.metadata = []
        self.sink = sink
    }

    public func debug(_ message: String, _ fields: [(String, LogValue)] = []) { log(.debug, message, fields) }
    public func info(_ message: String, _ fields: [(String, LogValue)] = []) { log(.info, message, fields) }
    public func warning(_ message: String, _ fields: [(String, LogValue)] = []) { log(.warning, message, fields) }
    public func error(_ message: String, _ fields: [(String, LogValue)] = []) { log(.error, message, fields) }

    public func log(_ level: LogLevel, _ message: String, _ fields: [(String, LogValue)] = []) {
        guard level >= self.level else { return }
        sink.write(Self.line(level: level, service: service, message: message, fields: metadata + fields, at: Date()))
    }

    /// The JSON line, without the newline. Exposed for tests.
    public static func line(level: LogLevel, service: String, message: String, fields: [(String, LogValue)], at date: Date) -> String {
        var out = "{\"ts\":\"\(RFC3339.format(date))\",\"level\":\"\(level.rawValue)\",\"service\":"
        appendJSONString(service, to: &out)
        out += ",\"msg\":"
        appendJSONString(AMQPURL.redactAll(message), to: &out)
        for (key, value) in fields {
            out += ","
            appendJSONString(key, to: &out)
            out += ":"
            switch value {
            case .string(let s): appendJSONString(AMQPURL.redactAll(s), to: &out)
            case .int(let n): out += String(n)
            case .double(let d): out += d.isFinite ? String(d) : "null"
            case .bool(let b): out += b ? "true" : "false"
            }
        }
        out += "}"
        return out
    }

    static func appendJSONString(_ s: String, to out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count) + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

/// Where log lines go: stderr, or a buffer in tests.
public final class LogSink: Sendable {
    private let inMemory: Bool
    private let buffer = Mutex<[String]>([])

    private init(inMemory: Bool) { self.inMemory = inMemory }

    public static let standardError = LogSink(inMemory: false)
    public static func memory() -> LogSink { LogSink(inMemory: true) }

    func write(_ line: String) {
        if inMemory {
            buffer.withLock { $0.append(line) }
        } else {
            // One write(2) a line, so lines from threads never interleave.
            let data = Array((line + "\n").utf8)
            data.withUnsafeBytes { _ = Glibc.write(2, $0.baseAddress, $0.count) }
        }
    }

    public var lines: [String] { buffer.withLock { $0 } }
}

extension AMQPURL {
    /// Redacts the password of every `scheme://user:password@` in a text.
    public static func redactAll(_ text: String) -> String {
        guard text.contains("://") else { return text }
        var out = ""
        var rest = Substring(text)
        while let scheme = rest.range(of: "://") {
            out += rest[..<scheme.upperBound]
            rest = rest[scheme.upperBound...]
            let end = rest.firstIndex(where: { $0 == "/" || $0 == " " || $0 == "?" || $0 == "\"" }) ?? rest.endIndex
            let authority = rest[..<end]
            if let at = authority.lastIndex(of: "@"), let colon = authority[..<at].firstIndex(of: ":") {
                out += authority[..<colon] + ":***" + authority[at...]
            } else {
                out += authority
            }
            rest = rest[end...]
        }
        return out + rest
    }
}
