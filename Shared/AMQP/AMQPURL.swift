/// A parsed `amqp://` or `amqps://` URL, as RabbitMQ's URI spec defines it.
///
/// `description` never shows the password, so a URL is safe to log.
public struct AMQPURL: Sendable, Equatable, CustomStringConvertible {
    public var tls: Bool
    public var host: String
    public var port: Int
    public var user: String
    public var password: String
    public var vhost: String
    /// Heartbeat in seconds (`?heartbeat=`); 0 turns heartbeats off.
    public var heartbeat: Int
    /// TCP/TLS connect and handshake timeout in seconds (`?connection_timeout=` in ms).
    public var connectionTimeoutMs: Int
    public var frameMax: Int
    public var channelMax: Int

    public static let defaultHeartbeat = 30
    public static let defaultConnectionTimeoutMs = 10_000
    public static let defaultFrameMax = 131_072
    public static let defaultChannelMax = 2047

    public init(
        tls: Bool = false, host: String = "127.0.0.1", port: Int? = nil,
        user: String = "guest", password: String = "guest", vhost: String = "/"
    ) {
        self.tls = tls
        self.host = host
        self.port = port ?? (tls ? 5671 : 5672)
        self.user = user
        self.password = password
        self.vhost = vhost
        self.heartbeat = Self.defaultHeartbeat
        self.connectionTimeoutMs = Self.defaultConnectionTimeoutMs
        self.frameMax = Self.defaultFrameMax
        self.channelMax = Self.defaultChannelMax
    }

    /// Parses `amqp[s]://[user[:password]@]host[:port][/vhost][?query]`.
    public init(parsing text: String) throws(AMQPError) {
        func bad(_ why: String) -> AMQPError {
            AMQPError(.invalidURL, "invalid AMQP URL \(AMQPURL.redact(text)): \(why)")
        }
        var rest = Substring(text)
        if rest.hasPrefix("amqps://") {
            self.init(tls: true)
            rest = rest.dropFirst("amqps://".count)
        } else if rest.hasPrefix("amqp://") {
            self.init(tls: false)
            rest = rest.dropFirst("amqp://".count)
        } else {
            throw bad("the scheme must be amqp:// or amqps://")
        }
        var query: Substring = ""
        if let q = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: q)...]
            rest = rest[..<q]
        }
        var path: Substring? = nil
        if let slash = rest.firstIndex(of: "/") {
            path = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
        }
        if let at = rest.lastIndex(of: "@") {
            let userinfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            let parts = userinfo.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
            guard let u = Self.percentDecode(parts[0]) else { throw bad("the user name has a bad percent-escape") }
            user = u
            if parts.count == 2 {
                guard let p = Self.percentDecode(parts[1]) else { throw bad("the password has a bad percent-escape") }
                password = p
            }
        }
        // Host, with an IPv6 literal in brackets, then an optional port.
        var hostPart = rest
        var portPart: Substring? = nil
        if hostPart.hasPrefix("[") {
            guard let close = hostPart.firstIndex(of: "]") else { throw bad("an IPv6 host lacks its closing ]") }
            let after = hostPart[hostPart.index(after: close)...]
            if after.hasPrefix(":") { portPart = after.dropFirst() } else if !after.isEmpty { throw bad("unexpected text after the host") }
            hostPart = hostPart[hostPart.index(after: hostPart.startIndex)..<close]
        } else if let colon = hostPart.lastIndex(of: ":") {
            portPart = hostPart[hostPart.index(after: colon)...]
            hostPart = hostPart[..<colon]
        }
        if !hostPart.isEmpty {
            guard let h = Self.percentDecode(hostPart) else { throw bad("the host has a bad percent-escape") }
            host = h
        }
        if let portPart {
            guard let p = Int(portPart), (1...65535).contains(p) else { throw bad("the port must be a number from 1 to 65535") }
            port = p
        }
        if let path {
            guard !path.contains("/") else { throw bad("the vhost must be one path segment (write / as %2f)") }
            guard let v = Self.percentDecode(path) else { throw bad("the vhost has a bad percent-escape") }
            // amqp://host (no path) means "/"; amqp://host/ means the empty vhost by the spec,
            // which RabbitMQ does not have: treat it as "/" too.
            vhost = v.isEmpty ? "/" : v
        }
        for pair in query.split(separator: "&") where !pair.isEmpty {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = String(kv[0])
            let value = kv.count == 2 ? String(kv[1]) : ""
            func number(_ range: ClosedRange<Int>) throws(AMQPError) -> Int {
                guard let n = Int(value), range.contains(n) else {
                    throw bad("\(key) must be a whole number from \(range.lowerBound) to \(range.upperBound)")
                }
                return n
            }
            switch key {
            case "heartbeat": heartbeat = try number(0...65535)
            case "connection_timeout": connectionTimeoutMs = try number(1...3_600_000)
            case "frame_max": frameMax = try number(4096...2_147_483_647)
            case "channel_max": channelMax = try number(0...65535)
            default: break  // Other clients' options (auth_mechanism, ...) are ignored, as RabbitMQ's clients do.
            }
        }
    }

    public var description: String {
        let scheme = tls ? "amqps" : "amqp"
        let hostText = host.contains(":") ? "[\(host)]" : host
        return "\(scheme)://\(user)@\(hostText):\(port)/\(Self.percentEncodeVhost(vhost))"
    }

    /// Replaces the password of a URL-shaped string with `***`, for messages
    /// about URLs that did not parse.
    /// A password typed without percent-escapes may hold `/`, `?` or `@`, so
    /// everything from the first `:` after the user to the last `@` is
    /// hidden: too much at worst, never a piece of the password. Each of
    /// several comma-separated URLs is redacted on its own.
    public static func redact(_ text: String) -> String {
        if text.contains(",") { return text.split(separator: ",", omittingEmptySubsequences: false).map { redact(String($0)) }.joined(separator: ",") }
        guard let scheme = text.range(of: "://") else { return text }
        let afterScheme = text[scheme.upperBound...]
        guard let at = afterScheme.lastIndex(of: "@"), let colon = afterScheme[..<at].firstIndex(of: ":") else { return text }
        return String(text[..<colon]) + ":***" + String(text[at...])
    }

    static func percentDecode(_ s: Substring) -> String? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(s.utf8.count)
        var it = s.utf8.makeIterator()
        while let b = it.next() {
            if b == UInt8(ascii: "%") {
                guard let h = it.next(), let l = it.next(), let hv = hexValue(h), let lv = hexValue(l) else { return nil }
                bytes.append(hv << 4 | lv)
            } else {
                bytes.append(b)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    private static func percentEncodeVhost(_ v: String) -> String {
        var out = ""
        for b in v.utf8 {
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(b))
            default:
                out += "%" + String(b, radix: 16, uppercase: false).leftPadded(to: 2)
            }
        }
        return out
    }
}

extension String {
    fileprivate func leftPadded(to n: Int) -> String {
        count >= n ? self : String(repeating: "0", count: n - count) + self
    }
}
