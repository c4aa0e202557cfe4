import CMicroHTTPD
import Foundation
import Synchronization

/// One complete request, copied off the server's thread.
public struct AsyncHTTPRequest: Sendable {
    public var method: String
    /// The path, without the query.
    public var path: String
    /// The headers asked for at start-up (by lower-cased name), when present.
    public var headers: [String: String]
    /// The query arguments asked for at start-up, decoded, when present.
    public var query: [String: String]
    public var body: Data

    public init(method: String, path: String, headers: [String: String] = [:], query: [String: String] = [:], body: Data = Data()) {
        self.method = method
        self.path = path
        self.headers = headers
        self.query = query
        self.body = body
    }
}

/// The way to answer one request, exactly once, from any thread or task.
/// Dropped unanswered, it answers 500: a handler's mistake never leaves a
/// client waiting.
public final class HTTPResponder: Sendable {
    private let request: Mutex<Int>

    init(_ request: OpaquePointer) { self.request = Mutex(Int(bitPattern: UnsafeRawPointer(request))) }

    /// Takes the request: nil once answered.
    private func take() -> OpaquePointer? {
        request.withLock { r in
            defer { r = 0 }
            return OpaquePointer(bitPattern: r)
        }
    }

    public func answer(status: Int, contentType: String, body: Data, header: (name: String, value: String)? = nil) {
        guard let r = take() else { return }
        body.withUnsafeBytes { bytes in
            fd_request_answer(r, UInt32(clamping: status), contentType, bytes.baseAddress, bytes.count, header?.name, header?.value)
        }
        fd_request_release(r)
    }

    /// Answers with a stream, to be written with `HTTPStream.write`; nil when the client is gone.
    public func stream(status: Int, contentType: String) -> HTTPStream? {
        guard let r = take() else { return nil }
        defer { fd_request_release(r) }
        return fd_request_answer_stream(r, UInt32(clamping: status), contentType).map(HTTPStream.init)
    }

    deinit {
        if let r = take() {
            fd_request_answer(r, 500, "application/json", nil, 0, nil, nil)
            fd_request_release(r)
        }
    }
}

/// A response written piece by piece (server-sent events). Writes never
/// block: they queue at most `limit` bytes for a client (given per write),
/// and a client that reads slower than that is cut off.
public final class HTTPStream: Sendable {
    private let stream: Mutex<Int>
    public static let limit = 4 << 20

    init(_ stream: OpaquePointer) { self.stream = Mutex(Int(bitPattern: UnsafeRawPointer(stream))) }

    /// False once the client is gone (or cut off, or the stream ended): stop writing.
    @discardableResult
    public func write(_ bytes: Data, end: Bool = false, limit: Int = HTTPStream.limit) -> Bool {
        stream.withLock { s in
            guard let pointer = OpaquePointer(bitPattern: s) else { return false }
            let ok = bytes.withUnsafeBytes { b in
                fd_stream_write(pointer, b.baseAddress ?? UnsafeRawPointer(bitPattern: 1), b.count, end ? 1 : 0, max(0, limit)) == 1
            }
            if !ok || end {
                fd_stream_release(pointer)
                s = 0
            }
            return ok
        }
    }

    /// True once the client has closed its side, or the stream is over (it is
    /// then ended). Never blocks: it looks at what waits on the socket.
    public var isClientGone: Bool {
        stream.withLock { s in
            guard let pointer = OpaquePointer(bitPattern: s) else { return true }
            guard fd_stream_client_gone(pointer) == 1 else { return false }
            fd_stream_release(pointer)
            s = 0
            return true
        }
    }

    deinit {
        stream.withLock { s in
            if let pointer = OpaquePointer(bitPattern: s) {
                _ = fd_stream_write(pointer, nil, 0, 1, Self.limit)
                fd_stream_release(pointer)
            }
            s = 0
        }
    }
}

/// A request's answer decided by the server's owner from its head.
public struct HTTPRefusal: Sendable {
    public var status: Int
    /// JSON.
    public var body: Data
    public var header: (String, String)?

    public init(status: Int, body: Data, header: (String, String)? = nil) {
        self.status = status
        self.body = body
        self.header = header
    }
}

/// An HTTP/1.1 server on libmicrohttpd for the gateway: requests are
/// answered asynchronously (the connection waits suspended, holding no
/// thread), responses may stream, a request its owner refuses from its head
/// (`headCheck`) gets that answer instead of the handler's, bodies over
/// `maxBody` get 413 (or that refusal) before they are read, idle connections close after `idleTimeoutSeconds`, and one still
/// sending its request `requestTimeoutSeconds` after it opened (or after its
/// last response) is cut off.
public final class AsyncHTTPServer: Sendable {
    public typealias Handler = @Sendable (AsyncHTTPRequest, HTTPResponder) -> Void

    /// What answers a request, decided from its head alone (it has no body
    /// yet): given once its body is read, or at once for a body over the
    /// limit instead of the 413; nil to go on.
    public typealias HeadCheck = @Sendable (AsyncHTTPRequest) -> HTTPRefusal?

