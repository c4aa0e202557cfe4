import Foundation

/// The gateway's HTTP interface (CONTRACT.md, Gateway): which endpoint a
/// request is, and the error answers. Pure.
public enum GatewayEndpoint: Equatable, Sendable {
    case createDispatch
    case latest(id: String)
    case events(id: String)
    case cancel(id: String)
    case reroute(id: String)
    case activity(id: String)
    case targets
    case route
    /// The web page and its files (`/`, `/app.js`, `/app.css`).
    case page(file: String)
    case notFound
    case methodNotAllowed(allowed: String)

    public static let pageFiles = ["index.html", "app.js", "app.css"]

    /// It publishes a command to the broker (the others only read).
    public var publishes: Bool {
        switch self {
        case .createDispatch, .cancel, .reroute, .activity: true
        default: false
        }
    }

    /// `path`: as sent, not decoded. Each segment is decoded on its own, so
    /// an encoded `/` (`%2F`) stays inside its segment and a `%00` is a
    /// character of it, not the end of the path; a malformed escape is no path.
    public static func parse(method: String, path: String) -> GatewayEndpoint {
        func only(_ allowed: String, _ endpoint: GatewayEndpoint) -> GatewayEndpoint {
            method == allowed || (allowed == "GET" && method == "HEAD") ? endpoint : .methodNotAllowed(allowed: allowed)
        }
        var parts: [String] = []
        for segment in path.split(separator: "/", omittingEmptySubsequences: false) {
            guard let decoded = String(segment).removingPercentEncoding else { return .notFound }
            parts.append(decoded)
        }
        // "", then the segments.
        guard parts.count >= 2, parts[0].isEmpty else { return .notFound }
        switch parts.dropFirst() {
        case [""], ["index.html"]: return only("GET", .page(file: "index.html"))
        case ["app.js"]: return only("GET", .page(file: "app.js"))
        case ["app.css"]: return only("GET", .page(file: "app.css"))
        case ["v1", "dispatches"]: return only("POST", .createDispatch)
        case ["v1", "targets"]: return only("GET", .targets)
        case ["v1", "route"]: return only("GET", .route)
        default: break
        }
        // "", "v1", "dispatches", id[, action]
        guard parts.count >= 4, parts.count <= 5, parts[1] == "v1", parts[2] == "dispatches" else { return .notFound }
        let id = parts[3]
        guard Identifiers.isValidDispatchID(id) else { return .notFound }
        guard parts.count == 5 else { return only("GET", .latest(id: id)) }
        switch parts[4] {
        case "events": return only("GET", .events(id: id))
        case "cancel": return only("POST", .cancel(id: id))
        case "reroute": return only("POST", .reroute(id: id))
        case "activity": return only("PUT", .activity(id: id))
        default: return .notFound
        }
    }

    /// Whether the endpoint needs a bearer token (every `/v1` one).
    public var needsToken: Bool {
        switch self {
        case .page, .notFound, .methodNotAllowed: false
        default: true
        }
    }
}

/// An error answer: `{"error": {"code", "message"}}` with its status, and
/// beside it the `id` of a request the broker did not take.
public struct GatewayError: Error, Equatable, Sendable {
    public var status: Int
    public var code: String
    public var message: String
    /// The dispatch a refused `POST /v1/dispatches` was for (its `id`, made
    /// by the gateway when the body had none): whether the broker took it is
    /// unknown, so a retry must use it to stay one dispatch.
    public var id: String?

    public init(_ status: Int, _ code: String, _ message: String, id: String? = nil) {
        self.status = status
        self.code = code
        self.message = message
        self.id = id
    }

    public static func unauthorized(_ why: String) -> GatewayError { .init(401, "unauthorized", why) }
    public static let notFound = GatewayError(404, "not_found", "no such dispatch")
    public static func invalid(_ why: String) -> GatewayError { .init(400, "invalid_request", why) }

    public var body: Data {
        JSONWriter.object { json in
            json.beginObject("error")
            json.field("code", code)
            json.field("message", message)
            json.endObject()
            json.field("id", id)  // (none when nil)
        }
    }
}

/// Bearer tokens: the file of `FRONTDESK_GATEWAY_TOKENS` maps the hex SHA-256
/// of each token to its user id. Only digests are kept.
public struct GatewayTokens: Sendable, Equatable {
    public let users: [String: String]

