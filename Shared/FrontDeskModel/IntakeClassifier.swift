import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The dead-letter codes of CONTRACT.md.
public enum DeadLetterCode: String, Sendable, CaseIterable {
    case invalidJSON = "invalid_json"
    case invalidRequest = "invalid_request"
    case tooLarge = "too_large"
    case unsupportedVersion = "unsupported_version"
    case unknownTarget = "unknown_target"
}

/// A valid dispatch request.
public struct DispatchRequest: Sendable, Equatable {
    public var id: String
    public var input: String
    public var user: String?
    public var threadId: String?
    public var project: String?
    public var target: String?
    public var createdAt: Date?
}

public struct CancelCommand: Sendable, Equatable {
    public var id: String
    public var reason: String
}

public struct RerouteCommand: Sendable, Equatable {
    public var id: String
    public var route: RoutingTable.Route
}

/// The routing keys of `frontdesk.commands` (CONTRACT.md).
public enum CommandKey {
    public static let request = "dispatch.request"
    public static let cancel = "dispatch.cancel"
    public static let reroute = "dispatch.reroute"
    /// A Live Activity's push token: the pusher's, which the router leaves alone.
    public static let activity = "dispatch.activity"
}

/// The version rule of every message type the services read: a `type`
/// that is set must end in `.v1`, compared as bytes (as characters, a
/// prepended mark such as U+0600 would join the dot and hide the suffix).
public enum MessageVersion {
    public static func isV1(_ type: String) -> Bool {
        type.utf8.count >= 3 && type.utf8.suffix(3).elementsEqual(".v1".utf8)
    }
}

/// What one message on `frontdesk.commands` is.
public enum IntakeMessage: Sendable, Equatable {
    case request(DispatchRequest)
    case cancel(CancelCommand)
    case reroute(RerouteCommand)
    /// Another service's message (`dispatch.activity`, the pusher's): the router leaves it alone.
    case notForRouter
    /// Refused: a dead letter with `code` and `reason`. `failedID` is set when
    /// the message is a request whose id can be read: it also gets one
    /// `failed` event. `input` is the request's input when it was a string.
    case reject(code: DeadLetterCode, reason: String, failedID: String?, input: String?)
}

/// Validates messages on `frontdesk.commands`. Pure.
public enum IntakeClassifier {
    public static let maxBodyBytes = 64 * 1024
    public static let maxInputScalars = 4000
    /// A cancel's reason is shown to the user: a line, not a document.
    public static let maxReasonScalars = 500

    public static func classify(routingKey: String, type: String?, body: Data) -> IntakeMessage {
        if routingKey == CommandKey.activity { return .notForRouter }
        if body.count > maxBodyBytes {
            return .reject(code: .tooLarge, reason: "the body is \(body.count) bytes; the limit is \(maxBodyBytes)", failedID: nil, input: nil)
        }
        if let type, !MessageVersion.isV1(type) {
            return .reject(code: .unsupportedVersion, reason: "message type '\(type.prefix(100))' is not a .v1 type", failedID: nil, input: nil)
        }
        guard [CommandKey.request, CommandKey.cancel, CommandKey.reroute].contains(routingKey) else {
            return .reject(
                code: .invalidRequest,
                reason: "routing key '\(routingKey.prefix(100))' is none of dispatch.request, dispatch.cancel, dispatch.reroute",
                failedID: nil, input: nil)
        }
        // The project's strict reader, as for agent replies, so both services
        // take the same JSON (`JSONReader.parseMessage`).
        let parsed: JSONValue
        do {
            parsed = try JSONReader.parseMessage(body)
        } catch {
            // CONTRACT: "A malformed cancel or reroute gets exactly one dead letter (invalid_request)";
            // a request that is no JSON is `invalid_json`.
            let code: DeadLetterCode = routingKey == CommandKey.request ? .invalidJSON : .invalidRequest
            return .reject(code: code, reason: "the body is not valid UTF-8 JSON: \(error)", failedID: nil, input: nil)
        }
        guard case .object(let object) = parsed else {
            return .reject(code: .invalidRequest, reason: "the body is JSON but not an object", failedID: nil, input: nil)
        }
        let rawID = object["id"]
        guard case .string(let id)? = rawID, Identifiers.isValidDispatchID(id) else {
            let why = rawID == nil ? "'id' is missing" : "'id' must be 1–128 of [A-Za-z0-9._:-]"
            return .reject(code: .invalidRequest, reason: why, failedID: nil, input: nil)
        }
        switch routingKey {
        case CommandKey.request: return request(id: id, object)
        case CommandKey.cancel: return cancel(id: id, object)
        default: return reroute(id: id, object)
        }
    }

    private static func optionalString(_ object: [String: JSONValue], _ key: String) -> (String?, String?) {
        guard let value = object[key], value != .null else { return (nil, nil) }
        guard case .string(let s) = value else { return (nil, "'\(key)' must be a string") }
        return (s, nil)
    }

