import Foundation
@testable import ServiceKit
import Testing

@Suite("JSON logs")
struct LoggerTests {
    @Test func oneJSONObjectALineWithFields() throws {
        let sink = LogSink.memory()
        var logger = Logger(service: "frontdesk-router", level: .info, sink: sink)
        logger.metadata = [("replica", "r1")]
        logger.debug("hidden")
        logger.info("accepted \"quoted\"\nnext", [("id", "d-1"), ("n", 3), ("ok", true), ("ratio", 0.5)])
        #expect(sink.lines.count == 1)
        let line = try #require(sink.lines.first)
        #expect(!line.contains("\n"))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["level"] as? String == "info")
        #expect(object["service"] as? String == "frontdesk-router")
        #expect(object["msg"] as? String == "accepted \"quoted\"\nnext")
        #expect(object["replica"] as? String == "r1")
        #expect(object["id"] as? String == "d-1")
        #expect(object["n"] as? Int == 3)
        #expect(object["ok"] as? Bool == true)
        #expect((object["ts"] as? String)?.hasSuffix("Z") == true)
    }

    @Test func passwordsInURLsAreRedacted() {
        let sink = LogSink.memory()
        let logger = Logger(service: "s", sink: sink)
        logger.error("cannot reach amqp://router:hunter2@broker:5672/%2f now", [("url", "amqps://a:b%21c@h/v?x=1")])
        let line = sink.lines.joined()
        #expect(!line.contains("hunter2"))
        #expect(!line.contains("b%21c"))
        #expect(line.contains("amqp://router:***@broker:5672/%2f"))
    }

    @Test func controlCharactersAreEscaped() {
        let line = Logger.line(level: .warning, service: "s", message: "a\u{1}b\tc", fields: [], at: Date(timeIntervalSince1970: 0))
        #expect(line == #"{"ts":"1970-01-01T00:00:00.000Z","level":"warning","service":"s","msg":"a\u0001b\tc"}"#)
    }

    @Test func linesCarryRFC3339TimesWithMilliseconds() {
        let line = Logger.line(level: .info, service: "s", message: "m", fields: [], at: Date(timeIntervalSince1970: 1_778_665_260.123))
        #expect(line.hasPrefix(#"{"ts":"2026-05-13T09:41:00.123Z""#))
    }
}

@Suite("Prometheus metrics")
struct MetricsTests {
    @Test func renderIsTheTextFormat() {
        let registry = MetricsRegistry()
        let accepted = registry.counter("frontdesk_requests_total", "requests by outcome", labels: ["outcome"])
        let parked = registry.gauge("frontdesk_parked", "parked dispatches", labels: ["target"])
        let latency = registry.histogram("frontdesk_latency_seconds", "latency", buckets: [0.01, 0.1])
        accepted.increment("accepted")
        accepted.increment(by: 2, "accepted")
        accepted.increment("rejected \"bad\"")
        parked.set(5, "yemaya/board-prep")
        parked.add(-2, "yemaya/board-prep")
        latency.observe(0.005)
        latency.observe(0.05)
        latency.observe(3)
        let text = registry.render()
        #expect(text.contains("# TYPE frontdesk_requests_total counter\n"))
        #expect(text.contains("frontdesk_requests_total{outcome=\"accepted\"} 3\n"))
        #expect(text.contains("frontdesk_requests_total{outcome=\"rejected \\\"bad\\\"\"} 1\n"))
        #expect(text.contains("frontdesk_parked{target=\"yemaya/board-prep\"} 3\n"))
        #expect(text.contains("frontdesk_latency_seconds_bucket{le=\"0.01\"} 1\n"))
        #expect(text.contains("frontdesk_latency_seconds_bucket{le=\"0.1\"} 2\n"))
        #expect(text.contains("frontdesk_latency_seconds_bucket{le=\"+Inf\"} 3\n"))
        #expect(text.contains("frontdesk_latency_seconds_sum 3.055\n"))
        #expect(text.contains("frontdesk_latency_seconds_count 3\n"))
        #expect(accepted.value("accepted") == 3)
    }

    @Test("an unlabelled counter or gauge is exported as 0 before it is first set; a labelled one is not; NaN is spelled NaN")
    func unlabelledMetricsStartAtZero() {
        let registry = MetricsRegistry()
        let led = registry.gauge("frontdesk_led", "partitions led")
        _ = registry.counter("frontdesk_restarts_total", "restarts")
        _ = registry.gauge("frontdesk_parked", "parked", labels: ["target"])
        var text = registry.render()
        #expect(text.contains("\nfrontdesk_led 0\n"))
        #expect(text.contains("\nfrontdesk_restarts_total 0\n"))
        #expect(!text.contains("frontdesk_parked{"))
        led.set(.nan)
        text = registry.render()
        #expect(text.contains("\nfrontdesk_led NaN\n"))
    }