    private final class Box: Sendable {
        let handler: Handler
        let headCheck: HeadCheck?
        let headers: [String]
        let query: [String]
        init(_ handler: @escaping Handler, headCheck: HeadCheck?, headers: [String], query: [String]) {
            self.handler = handler
            self.headCheck = headCheck
            self.headers = headers
            self.query = query
        }

        /// The request as the handler sees it; on the server's thread, during its callback only.
        func request(_ request: OpaquePointer) -> AsyncHTTPRequest {
            var headers: [String: String] = [:]
            for name in self.headers {
                if let v = fd_request_header(request, name) { headers[name.lowercased()] = String(cString: v) }
            }
            var query: [String: String] = [:]
            for name in self.query {
                var length = 0
                if let v = fd_request_query(request, name, &length) {
                    query[name] = String(decoding: UnsafeRawBufferPointer(start: v, count: length), as: UTF8.self)
                }
            }
            var length = 0
            let bytes = fd_request_body(request, &length)
            let body = bytes.map { Data(bytes: $0, count: length) } ?? Data()
            return AsyncHTTPRequest(
                method: String(cString: fd_request_method(request)), path: String(cString: fd_request_path(request)),
                headers: headers, query: query, body: body)
        }
    }

    private let server: Mutex<Int>
    private let box: Unmanaged<Box>
    public let port: Int

    /// By default, half the process's descriptors (`HTTPServer.connectionLimit`).
    public static let maxConnections: UInt32 = HTTPServer.connectionLimit(descriptors: HTTPServer.descriptors, share: 2)

    /// `headers` and `query`: the names the handler reads. `connectionMemory`:
    /// libmicrohttpd's pool per connection, which a request head must fit in.
    /// `streamBudget`: the most memory all streams' buffers may hold
    /// together (0: no limit); over it, the one whose client has taken
    /// nothing for longest is cut off. `headCheck`: asked about each request's head as soon as it is in
    /// (on the server's thread: it must not block). `requireHost`: a request without exactly one
    /// Host header (HTTP/1.0 may have none) that the head check let through is answered 400.
    public init(
        host: String = "0.0.0.0", port: Int, maxBody: Int, idleTimeoutSeconds: UInt32 = 30, requestTimeoutSeconds: UInt32 = 10,
        maxConnections: UInt32 = AsyncHTTPServer.maxConnections, connectionMemory: Int = 16 << 10, streamBudget: Int = 0,
        headers: [String], query: [String], headCheck: HeadCheck? = nil, requireHost: Bool = false,
        handler: @escaping Handler
    ) throws {
        guard let port16 = UInt16(exactly: port) else { throw HTTPServerError("port \(port) is not a TCP port") }
        let box = Unmanaged.passRetained(Box(handler, headCheck: headCheck, headers: headers, query: query))
        var error = [CChar](repeating: 0, count: 256)
        let started = fd_http_start_async(
            host, port16, idleTimeoutSeconds, requestTimeoutSeconds, maxConnections, max(0, maxBody), max(0, connectionMemory),
            { context, request in
                guard let context, let request else { return }
                let box = Unmanaged<Box>.fromOpaque(context).takeUnretainedValue()
                box.handler(box.request(request), HTTPResponder(request))
            },
            { context, request, refusal in
                guard let context, let request, let refusal else { return 0 }
                let box = Unmanaged<Box>.fromOpaque(context).takeUnretainedValue()
                guard let check = box.headCheck, let answer = check(box.request(request)),
                    let status = UInt32(exactly: answer.status), let body = malloc(max(1, answer.body.count))
                else { return 0 }
                answer.body.copyBytes(to: body.assumingMemoryBound(to: UInt8.self), count: answer.body.count)
                refusal.pointee.status = status
                refusal.pointee.body = body.assumingMemoryBound(to: CChar.self)
                refusal.pointee.body_length = answer.body.count
                if let (name, value) = answer.header {
                    refusal.pointee.header_name = strdup(name)
                    refusal.pointee.header_value = strdup(value)
                }
                return 1
            },
            requireHost ? 1 : 0, box.toOpaque(), &error, error.count)
        guard let started else {
            box.release()
            throw HTTPServerError(String(cBuffer: error))
        }
        fd_http_set_stream_budget(started, max(0, streamBudget))
        self.box = box
        self.server = Mutex(Int(bitPattern: UnsafeRawPointer(started)))
        self.port = Int(fd_http_port(started))
    }

    /// The memory all streams' buffers hold now (what waits for their
    /// clients beyond what the kernel holds): what `streamBudget` bounds.
    public var streamBufferBytes: Int {
        server.withLock { s in
            guard let pointer = OpaquePointer(bitPattern: s) else { return 0 }
            return Int(clamping: fd_http_stream_bytes(pointer))
        }
    }

    /// Stops serving: open connections are closed, no handler runs once it returns.
    public func stop() {
        server.withLock { s in
            guard let pointer = OpaquePointer(bitPattern: s) else { return }
            s = 0
            fd_http_stop(pointer)
            box.release()
        }
    }

    deinit { stop() }
}
