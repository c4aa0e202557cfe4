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

/// The HTTP server for probes and metrics: `AsyncHTTPServer` with a handler
/// that answers at once, on the server's own polling thread (never the
/// cooperative pool). Every connection is served concurrently, so clients
/// that hold idle connections or send slowly delay no one; idle connections
/// are closed after `idleTimeoutSeconds`, one still sending its request after
/// `maxConnectionAgeSeconds` is cut off, at most `maxConnections` are open at
/// once, and requests carry no body.
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (HTTPRequest) -> HTTPResponse

    public static let idleTimeoutSeconds: UInt32 = 2
    /// A request still arriving this long after its connection opened is cut
    /// off, whatever it sends: a client that drips a byte at a time never goes idle.
    public static let maxConnectionAgeSeconds: UInt32 = 10

    /// The process's descriptors, raised to its hard limit (up to 65,536).
    public static let descriptors: UInt64 = {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        let wanted = min(limit.rlim_max, 65_536)
        if limit.rlim_cur < wanted {
            var raised = limit
            raised.rlim_cur = wanted
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return UInt64(limit.rlim_cur)
    }()

    /// A server's share of `descriptors` (`share` of 4), at least 64 and at
    /// most 16,384: clients holding connections open can take many slots,
    /// never the descriptors the broker connection needs. The probes take a
    /// quarter, the gateway's API half: together never all of them.
    public static func connectionLimit(descriptors: UInt64, share: UInt64) -> UInt32 {
        UInt32(min(max(descriptors / 4 * min(share, 4), 64), 16_384))
    }

    /// The probe server's limit: a quarter of the descriptors.
    public static let maxConnections: UInt32 = connectionLimit(descriptors: descriptors, share: 1)

    private let server: AsyncHTTPServer
    public var port: Int { server.port }

    /// Binds `host:port` (port 0: any free port, then read `port`) and starts serving.
    public init(host: String = "0.0.0.0", port: Int, handler: @escaping Handler) throws {
        server = try AsyncHTTPServer(
            host: host, port: port, maxBody: 0, idleTimeoutSeconds: Self.idleTimeoutSeconds,
            requestTimeoutSeconds: Self.maxConnectionAgeSeconds, maxConnections: Self.maxConnections, headers: [], query: []
        ) { request, responder in
            let response = request.method == "GET" || request.method == "HEAD"
                ? handler(HTTPRequest(method: request.method, path: request.path))
                : HTTPResponse(status: 405, body: "only GET is served here\n")
            responder.answer(status: response.status, contentType: response.contentType, body: Data(response.body.utf8))
        }
    }

    /// Stops serving: no handler runs once it returns.
    public func stop() { server.stop() }
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
