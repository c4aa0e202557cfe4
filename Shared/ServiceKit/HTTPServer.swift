import Foundation
import Glibc
import Synchronization

public struct HTTPRequest: Sendable {
    public var method: String
    public var path: String
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var contentType: String
    public var body: String

    public init(status: Int, contentType: String = "text/plain; charset=utf-8", body: String) {
        self.status = status
        self.contentType = contentType
        self.body = body
    }
}

/// A small HTTP/1.1 listener for probes and metrics. It runs on its own
/// thread (blocking sockets never touch the cooperative pool), answers one
/// short request per connection and closes it.
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (HTTPRequest) -> HTTPResponse

    private let listener: Int32
    public let port: Int
    private let stopping = Atomic<Bool>(false)
    private let stopped = Mutex<Bool>(false)

    /// Binds `host:port` (port 0: any free port, then read `port`) and starts serving.
    public init(host: String = "0.0.0.0", port: Int, handler: @escaping Handler) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HTTPServerError("cannot create a socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            close(fd)
            throw HTTPServerError("'\(host)' is not an IPv4 address")
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            let why = String(cString: strerror(errno))
            close(fd)
            throw HTTPServerError("cannot listen on \(host):\(port): \(why)")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        self.listener = fd
        self.port = Int(UInt16(bigEndian: actual.sin_port))
        let thread = Thread { [self] in self.serve(handler) }
        thread.name = "http:\(self.port)"
        thread.start()
    }

    /// Stops accepting; the listener thread exits within 200 ms.
    public func stop() {
        stopping.store(true, ordering: .relaxed)
    }

    private func serve(_ handler: Handler) {
        defer { close(listener) }
        while !stopping.load(ordering: .relaxed) {
            var fds = [pollfd(fd: listener, events: Int16(POLLIN), revents: 0)]
            guard poll(&fds, 1, 200) > 0 else { continue }
            let client = accept(listener, nil, nil)
            guard client >= 0 else { continue }
            respond(client, handler)
            close(client)
        }
    }

    private func respond(_ client: Int32, _ handler: Handler) {
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        // Read the request head (up to 16 KiB); bodies are not used.
        while received.count < 16_384 {
            let n = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { break }
            received.append(contentsOf: buffer[0..<n])
            if received.count >= 4, received.suffix(4) == [13, 10, 13, 10] || received.contains(10) { break }
        }
        let response: HTTPResponse
        if let request = Self.parse(received) {
            response = request.method == "GET" || request.method == "HEAD"
                ? handler(request)
                : HTTPResponse(status: 405, body: "only GET is served here\n")
        } else {
            response = HTTPResponse(status: 400, body: "bad request\n")
        }
        let body = Array(response.body.utf8)
        let head = "HTTP/1.1 \(response.status) \(Self.reason(response.status))\r\nContent-Type: \(response.contentType)\r\n"
            + "Content-Length: \(body.count)\r\nConnection: close\r\n\r\n"
        let bytes = Array(head.utf8) + body
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { return }
            sent += n
        }
    }

    static func parse(_ bytes: [UInt8]) -> HTTPRequest? {
        guard let end = bytes.firstIndex(of: 10) else { return nil }
        let line = String(decoding: bytes[..<end], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        let parts = line.split(separator: " ")
        guard parts.count == 3, parts[2].hasPrefix("HTTP/1.") else { return nil }
        var path = String(parts[1])
        if let q = path.firstIndex(of: "?") { path = String(path[..<q]) }
        return HTTPRequest(method: String(parts[0]), path: path)
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 400: "Bad Request"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }
}

public struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    public var description: String
    init(_ d: String) { description = d }
}