    @Test func countersNeverGoDown() {
        let c = MetricsRegistry().counter("c", "c")
        c.increment(by: -5)
        #expect(c.value() == 0)
    }
}

struct ConnectFailed: Error {}

@Suite("Probe listener")
struct HTTPServerTests {
    @Test func servesHealthReadinessAndMetricsOverRealHTTP() async throws {
        let ready = ReadyFlag()
        let registry = MetricsRegistry()
        registry.counter("frontdesk_test_total", "t").increment()
        let server = try HTTPServer(host: "127.0.0.1", port: 0, handler: ProbeRoutes.handler(isReady: { ready.value }, metrics: registry))
        defer { server.stop() }
        let base = "http://127.0.0.1:\(server.port)"
        #expect(try await get("\(base)/healthz").0 == 200)
        #expect(try await get("\(base)/readyz").0 == 503)
        ready.set(true)
        #expect(try await get("\(base)/readyz").0 == 200)
        let (status, body) = try await get("\(base)/metrics")
        #expect(status == 200)
        #expect(body.contains("frontdesk_test_total 1"))
        #expect(try await get("\(base)/nope").0 == 404)
    }

    @Test func answersWithinOneSecondWhileManyClientsHoldIdleOrDrippingConnections() async throws {
        let server = try HTTPServer(host: "127.0.0.1", port: 0, handler: ProbeRoutes.handler(isReady: { true }, metrics: MetricsRegistry()))
        defer { server.stop() }
        // 200 connections that send nothing, and 20 that drip a request a byte at a time.
        var sockets: [Int32] = []
        defer { for fd in sockets { close(fd) } }
        for n in 0..<220 {
            let fd = try connectTCP(port: server.port)
            sockets.append(fd)
            if n >= 200 { _ = "G".withCString { send(fd, $0, 1, Int32(MSG_NOSIGNAL)) } }
        }
        for _ in 0..<5 {
            // Timed on a socket of the test's own, not through a curl process:
            // starting one on two busy cores took 1.5 s once, the server none of it.
            let (status, took) = try await timedHealthz(port: server.port)
            #expect(status == 200)
            #expect(took < .seconds(1), "healthz took \(took)")
        }
        // A query string is not part of the path; a method other than GET is refused.
        #expect(try await get("http://127.0.0.1:\(server.port)/readyz?x=1").0 == 200)
        #expect(try await request("http://127.0.0.1:\(server.port)/healthz", method: "POST").0 == 405)
    }

