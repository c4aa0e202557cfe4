import Foundation

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

/// What one message on `frontdesk.commands` is.
public enum IntakeMessage: Sendable, Equatable {
    case request(DispatchRequest)
    case cancel(CancelCommand)
    case reroute(RerouteCommand)
    /// Refused: a dead letter with `code` and `reason`. `failedID` is set when
    /// the message is a request whose id can be read: it also gets one
    /// `failed` event. `input` is the request's input when it was a string.
    case reject(code: DeadLetterCode, reason: String, failedID: String?, input: String?)
}

/// Validates messages on `frontdesk.commands`. Pure.
public enum IntakeClassifier {
    public static let maxBodyBytes = 64 * 1024
    public static let maxInputScalars = 4000

    public static func classify(routingKey: String, type: String?, body: Data) -> IntakeMessage {
        if body.count > maxBodyBytes {
            return .reject(code: .tooLarge, reason: "the body is \(body.count) bytes; the limit is \(maxBodyBytes)", failedID: nil, input: nil)
        }
        if let type, !type.hasSuffix(".v1") {
            return .reject(code: .unsupportedVersion, reason: "message type '\(type.prefix(100))' is not a .v1 type", failedID: nil, input: nil)
        }
        guard ["dispatch.request", "dispatch.cancel", "dispatch.reroute"].contains(routingKey) else {
            return .reject(
                code: .invalidRequest,
                reason: "routing key '\(routingKey.prefix(100))' is none of dispatch.request, dispatch.cancel, dispatch.reroute",
                failedID: nil, input: nil)
        }
        guard String(data: body, encoding: .utf8) != nil,
            let parsed = try? JSONSerialization.jsonObject(with: body, options: [.fragmentsAllowed])
        else {
            return .reject(code: .invalidJSON, reason: "the body is not valid UTF-8 JSON", failedID: nil, input: nil)
        }
        guard let object = parsed as? [String: Any] else {
            return .reject(code: .invalidRequest, reason: "the body is JSON but not an object", failedID: nil, input: nil)
        }
        let rawID = object["id"]
        guard let id = rawID as? String, Identifiers.isValidDispatchID(id) else {
            let why = rawID == nil ? "'id' is missing" : "'id' must be 1–128 of [A-Za-z0-9._:-]"
            return .reject(code: .invalidRequest, reason: why, failedID: nil, input: nil)
        }
        switch routingKey {
        case "dispatch.request": return request(id: id, object)
        case "dispatch.cancel": return cancel(id: id, object)
        default: return reroute(id: id, object)
        }
    }

    private static func optionalString(_ object: [String: Any], _ key: String) -> (String?, String?) {
        guard let value = object[key], !(value is NSNull) else { return (nil, nil) }
        guard let s = value as? String else { return (nil, "'\(key)' must be a string") }
        return (s, nil)
    }

    private static func request(id: String, _ object: [String: Any]) -> IntakeMessage {
        let input = object["input"] as? String
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

    private static func cancel(id: String, _ object: [String: Any]) -> IntakeMessage {
        let (reason, problem) = optionalString(object, "reason")
        if let problem { return .reject(code: .invalidRequest, reason: problem, failedID: nil, input: nil) }
        return .cancel(CancelCommand(id: id, reason: reason ?? "user"))
    }

    private static func reroute(id: String, _ object: [String: Any]) -> IntakeMessage {
        guard let project = object["project"] as? String, let target = object["target"] as? String else {
            return .reject(code: .invalidRequest, reason: "a reroute needs 'project' and 'target' strings", failedID: nil, input: nil)
        }
        return .reroute(RerouteCommand(id: id, route: .init(project: project, target: target)))
    }
}

/// RFC 3339 times, as the contract writes them.
public enum RFC3339 {
    public static func parse(_ text: String) -> Date? {
        let withFraction = ISO8601DateFormatter()
        withFraction.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let d = withFraction.date(from: text) { return d }
        let plain = ISO8601DateFormatter()
        plain.formatOptions = [.withInternetDateTime]
        return plain.date(from: text)
    }

    /// UTC with milliseconds: 2026-05-13T09:41:00.000Z.
    public static func format(_ date: Date) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        f.timeZone = TimeZone(identifier: "UTC")
        return f.string(from: date)
    }
}
