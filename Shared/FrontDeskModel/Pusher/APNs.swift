import Foundation

/// A Live Activity's push token for a dispatch (`dispatch.activity`).
public struct PushRegistration: Sendable, Equatable, Codable {
    public enum Environment: String, Sendable, Codable { case production, sandbox }

    public var id: String
    /// Lower-case hex.
    public var pushToken: String
    public var environment: Environment

    public init(id: String, pushToken: String, environment: Environment) {
        self.id = id
        self.pushToken = pushToken
        self.environment = environment
    }

    /// Reads a `dispatch.activity` body; a malformed one gets its dead-letter code and reason.
    public static func parse(type: String?, body: Data) -> Result<PushRegistration, Rejection> {
        if body.count > IntakeClassifier.maxBodyBytes {
            return .failure(.init(code: .tooLarge, reason: "the body is \(body.count) bytes; the limit is \(IntakeClassifier.maxBodyBytes)"))
        }
        if let type, !MessageVersion.isV1(type) {
            return .failure(.init(code: .unsupportedVersion, reason: "message type '\(type.prefix(100))' is not a .v1 type"))
        }
        guard String(data: body, encoding: .utf8) != nil, let parsed = try? JSONSerialization.jsonObject(with: body, options: .fragmentsAllowed) else {
            return .failure(.init(code: .invalidJSON, reason: "the body is not valid UTF-8 JSON"))
        }
        guard let o = parsed as? [String: Any] else {
            return .failure(.init(code: .invalidRequest, reason: "the body is JSON but not an object"))
        }
        guard let id = o["id"] as? String, Identifiers.isValidDispatchID(id) else {
            return .failure(.init(code: .invalidRequest, reason: "'id' must be 1–128 of [A-Za-z0-9._:-]"))
        }
        guard let token = o["pushToken"] as? String, (2...512).contains(token.utf8.count), token.utf8.count % 2 == 0,
            token.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) || (65...70).contains($0) })
        else {
            return .failure(.init(code: .invalidRequest, reason: "'pushToken' must be an even number (2–512) of hex digits"))
        }
        let environmentText = o["environment"] == nil ? "production" : o["environment"] as? String
        guard let environmentText, let environment = Environment(rawValue: environmentText) else {
            return .failure(.init(code: .invalidRequest, reason: "'environment' must be production or sandbox"))
        }
        return .success(PushRegistration(id: id, pushToken: token.lowercased(), environment: environment))
    }

    public struct Rejection: Error, Sendable, Equatable {
        public var code: DeadLetterCode
        public var reason: String
    }
}

/// The APNs side: where a push goes and with which headers (CONTRACT.md,
/// Live Activity pushes), and the provider token (JWT, ES256).
public enum APNs {
    public static let productionURL = "https://api.push.apple.com"
    public static let sandboxURL = "https://api.sandbox.push.apple.com"

    public static func url(base: String?, environment: PushRegistration.Environment, token: String) -> String {
        let host = base ?? (environment == .production ? productionURL : sandboxURL)
        return (host.hasSuffix("/") ? String(host.dropLast()) : host) + "/3/device/" + token
    }

    /// The request's header lines.
    public static func headers(bearer: String, bundleID: String, priority: Int, expiration: Int?) -> [String] {
        var lines = [
            "apns-push-type: liveactivity",
            "apns-topic: \(bundleID).push-type.liveactivity",
            "apns-priority: \(priority)",
            "authorization: bearer \(bearer)",
            "content-type: application/json",
        ]
        if let expiration { lines.append("apns-expiration: \(expiration)") }
        return lines
    }

    /// The reasons APNs documents for an error answer: what the rejected
    /// pushes are counted by. Anything else (a stand-in's, or a peer's that
    /// says a new thing each time) counts as "other", so the series stay few.
    public static let documentedReasons: Set<String> = [
        "BadCollapseId", "BadDeviceToken", "BadExpirationDate", "BadMessageId", "BadPriority", "BadTopic",
        "DeviceTokenNotForTopic", "DuplicateHeaders", "IdleTimeout", "InvalidPushType", "MissingDeviceToken",
        "MissingTopic", "PayloadEmpty", "TopicDisallowed", "BadCertificate", "BadCertificateEnvironment",
        "ExpiredProviderToken", "Forbidden", "InvalidProviderToken", "MissingProviderToken", "UnrelatedKeyIdInToken",
        "BadPath", "MethodNotAllowed", "ExpiredToken", "Unregistered", "PayloadTooLarge", "TooManyProviderTokenUpdates",
        "TooManyRequests", "InternalServerError", "ServiceUnavailable", "Shutdown",
    ]