    public init(users: [String: String]) { self.users = users }

    /// Reads the file's JSON; a bad file is a start-up error naming the problem.
    public init(json: Data) throws(GatewayConfigError) {
        guard let object = try? JSONSerialization.jsonObject(with: json) as? [String: Any] else {
            throw GatewayConfigError("the tokens file must be a JSON object: token SHA-256 (hex) → user id")
        }
        var users: [String: String] = [:]
        for (digest, value) in object {
            let lower = digest.lowercased()
            guard lower.utf8.count == 64, lower.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }) else {
                throw GatewayConfigError("'\(digest.prefix(80))' is not a hex SHA-256 digest (64 hex digits)")
            }
            guard let user = value as? String, !user.isEmpty, user.unicodeScalars.count <= 128 else {
                throw GatewayConfigError("the user of \(lower.prefix(8))… must be a string of 1–128 characters")
            }
            // JSON keys differ by case where digests do not: two for one digest is a mistake to name.
            guard users.updateValue(user, forKey: lower) == nil else {
                throw GatewayConfigError("the digest \(lower.prefix(8))… appears twice (digests are read in lower case)")
            }
        }
        self.users = users
    }

    /// The user of an `Authorization` header's bearer token, given the
    /// token's digest function; nil for a missing, malformed or unknown token.
    public func user(authorization: String?, digest: (String) -> String) -> String? {
        guard let authorization else { return nil }
        let parts = authorization.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        guard !token.isEmpty, token.utf8.count <= 4096 else { return nil }
        return users[digest(token)]
    }
}

public struct GatewayConfigError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The bodies the gateway takes, checked and turned into what it publishes.
public enum GatewayBodies {
    /// A request body for `dispatch.request`: the client's fields the
    /// contract names (nothing else), `user` from the token, and an id made
    /// with `makeID` when the client gave none. The result is checked as the
    /// router would check it.
    public static func dispatchRequest(_ body: Data, user: String, makeID: () -> String) -> Result<(id: String, body: Data), GatewayError> {
        guard body.count <= IntakeClassifier.maxBodyBytes else {
            return .failure(.init(413, "too_large", "the body is over \(IntakeClassifier.maxBodyBytes) bytes"))
        }
        let object: [String: JSONValue]
        do { object = try jsonObject(body) } catch { return .failure(error) }
        let id: String
        switch object["id"] {
        case nil, .null?: id = makeID()
        case .string(let given)? where Identifiers.isValidDispatchID(given): id = given
        default: return .failure(.invalid("'id' must be 1–128 of [A-Za-z0-9._:-]"))
        }
        // The contract's fields, each a string as the router requires (it
        // would refuse any other type with the same reason), in key order.
        var fields: [String: String] = [:]
        for key in ["createdAt", "input", "project", "target", "threadId"] {
            switch object[key] {
            case nil, .null?: continue
            case .string(let value)?: fields[key] = value
            default: return .failure(.invalid("'\(key)' must be a string"))
            }
        }
        let data = JSONWriter.object { json in
            json.field("createdAt", fields["createdAt"])
            json.field("id", id)
            for key in ["input", "project", "target", "threadId"] { json.field(key, fields[key]) }
            json.field("user", user)
        }
        switch IntakeClassifier.classify(routingKey: CommandKey.request, type: nil, body: data) {
        case .request(let request): return .success((request.id, data))
        case .reject(let code, let reason, _, _): return .failure(.init(code == .tooLarge ? 413 : 400, code.rawValue, reason))
        default: return .failure(.invalid("not a dispatch request"))
        }
    }

    /// A cancel's body: `{"reason"}` optional (an empty body is a cancel by "user").
    public static func cancel(_ body: Data, id: String) -> Result<Data, GatewayError> {
        var reason = "user"
        if !body.isEmpty {
            let object: [String: JSONValue]
            do { object = try jsonObject(body) } catch { return .failure(error) }
            if let r = object["reason"], r != .null {
                guard case .string(let r) = r, !r.isEmpty else { return .failure(.invalid("'reason' must be a non-empty string")) }
                reason = String(String.UnicodeScalarView(r.unicodeScalars.prefix(IntakeClassifier.maxReasonScalars)))
            }
        }
        return .success(JSONWriter.object { json in
            json.field("id", id)
            json.field("reason", reason)
        })
    }