    private static func request(id: String, _ object: [String: JSONValue]) -> IntakeMessage {
        let input = object["input"]?.stringValue
        func reject(_ reason: String) -> IntakeMessage {
            .reject(code: .invalidRequest, reason: reason, failedID: id, input: input)
        }
        guard let input else {
            return reject(object["input"] == nil ? "'input' is missing" : "'input' must be a string")
        }
        let length = input.unicodeScalars.count
        guard (1...maxInputScalars).contains(length) else {
            return reject("'input' must be 1–\(maxInputScalars) characters; it has \(length)")
        }
        var fields: [String: String] = [:]
        for key in ["user", "threadId", "project", "target", "createdAt"] {
            let (value, problem) = optionalString(object, key)
            if let problem { return reject(problem) }
            fields[key] = value
        }
        var createdAt: Date? = nil
        if let text = fields["createdAt"] {
            guard let date = RFC3339.parse(text) else { return reject("'createdAt' must be an RFC 3339 time") }
            createdAt = date
        }
        for key in ["project", "target"] {
            if let hint = fields[key], hint.isEmpty { return reject("'\(key)' must not be empty when given") }
        }
        return .request(DispatchRequest(
            id: id, input: input, user: fields["user"], threadId: fields["threadId"], project: fields["project"],
            target: fields["target"], createdAt: createdAt))
    }

    private static func cancel(id: String, _ object: [String: JSONValue]) -> IntakeMessage {
        let (reason, problem) = optionalString(object, "reason")
        if let problem { return .reject(code: .invalidRequest, reason: problem, failedID: nil, input: nil) }
        // The reason is shown to the user: a longer one is cut, and the cancel still cancels.
        let shown = reason.map { String(String.UnicodeScalarView($0.unicodeScalars.prefix(maxReasonScalars))) }
        return .cancel(CancelCommand(id: id, reason: shown ?? "user"))
    }

    private static func reroute(id: String, _ object: [String: JSONValue]) -> IntakeMessage {
        guard let project = object["project"]?.stringValue, let target = object["target"]?.stringValue else {
            return .reject(code: .invalidRequest, reason: "a reroute needs 'project' and 'target' strings", failedID: nil, input: nil)
        }
        return .reroute(RerouteCommand(id: id, route: .init(project: project, target: target)))
    }
}

/// RFC 3339 times, as the contract writes them. Hand-written: Foundation's
/// ISO8601DateFormatter is costly to create and not Sendable to share.
public enum RFC3339 {
    /// The days of a month of the Gregorian calendar (February 29 in leap years).
    static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: return year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` (`t`/space and `z` accepted);
    /// a day the month does not have, or an offset beyond 23:59, is no time.
    public static func parse(_ text: String) -> Date? {
        let b = Array(text.utf8)
        func digits(_ at: Int, _ n: Int) -> Int? {
            guard at + n <= b.count else { return nil }
            var v = 0
            for i in at..<(at + n) {
                guard b[i] >= 48, b[i] <= 57 else { return nil }
                v = v * 10 + Int(b[i] - 48)
            }
            return v
        }
        guard b.count >= 20, let year = digits(0, 4), b[4] == 45, let month = digits(5, 2), b[7] == 45,
            let day = digits(8, 2), [84, 116, 32].contains(b[10]), let hour = digits(11, 2), b[13] == 58,
            let minute = digits(14, 2), b[16] == 58, let second = digits(17, 2),
            (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day), hour < 24, minute < 60,
            second < 61
        else { return nil }
        var i = 19
        var fraction = 0.0
        if i < b.count, b[i] == 46 {
            i += 1
            var scale = 0.1
            let begin = i
            while i < b.count, b[i] >= 48, b[i] <= 57 {
                fraction += Double(b[i] - 48) * scale
                scale /= 10
                i += 1
            }
            guard i > begin else { return nil }
        }
        guard i < b.count else { return nil }
        var offset = 0
        if b[i] == 90 || b[i] == 122 {
            i += 1
        } else if b[i] == 43 || b[i] == 45, let oh = digits(i + 1, 2), i + 3 < b.count, b[i + 3] == 58, let om = digits(i + 4, 2),
            oh < 24, om < 60
        {
            offset = (oh * 3600 + om * 60) * (b[i] == 45 ? -1 : 1)
            i += 6
        } else {
            return nil
        }
        guard i == b.count else { return nil }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        let seconds = timegm(&parts)
        return Date(timeIntervalSince1970: Double(seconds - offset) + fraction)
    }

    /// The instants `format` writes as themselves: years 0001 to 9999.
    static let formattable: ClosedRange<Double> = -62_135_596_800 ... 253_402_300_799.999

    /// UTC with milliseconds: 2026-05-13T09:41:00.000Z. An instant outside
    /// years 0001–9999 is written as the nearest one inside (NaN as the
    /// epoch): never a trap. One allocation, the string's own (this runs
    /// several times for every dispatch).
    public static func format(_ date: Date) -> String {
        let t = date.timeIntervalSince1970
        let ms = t.isNaN ? 0 : Int64((min(max(t, formattable.lowerBound), formattable.upperBound) * 1000).rounded(.down))
        var seconds = time_t(ms >= 0 ? ms / 1000 : (ms - 999) / 1000)
        let millis = Int32(((ms % 1000) + 1000) % 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(unsafeUninitializedCapacity: 24) { out in
            func put(_ value: Int32, at start: Int, width: Int) {
                var n = value
                for k in stride(from: start + width - 1, through: start, by: -1) {
                    out[k] = UInt8(truncatingIfNeeded: 48 + n % 10)
                    n /= 10
                }
            }
            put(parts.tm_year + 1900, at: 0, width: 4); out[4] = 45
            put(parts.tm_mon + 1, at: 5, width: 2); out[7] = 45
            put(parts.tm_mday, at: 8, width: 2); out[10] = 84
            put(parts.tm_hour, at: 11, width: 2); out[13] = 58
            put(parts.tm_min, at: 14, width: 2); out[16] = 58
            put(parts.tm_sec, at: 17, width: 2); out[19] = 46
            put(millis, at: 20, width: 3); out[23] = 90
            return 24
        }
    }
}