    /// A client that drips a request a byte a second never goes idle; it is
    /// cut off once its connection is 10 s old.
    @Test func aClientThatDripsARequestIsCutOffAfterTenSeconds() async throws {
        let server = try HTTPServer(host: "127.0.0.1", port: 0, handler: { _ in HTTPResponse(status: 200, body: "") })
        defer { server.stop() }
        let fd = try connectTCP(port: server.port)
        defer { close(fd) }
        // The blocking socket calls run on a thread of their own, not the pool's.
        let cutOffAfter: Duration? = await withCheckedContinuation { c in
            Thread {
                var timeout = timeval(tv_sec: 1, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                let started = ContinuousClock.now
                let request = Array("GET /healthz HTTP/1.1\r\nX-Drip: ".utf8) + Array(repeating: UInt8(ascii: "a"), count: 40)
                for byte in request {
                    var b = byte
                    if send(fd, &b, 1, Int32(MSG_NOSIGNAL)) < 0 { return c.resume(returning: ContinuousClock.now - started) }
                    var buffer = [UInt8](repeating: 0, count: 64)
                    // Waits up to 1 s for an answer: 0 bytes means the server closed it.
                    if recv(fd, &buffer, buffer.count, 0) == 0 { return c.resume(returning: ContinuousClock.now - started) }
                }
                c.resume(returning: nil)
            }.start()
        }
        let after = try #require(cutOffAfter, "a client dripping for 40 s was never cut off")
        #expect(after >= .seconds(9) && after < .seconds(13), "cut off after \(after)")
    }

    /// A service restarted at once binds its port again, though the last
    /// connections it served linger in TIME_WAIT.
    @Test func aPortJustFreedCanBeBoundAgain() async throws {
        let first = try HTTPServer(host: "127.0.0.1", port: 0, handler: { _ in HTTPResponse(status: 200, body: "") })
        let port = first.port
        #expect(try await get("http://127.0.0.1:\(port)/healthz").0 == 200)
        first.stop()
        let second = try HTTPServer(host: "127.0.0.1", port: port, handler: { _ in HTTPResponse(status: 200, body: "again") })
        defer { second.stop() }
        #expect(try await get("http://127.0.0.1:\(port)/healthz") == (200, "again"))
    }

    /// RFC 9112 §3.2, where a server requires it (the gateway's API): an
    /// HTTP/1.1 request without Host, or any request with two, is answered
    /// 400 with the JSON error every other refusal has; HTTP/1.0 needs none.
    /// (libmicrohttpd alone served them.) The probes serve them as before.
    @Test func aRequestWithoutExactlyOneHostIsAJSON400() async throws {
        let probes = try HTTPServer(host: "127.0.0.1", port: 0, handler: { _ in HTTPResponse(status: 200, body: "ok") })
        defer { probes.stop() }
        let lenient = try await rawExchange(port: probes.port, "GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        #expect(lenient.hasPrefix("HTTP/1.1 200"), "\(lenient.debugDescription)")
        let server = try AsyncHTTPServer(host: "127.0.0.1", port: 0, maxBody: 1024, headers: [], query: [], requireHost: true) { _, responder in
            responder.answer(status: 200, contentType: "text/plain", body: Data("ok".utf8))
        }
        defer { server.stop() }
        let cases: [(head: String, status: Int)] = [
            ("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", 200),
            ("GET /healthz HTTP/1.1\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nHost: a\r\nhost: b\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nContent-Length: 999999999\r\n", 400),
            ("GET /healthz HTTP/1.0\r\n", 200),
            ("GET /healthz HTTP/1.0\r\nHost: a\r\nHost: a\r\n", 400),
            ("GET /healthz HTTP/1.9\r\n", 400),  // served as HTTP/1.1
            ("GET /healthz HTTP/1.1\r\nHost: a\r\nhost : b\r\n", 400),  // a name with a space before its colon
        ]
        for c in cases {
            // A 400 closes the connection by itself: the client does not ask it to.
            let started = ContinuousClock.now
            let answer = try await rawExchange(port: server.port, c.head + (c.status == 400 ? "" : "Connection: close\r\n") + "\r\n")
            #expect(ContinuousClock.now - started < .seconds(3), "\(c.head.debugDescription): the server closed the connection")
            let status = answer.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
            #expect(status == c.status, "\(c.head.debugDescription) → \(answer.prefix(80).debugDescription)")
            if c.status == 400 {
                #expect(answer.contains("Content-Type: application/json"), "\(answer.debugDescription)")
                #expect(answer.components(separatedBy: "Connection: close").count == 2, "closed, said once: \(answer.debugDescription)")
                #expect(answer.hasSuffix(#"{"error":{"code":"invalid_request","message":"a request needs one Host header (HTTP/1.0: at most one)"}}"#))
            }
        }
    }

    /// Sends `request` on a new connection and reads until the server closes
    /// it (5 s at most), on a thread of its own.
    func rawExchange(port: Int, _ request: String) async throws -> String {
        try await withCheckedThrowingContinuation { c in
            Thread.detachNewThread {
                guard let fd = try? connectTCP(port: port) else { return c.resume(throwing: ConnectFailed()) }
                defer { close(fd) }
                var timeout = timeval(tv_sec: 5, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                _ = request.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
                var received: [UInt8] = []
                var buffer = [UInt8](repeating: 0, count: 4096)
                while true {
                    let n = recv(fd, &buffer, buffer.count, 0)
                    if n <= 0 { break }
                    received += buffer.prefix(n)
                }
                c.resume(returning: String(decoding: received, as: UTF8.self))
            }
        }
    }

    @Test func aPortInUseIsAClearError() throws {
        let first = try HTTPServer(host: "127.0.0.1", port: 0, handler: { _ in HTTPResponse(status: 200, body: "") })
        defer { first.stop() }
        #expect(throws: HTTPServerError.self) { try HTTPServer(host: "127.0.0.1", port: first.port, handler: { _ in HTTPResponse(status: 200, body: "") }) }
        #expect(throws: HTTPServerError.self) { try HTTPServer(host: "127.0.0.1", port: 70_000, handler: { _ in HTTPResponse(status: 200, body: "") }) }
    }


    func get(_ url: String) async throws -> (Int, String) { try await request(url, method: "GET") }

    /// GET /healthz on a new connection, from connect to the status line, on
    /// a thread of its own (blocking calls stay off the cooperative pool).
    func timedHealthz(port: Int) async throws -> (status: Int, took: Duration) {
        try await withCheckedThrowingContinuation { c in
            Thread.detachNewThread {
                let started = ContinuousClock.now
                guard let fd = try? connectTCP(port: port) else { return c.resume(throwing: ConnectFailed()) }
                defer { close(fd) }
                var timeout = timeval(tv_sec: 5, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                _ = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".withCString {
                    send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL))
                }
                var buffer = [UInt8](repeating: 0, count: 64)
                let n = recv(fd, &buffer, buffer.count, 0)
                let took = ContinuousClock.now - started
                // "HTTP/1.1 200 OK": the status is the line's second word.
                let line = String(decoding: buffer.prefix(max(0, n)), as: UTF8.self)
                let status = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
                c.resume(returning: (status, took))
            }
        }
    }

    func request(_ url: String, method: String) async throws -> (Int, String) {
        // Blocking client calls stay off the cooperative pool.
        try await withCheckedThrowingContinuation { c in
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
            p.arguments = ["-s", "-X", method, "-w", "\n%{http_code}", url]
            let out = Pipe()
            p.standardOutput = out
            p.terminationHandler = { _ in
                let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
                c.resume(returning: (Int(lines.last ?? "") ?? 0, lines.dropLast().joined(separator: "\n")))
            }
            do { try p.run() } catch { c.resume(throwing: error) }
        }
    }
}

final class ReadyFlag: Sendable {
    private let flag = Mutex(false)
    var value: Bool { flag.withLock { $0 } }
    func set(_ v: Bool) { flag.withLock { $0 = v } }
}

import Synchronization

struct ClusterURLTests {
    @Test func severalNodesCommaSeparated() throws {
        let nodes = try ServiceConfiguration.nodes("amqp://u:p@rabbit-0:5672/fd, amqp://u:p@rabbit-1:5672/fd,amqps://u:p@rabbit-2:5671/fd")
        #expect(nodes.map(\.host) == ["rabbit-0", "rabbit-1", "rabbit-2"])
        #expect(nodes[2].port == 5671)
        #expect(throws: UsageError.self) { try ServiceConfiguration.nodes("amqp://u:p@a/fd,,amqp://u:p@b/fd") }
        #expect(throws: UsageError.self) { try ServiceConfiguration.nodes("amqp://u:p@a/fd,amqp://other:p@b/fd") }
        #expect(throws: UsageError.self) { try ServiceConfiguration.nodes("amqp://u:p@a/fd,amqp://u:p@b/elsewhere") }
        #expect(throws: UsageError.self) { try ServiceConfiguration.nodes("amqp://u:p@a/fd,nonsense") }
        let values = OptionValues(values: ["AMQP_URL": "amqp://u:p@a/fd,amqp://u:p@b/fd"])
        let c = try ServiceConfiguration(service: "t", values: values, defaultHTTPPort: 0, hostName: "h")
        #expect(c.amqp.nodes.map(\.host) == ["a", "b"])
        #expect(c.login == "u")
    }
}

@Suite("HTTP connection limits")
struct ConnectionLimitTests {
    /// The probes take a quarter of the descriptors and the gateway's API
    /// half: together they leave a quarter, whatever the limit, for the
    /// broker connection and files.
    @Test func theServersTogetherNeverTakeEveryDescriptor() {
        for descriptors: UInt64 in [1024, 4096, 20_000, 65_536] {
            let probes = HTTPServer.connectionLimit(descriptors: descriptors, share: 1)
            let api = HTTPServer.connectionLimit(descriptors: descriptors, share: 2)
            #expect(UInt64(probes) + UInt64(api) <= descriptors * 3 / 4, "\(descriptors): \(probes) + \(api)")
        }
        #expect(HTTPServer.connectionLimit(descriptors: 1024, share: 1) == 256)
        #expect(HTTPServer.connectionLimit(descriptors: 1024, share: 2) == 512)
        #expect(HTTPServer.connectionLimit(descriptors: 65_536, share: 2) == 16_384)
        #expect(HTTPServer.connectionLimit(descriptors: 100, share: 1) == 64, "never fewer than 64")
        #expect(HTTPServer.connectionLimit(descriptors: .max, share: 9) == 16_384, "no trap on any input")
    }
}

/// A TCP connection to 127.0.0.1:`port`; `receiveBuffer`: its SO_RCVBUF,
/// set before it connects (what the server sends beyond it waits there).
func connectTCP(port: Int, receiveBuffer: Int32? = nil) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    if var size = receiveBuffer {
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
    }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let rc = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard rc == 0 else {
        close(fd)
        throw ConnectFailed()
    }
    return fd
}