    /// A reroute's body: `{"project","target"}`, a target of `table` (else 422).
    public static func reroute(_ body: Data, id: String, table: RoutingTable) -> Result<Data, GatewayError> {
        let object: [String: JSONValue]
        do { object = try jsonObject(body) } catch { return .failure(error) }
        guard let project = object["project"]?.stringValue, let target = object["target"]?.stringValue else {
            return .failure(.invalid("a reroute needs 'project' and 'target' strings"))
        }
        let route = RoutingTable.Route(project: project, target: target)
        guard table.target(route) != nil else {
            return .failure(.init(422, "unknown_target", "\(route.description.prefix(200)) is no target of the routing table"))
        }
        return .success(JSONWriter.object { json in
            json.field("id", id)
            json.field("project", project)
            json.field("target", target)
        })
    }

    public static let environments: Set<String> = ["production", "sandbox"]

    /// A client's body as a JSON object, read as the router reads requests
    /// and the sender agent replies (`JSONReader.parseMessage`): one set of
    /// JSON rules on every way in. Not JSON: 400 `invalid_json`; JSON but no
    /// object: 400 `invalid_request`, as on the broker.
    static func jsonObject(_ body: Data) throws(GatewayError) -> [String: JSONValue] {
        let parsed: JSONValue
        do {
            parsed = try JSONReader.parseMessage(body)
        } catch {
            throw GatewayError(400, "invalid_json", "the body is not JSON: \(error)")
        }
        guard case .object(let object) = parsed else { throw .invalid("the body is JSON but not an object") }
        return object
    }

    /// An activity registration: `{"pushToken": hex, "environment"}`.
    public static func activity(_ body: Data, id: String) -> Result<Data, GatewayError> {
        let object: [String: JSONValue]
        do { object = try jsonObject(body) } catch { return .failure(error) }
        guard let token = object["pushToken"]?.stringValue, (2...512).contains(token.utf8.count), token.utf8.count % 2 == 0,
            token.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) || (65...70).contains($0) })
        else {
            return .failure(.invalid("'pushToken' must be an even number (2–512) of hex digits"))
        }
        let environment = object["environment"] == nil ? "production" : object["environment"]?.stringValue
        guard let environment, environments.contains(environment) else {
            return .failure(.invalid("'environment' must be production or sandbox"))
        }
        return .success(JSONWriter.object { json in
            json.field("environment", environment)
            json.field("id", id)
            json.field("pushToken", token.lowercased())
        })
    }
}

/// Server-sent events framing.
public enum ServerSentEvents {
    /// One event: `id: <seq>`, `event: <state>`, then the JSON as `data:` lines.
    public static func frame(seq: Int, state: String, data: Data) -> Data {
        var out = Data("id: \(seq)\nevent: \(state)\n".utf8)
        for line in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            out.append(contentsOf: Array("data: ".utf8))
            out.append(contentsOf: line.filter { $0 != UInt8(ascii: "\r") })
            out.append(UInt8(ascii: "\n"))
        }
        out.append(UInt8(ascii: "\n"))
        return out
    }

    /// A comment line: keeps proxies from closing an idle stream.
    public static let keepAlive = Data(": keep-alive\n\n".utf8)

    /// The last thing a stream ends with, when no event does. libmicrohttpd
    /// (0.9.75) leaves an HTTP/1.0 stream open that ends with nothing left
    /// to send after it has waited for more; a comment gives it a last write.
    public static let end = Data(": end\n\n".utf8)

    /// How long a browser waits before reconnecting.
    public static let retry = Data("retry: 1000\n\n".utf8)

    /// `Last-Event-ID`: the seq after which to resume; 0 when absent or not a
    /// seq. A seq past `Int.max` is after every event (not 0: that would
    /// replay the whole history to a client that has seen it).
    public static func lastSeq(_ header: String?) -> Int {
        guard let trimmed = header?.trimmingCharacters(in: .whitespaces), !trimmed.isEmpty,
            trimmed.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) })
        else { return 0 }
        return Int(trimmed) ?? Int.max
    }
}
