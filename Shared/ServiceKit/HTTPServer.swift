import CMicroHTTPD
import Foundation
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

/// The HTTP server for probes and metrics, on libmicrohttpd: its own
/// polling thread (never the cooperative pool), every connection served
/// concurrently, so clients that hold idle connections or send slowly delay
/// no one; idle connections are closed after `idleTimeoutSeconds`, any
/// connection after `maxConnectionAgeSeconds`, and at most `maxConnections`
/// are open at once.
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (HTTPRequest) -> HTTPResponse

    /// The handler, kept alive for the C side as long as the server runs.
    private final class Box: Sendable {
        let handler: Handler
        init(_ handler: @escaping Handler) { self.handler = handler }
    }

    public static let idleTimeoutSeconds: UInt32 = 2
    /// A connection open this long is closed whatever it sends: a client that
    /// drips a request a byte at a time never goes idle.
    public static let maxConnectionAgeSeconds: UInt32 = 10

    /// At most half the process's descriptors (raised to its hard limit, up
    /// to 65,536) and at most 16,384: clients holding connections open can
    /// take many slots, never the descriptors the broker connection needs.
    public static let maxConnections: UInt32 = {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 512 }
        let wanted = min(limit.rlim_max, 65_536)
        if limit.rlim_cur < wanted {
            var raised = limit
            raised.rlim_cur = wanted
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return UInt32(min(max(limit.rlim_cur / 2, 64), 16_384))
    }()

    /// The C server's address (0 once stopped): a pointer is not Sendable, its bits are.
    private let server: Mutex<Int>
    private let box: Unmanaged<Box>
    public let port: Int

    /// Binds `host:port` (port 0: any free port, then read `port`) and starts serving.
    public init(host: String = "0.0.0.0", port: Int, handler: @escaping Handler) throws {
        guard let port16 = UInt16(exactly: port) else { throw HTTPServerError("port \(port) is not a TCP port") }
        let box = Unmanaged.passRetained(Box(handler))
        var error = [CChar](repeating: 0, count: 256)
        let started = fd_http_start(
            host, port16, Self.idleTimeoutSeconds, Self.maxConnectionAgeSeconds, Self.maxConnections,
            { context, method, path, answer in
                guard let context, let method, let path, let answer else { return }
                let handler = Unmanaged<Box>.fromOpaque(context).takeUnretainedValue().handler
                let m = String(cString: method)
                let response = m == "GET" || m == "HEAD"
                    ? handler(HTTPRequest(method: m, path: String(cString: path)))
                    : HTTPResponse(status: 405, body: "only GET is served here\n")
                var body = Array(response.body.utf8)
                body.withUnsafeMutableBytes { bytes in
                    fd_http_answer_set(answer, UInt32(clamping: response.status), response.contentType, bytes.baseAddress, bytes.count)
                }
            },
            box.toOpaque(), &error, error.count)
        guard let started else {
            box.release()
            throw HTTPServerError(String(cBuffer: error))
        }
        self.box = box
        self.server = Mutex(Int(bitPattern: UnsafeRawPointer(started)))
        self.port = Int(fd_http_port(started))
    }

    /// Stops serving: no handler runs once it returns.
    public func stop() {
        // Under the lock: a second stop() returns only once the first has
        // stopped the server (handlers never take this lock).
        server.withLock { s in
            guard let pointer = OpaquePointer(bitPattern: s) else { return }
            s = 0
            fd_http_stop(pointer)
            box.release()
        }
    }

    deinit { stop() }
}

extension String {
    /// The text a C function wrote into `buffer` (up to its first NUL).
    public init(cBuffer buffer: [CChar]) {
        self = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

public struct HTTPServerError: Error, CustomStringConvertible, Sendable {
    public var description: String
    init(_ d: String) { description = d }
}
