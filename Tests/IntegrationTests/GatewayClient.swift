import AMQP
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization
import Testing

/// A gateway process of a harness, with its tokens: alice and bob.
struct TestGateway {
    let process: Process
    let port: Int
    static let tokens = ["alice": "token-alice-1f9c", "bob": "token-bob-77aa"]

    static func tokensFile() throws -> String {
        var object: [String: String] = [:]
        for (user, token) in tokens { object[sha256(token)] = user }
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID().uuidString).json").path
        try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: path))
        return path
    }

    static func sha256(_ text: String) -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
        let input = Pipe(), output = Pipe()
        p.standardInput = input
        p.standardOutput = output
        try? p.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try? input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return String(decoding: data, as: UTF8.self).split(separator: " ").first.map(String.init) ?? ""
    }

    /// One request; the status and body.
    func call(_ method: String, _ path: String, user: String? = "alice", body: String? = nil, headers: [String: String] = [:]) async throws
        -> (status: Int, body: [String: Any], data: Data)
    {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.httpMethod = method
        if let user { request.setValue("Bearer \(Self.tokens[user] ?? user)", forHTTPHeaderField: "Authorization") }
        for (k, v) in headers { request.setValue(v, forHTTPHeaderField: k) }
        if let body { request.httpBody = Data(body.utf8) }
        let (data, response) = try await URLSession.shared.data(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        return (status, ((try? JSONSerialization.jsonObject(with: data)) as? [String: Any]) ?? [:], data)
    }
}

extension TestGateway {
    /// Sends `head` and then `body` in chunks of `chunk` bytes (chunked
    /// transfer coding) on a socket of its own; the whole answer as text,
    /// empty when the gateway closed the connection without one.
    func chunkedCall(_ head: String, body: Data, chunk: Int = 16384) throws -> String {
        var out = Data((head + "Transfer-Encoding: chunked\r\n\r\n").utf8)
        var offset = 0
        while offset < body.count {
            let piece = body[offset..<min(body.count, offset + chunk)]
            out.append(Data((String(piece.count, radix: 16) + "\r\n").utf8))
            out.append(piece)
            out.append(Data("\r\n".utf8))
            offset += piece.count
        }
        out.append(Data("0\r\n\r\n".utf8))
        return try rawCall(out)
    }

    /// Sends `out` as it is on a socket of its own; the whole answer as
    /// text, empty when the gateway closed the connection without one (or
    /// gave none within 10 s).
    func rawCall(_ out: Data) throws -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { Glibc.close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw AMQPError(.connectionFailed, "cannot connect to the gateway") }
        // Written whole, or until the gateway stops reading (it may drop the connection).
        var written = 0
        while written < out.count {
            let n = out.withUnsafeBytes { send(fd, $0.baseAddress! + written, out.count - written, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { break }
            written += n
        }
        var answer = Data()
        var buffer = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { break }
            answer.append(contentsOf: buffer[0..<n])
        }
        return String(decoding: answer, as: UTF8.self)
    }
}

extension RouterHarness {
    /// Starts a gateway; an attempt that exits before it is ready (its API
    /// port taken, say) is followed by one on another API port.
    func startGateway(extraEnvironment: [String: String] = [:]) async throws -> TestGateway {
        let tokens = try TestGateway.tokensFile()
        var port = 0
        let p = try await startRetrying("frontdesk-gateway") {
            port = TestPorts.next()
            var env = ["FRONTDESK_GATEWAY_PORT": "\(port)", "FRONTDESK_GATEWAY_TOKENS": tokens]
            for (k, v) in extraEnvironment { env[k] = v }
            return env
        }
        return TestGateway(process: p, port: port)
    }
}

/// A server-sent events client on a plain socket (HTTP/1.0: no chunking),
/// reading on a thread of its own; what it read is parsed into events.
final class SSEClient: Sendable {
    struct Event: Sendable {
        var id: String?
        var event: String?
        var data: String
        var at: ContinuousClock.Instant
        var json: [String: Any] { ((try? JSONSerialization.jsonObject(with: Data(data.utf8))) as? [String: Any]) ?? [:] }
    }

    private struct State {
        var raw = Data()
        var status = 0
        var closed = false
        var comments = 0
    }

    private final class Box: Sendable {
        let state = Mutex(State())
    }

    private let box = Box()
    private let fd: Int32

    init(port: Int, path: String, token: String?, lastEventID: String? = nil) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.fd = fd
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            Glibc.close(fd)
            throw AMQPError(.connectionFailed, "cannot connect to the gateway")
        }
        var request = "GET \(path) HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
        if let token { request += "Authorization: Bearer \(token)\r\n" }
        if let lastEventID { request += "Last-Event-ID: \(lastEventID)\r\n" }
        request += "\r\n"
        _ = request.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        let box = box
        Thread.detachNewThread {
            let state = box
            var buffer = [UInt8](repeating: 0, count: 16384)
            while true {
                let n = recv(fd, &buffer, buffer.count, 0)
                if n <= 0 { break }
                state.state.withLock { $0.raw.append(contentsOf: buffer[0..<n]) }
            }
            // Closed here, under the lock, once the reader is done: never a descriptor reused under it.
            state.state.withLock {
                $0.closed = true
                Glibc.close(fd)
            }
        }
    }

    /// The response's status code, once its head arrived (0 before).
    var status: Int {
        let raw = box.state.withLock { $0.raw }
        guard let line = String(decoding: raw.prefix(64), as: UTF8.self).split(separator: "\r\n").first else { return 0 }
        let parts = line.split(separator: " ")
        return parts.count > 1 ? Int(parts[1]) ?? 0 : 0
    }

    var isClosed: Bool { box.state.withLock { $0.closed } }

    var text: String { String(decoding: box.state.withLock { $0.raw }, as: UTF8.self) }

    /// The events read so far (arrival time: when the test looked; use `waitFor` to time them).
    var events: [Event] {
        let text = text
        guard let bodyStart = text.range(of: "\r\n\r\n") else { return [] }
        var out: [Event] = []
        for block in text[bodyStart.upperBound...].components(separatedBy: "\n\n") {
            var e = Event(id: nil, event: nil, data: "", at: .now)
            var hasData = false
            for line in block.split(separator: "\n", omittingEmptySubsequences: true) {
                if line.hasPrefix("id: ") { e.id = String(line.dropFirst(4)) }
                if line.hasPrefix("event: ") { e.event = String(line.dropFirst(7)) }
                if line.hasPrefix("data: ") {
                    e.data += (hasData ? "\n" : "") + line.dropFirst(6)
                    hasData = true
                }
            }
            if hasData { out.append(e) }
        }
        return out
    }

    var keepAlives: Int { text.components(separatedBy: ": keep-alive").count - 1 }

    /// Waits until `done` holds for the events; fails the test at the deadline.
    @discardableResult
    func waitFor(_ what: String, within: Duration = .seconds(20), _ done: ([Event]) -> Bool) async throws -> [Event] {
        let deadline = ContinuousClock.now + within
        while true {
            let events = events
            if done(events) { return events }
            if ContinuousClock.now >= deadline {
                Issue.record("timed out after \(within) waiting for \(what); got \(events.map { $0.event ?? "?" })")
                return events
            }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    func close() {
        let fd = fd
        box.state.withLock { if !$0.closed { shutdown(fd, Int32(SHUT_RDWR)) } }
    }

    deinit { close() }
}
