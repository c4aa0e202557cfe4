import Foundation
import Testing

/// The harness itself: a port something else listens on is not handed to a
/// service (a leftover cluster node's distribution port once made three
/// gateway starts in a row fail).
@Suite("Test harness ports")
struct HarnessPortTests {
    @Test func aPortSomeoneListensOnIsNotFree() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = INADDR_ANY
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { a in
                bind(fd, a, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, a, &length) == 0
            }
        }
        guard bound else { close(fd); Issue.record("could not listen"); return }
        let port = Int(UInt16(bigEndian: address.sin_port))
        #expect(!TestPorts.isFree(port))
        close(fd)
        #expect(TestPorts.isFree(port))
    }
}

extension BrokerIntegration {
    /// A wait that times out on a stalled service leaves every thread's
    /// stack of each service still running beside its log: how a wedged
    /// connection thread was finally found, and how the next would be.
    @Suite("Test harness thread dumps", .timeLimit(.minutes(2)))
    struct HarnessThreadDumpTests {
        @Test func aTimedOutWaitSavesEachRunningServicesThreads() async throws {
            try #require(FileManager.default.isExecutableFile(atPath: RouterHarness.gdb), "gdb is not installed (scripts/install-deps.sh installs it)")
            try await withHarness("thread-dump") { h in
                let router = try await h.startRouter()
                let dir = FileManager.default.temporaryDirectory.appendingPathComponent("threads-\(h.vhost)").path
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
                defer { try? FileManager.default.removeItem(atPath: dir) }
                h.threadDumpDirectory = dir
                // A wait that cannot succeed: its timeout is the known issue here.
                await withKnownIssue {
                    try await h.waitUntil("a condition that never holds", within: .milliseconds(100)) { false }
                }
                let files = try FileManager.default.contentsOfDirectory(atPath: dir)
                #expect(files.count == 1 && files[0].hasSuffix(".threads.txt"), "\(files)")
                let text = try String(contentsOfFile: "\(dir)/\(files.first ?? "")", encoding: .utf8)
                // The router's own connection thread, named by its loop, is among them.
                #expect(text.contains("ConnectionLoop"), "\(text.prefix(600))")
                // gdb let the service go on (a process gdb left stopped would still count as running).
                let port = try #require(h.ports[router.processIdentifier])
                try await h.waitUntil("the router answers its probe again", within: .seconds(10)) {
                    (try? await h.probe(port: port, path: "/readyz")) == 200
                }
            }
        }
    }
}