    /// The label a rejected push is counted under.
    public static func reasonLabel(_ reason: String?) -> String {
        guard let reason else { return "unknown" }
        return documentedReasons.contains(reason) ? reason : "other"
    }

    /// The most of APNs' reason a log line shows.
    public static let maxReasonBytes = 200

    /// The longest start of `text` of at most `bytes` UTF-8 bytes that ends
    /// on a whole character's scalar (a cut through a scalar would end in U+FFFD).
    public static func wholeScalars(_ text: String, upTo bytes: Int) -> String {
        let utf8 = text.utf8
        guard utf8.count > bytes else { return text }
        var end = utf8.index(utf8.startIndex, offsetBy: max(0, bytes))
        // Back off the continuation bytes (10xxxxxx) of a scalar the cut goes through.
        while end > utf8.startIndex, utf8[end] & 0xC0 == 0x80 { end = utf8.index(before: end) }
        return String(utf8[..<end]) ?? ""
    }

    /// APNs' answer: the outcome for the scheduler, and the reason it gave
    /// (at most `maxReasonBytes` of it, for the logs).
    /// `tokenAge`: how old the provider token the push carried was;
    /// `retryAfter`: the seconds of the answer's `Retry-After`, which a 429
    /// or 5xx waits at least (up to the scheduler's longest back-off).
    public static func outcome(status: Int, body: Data?, tokenAge: TimeInterval = 0, retryAfter: TimeInterval? = nil)
        -> (PushScheduler.Outcome, String?)
    {
        let reason = (body.flatMap { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] }?["reason"] as? String)
            .map { $0.utf8.count > maxReasonBytes ? wholeScalars($0, upTo: maxReasonBytes) : $0 }
        switch status {
        case 200: return (.delivered, nil)
        case 410: return (.gone, reason ?? "Unregistered")
        // A token kept too long: renewed (`ProviderTokenCache.expired`), then the push is tried again. A young
        // one called expired means a clock off or a key APNs does not take: a new token would fare no better,
        // so the push is refused like any other 403 rather than retried for ever.
        case 403 where reason == "ExpiredProviderToken" && tokenAge >= ProviderTokenCache.minimumAge: return (.retry(after: nil), reason)
        case 429, 500...599: return (.retry(after: retryAfter.flatMap { $0.isFinite && $0 > 0 ? $0 : nil }), reason)
        case 0: return (.retry(after: nil), reason)
        default: return (.rejected, reason)
        }
    }

    static func base64url(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// A provider token: `{"alg":"ES256","kid"}.{"iss","iat"}.signature`;
    /// `sign` gives the raw 64-byte ES256 signature of its input.
    public static func providerToken(keyID: String, teamID: String, issuedAt: Date, sign: (Data) -> Data?) -> String? {
        let header = base64url((try? JSONSerialization.data(withJSONObject: ["alg": "ES256", "kid": keyID], options: [.sortedKeys])) ?? Data())
        let claims = base64url(
            (try? JSONSerialization.data(withJSONObject: ["iss": teamID, "iat": Int(issuedAt.timeIntervalSince1970)], options: [.sortedKeys]))
                ?? Data())
        let signingInput = header + "." + claims
        guard let signature = sign(Data(signingInput.utf8)), signature.count == 64 else { return nil }
        return signingInput + "." + base64url(signature)
    }
}

/// The provider token in use: made once, renewed after `renewAfter` (APNs
/// refuses one older than an hour, and answers 429 to one renewed more often
/// than every 20 minutes), or at once after APNs said it expired.
public struct ProviderTokenCache: Sendable {
    public static let renewAfter: TimeInterval = 50 * 60
    /// APNs answers 429 TooManyProviderTokenUpdates to tokens renewed more often than every 20 minutes.
    public static let minimumAge: TimeInterval = 20 * 60

    public private(set) var token: String?
    public private(set) var issuedAt: Date = .distantPast

    public init() {}

    /// The token to use at `now`, made again with `make` when due.
    public mutating func current(now: Date, make: (Date) -> String?) -> String? {
        if token == nil || now.timeIntervalSince(issuedAt) >= Self.renewAfter || now < issuedAt {
            if let fresh = make(now) {
                token = fresh
                issuedAt = now
            }
        }
        return token
    }

    /// APNs answered ExpiredProviderToken to the token issued at `issuedAt`: renewed on the next use, if it is
    /// still the one kept (another push may have renewed it already) and old enough (`minimumAge`) that a new
    /// one can help.
    public mutating func expired(issuedAt expiredAt: Date, now: Date) {
        guard token != nil, issuedAt == expiredAt, now.timeIntervalSince(issuedAt) >= Self.minimumAge else { return }
        token = nil
    }
}
