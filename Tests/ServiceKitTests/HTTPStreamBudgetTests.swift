import Foundation
import Glibc
@testable import ServiceKit
import Synchronization
import Testing

/// A client on a socket of its own with a small receive buffer, that reads
/// nothing until `readAll`.
private final class QuietClient {
    let fd: Int32

    init(port: Int, path: String, receiveBuffer: Int32? = 4096) throws {
        fd = try connectTCP(port: port, receiveBuffer: receiveBuffer)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = "GET \(path) HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
    }

    /// Every byte until the server closes (or 10 s pass without one), the head included.
    func readAll() -> Int {
        var total = 0
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { return total }
            total += n
        }
    }

    deinit { close(fd) }
}

@Suite("HTTP streams' shared budget")
struct HTTPStreamBudgetTests {
    /// All streams' buffers together hold at most the server's budget: when
    /// two clients read nothing, the one that has taken nothing for longer is
    /// cut off (its buffer freed), and the other keeps its stream and gets
    /// every byte once it reads. (Each alone stays under its own limit.)
    @Test func overTheBudgetTheStreamThatWaitedLongestIsCut() async throws {
        let streams = Mutex<[String: HTTPStream]>([:])
        let server = try AsyncHTTPServer(
            host: "127.0.0.1", port: 0, maxBody: 0, streamBudget: 3 << 20, headers: [], query: []
        ) { request, responder in
            if let stream = responder.stream(status: 200, contentType: "application/octet-stream") {
                streams.withLock { $0[request.path] = stream }
            }
        }
        defer { server.stop() }
        let piece = Data(repeating: 0x61, count: 64 << 10)
        func stream(_ path: String) async throws -> HTTPStream {
            let deadline = ContinuousClock.now + .seconds(10)
            while ContinuousClock.now < deadline {
                if let s = streams.withLock({ $0[path] }) { return s }
                try await Task.sleep(for: .milliseconds(5))
            }
            throw HTTPServerError("\(path) was not answered")
        }
        /// Writes in pieces (as events come), letting the server's thread hand
        /// the kernel what it takes, until `done`: the bytes written, or nil
        /// once a write was refused (the stream cut off).
        func fill(_ s: HTTPStream, until done: () -> Bool) async throws -> Int? {
            var written = 0
            while !done(), written < 64 << 20 {
                guard s.write(piece, limit: Int.max / 2) else { return nil }
                written += piece.count
                try await Task.sleep(for: .milliseconds(1))
            }
            return written
        }
        // The first client's bytes fill what the kernel keeps for it, then 2 MiB wait in the server.
        let first = try QuietClient(port: server.port, path: "/first")
        let firstStream = try await stream("/first")
        let firstWritten = try #require(try await fill(firstStream) { server.streamBufferBytes >= 2 << 20 }, "alone, under the budget")
        // The second's fill the rest: past 3 MiB together, the first (waiting longer) is cut, not the second.
        let second = try QuietClient(port: server.port, path: "/second")
        let secondStream = try await stream("/second")
        let secondWritten = try #require(try await fill(secondStream) { firstStream.isClientGone }, "the second is not the one cut")
        #expect(!firstStream.write(piece, limit: Int.max / 2), "the first was cut off")
        #expect(server.streamBufferBytes <= 3 << 20)
        #expect(secondStream.write(Data(), end: true, limit: Int.max / 2))
        let secondRead = second.readAll()
        #expect(secondRead > secondWritten, "the second got all \(secondWritten) bytes and its head: \(secondRead)")
        let firstRead = first.readAll()
        #expect(firstRead < firstWritten, "the first got only what was sent before the cut: \(firstRead) of \(firstWritten)")
    }

    /// A stream whose client took everything keeps no large buffer: idle
    /// streams are most streams, and their buffers count against the budget
    /// too (a 64 KiB one kept by each of 4,096 idle streams filled 256 MiB).
    @Test func anIdleStreamKeepsNoLargeBuffer() async throws {
        let streams = Mutex<[HTTPStream]>([])
        let server = try AsyncHTTPServer(host: "127.0.0.1", port: 0, maxBody: 0, streamBudget: 3 << 20, headers: [], query: []) { _, responder in
            if let stream = responder.stream(status: 200, contentType: "application/octet-stream") { streams.withLock { $0.append(stream) } }
        }
        defer { server.stop() }
        let client = try QuietClient(port: server.port, path: "/idle", receiveBuffer: nil)  // the kernel takes it all
        let deadline = ContinuousClock.now + .seconds(10)
        while streams.withLock({ $0.isEmpty }), ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        let stream = try #require(streams.withLock { $0.first })
        #expect(stream.write(Data(repeating: 0x61, count: 200 << 10), limit: Int.max / 2))
        let drained = ContinuousClock.now + .seconds(10)
        while server.streamBufferBytes > 0, ContinuousClock.now < drained { try await Task.sleep(for: .milliseconds(5)) }
        #expect(server.streamBufferBytes == 0, "the open, idle stream's buffer went")
        #expect(stream.write(Data("more".utf8), end: true))
        #expect(client.readAll() > 200 << 10)
    }
}
