import AMQP
import Foundation

/// The broker the integration tests run against: the project-local one that
/// `scripts/broker.sh start` runs (the test script starts it). Tests fail, not
/// skip, when it is not there.
enum TestBroker {
    static var url: AMQPURL {
        let text = ProcessInfo.processInfo.environment["FRONTDESK_TEST_AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5682/%2f"
        return try! AMQPURL(parsing: text)
    }

    static var tlsURL: AMQPURL {
        let text = ProcessInfo.processInfo.environment["FRONTDESK_TEST_AMQPS_URL"] ?? "amqps://guest:guest@localhost:5681/%2f"
        return try! AMQPURL(parsing: text)
    }

    static var certsDirectory: String {
        ProcessInfo.processInfo.environment["FRONTDESK_TEST_CERTS"] ?? "/var/tmp/frontdesk-broker/certs"
    }

    static func configuration(_ name: String, url: AMQPURL = TestBroker.url) -> AMQPConnectionConfiguration {
        AMQPConnectionConfiguration(url: url, connectionName: "frontdesk-test:\(name)")
    }

    static func connect(_ name: String) async throws -> AMQPConnection {
        try await AMQPConnection.connect(configuration(name))
    }

    /// A name no other test (or earlier run) uses.
    static func uniqueName(_ prefix: String) -> String {
        "frontdesk.test.\(prefix).\(UUID().uuidString.prefix(8).lowercased())"
    }

    /// Runs the project's broker script (`stop`, `start`, `ctl ...`).
    @discardableResult
    static func script(_ arguments: [String]) throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        // Output goes through a file, not a pipe: epmd, which the broker's
        // tools start, outlives them and would hold a pipe open for ever.
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("broker-\(UUID().uuidString).out")
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        defer { try? FileManager.default.removeItem(at: output) }
        let handle = try FileHandle(forWritingTo: output)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/bash")
        p.arguments = [root.appendingPathComponent("scripts/broker.sh").path] + arguments
        p.standardOutput = handle
        p.standardError = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        try handle.close()
        return try String(contentsOf: output, encoding: .utf8)
    }
}

/// Waits until `condition` holds, or fails the test with `what` (and what
/// `explain` adds) at the deadline.
func waitUntil(
    _ what: String, within: Duration = .seconds(20), sourceLocation: SourceLocation = #_sourceLocation,
    explain: () async -> String = { "" }, _ condition: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + within
    while !(try await condition()) {
        if ContinuousClock.now >= deadline {
            let why = await explain()
            Issue.record("timed out after \(within) waiting until \(what)\(why)", sourceLocation: sourceLocation)
            return
        }
        try await Task.sleep(for: .milliseconds(20))
    }
}

extension AsyncSequence where Self: Sendable, Element: Sendable {
    /// The first `n` elements, or what arrived before `timeout`.
    func first(_ n: Int, timeout: Duration) async throws -> [Element] {
        try await withThrowingTaskGroup(of: [Element].self) { group in
            let collected = CollectedElements<Element>()
            group.addTask {
                for try await e in self {
                    if await collected.append(e) >= n { break }
                }
                return await collected.all
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                return await collected.all
            }
            let result = try await group.next()!
            group.cancelAll()
            return result
        }
    }
}

actor CollectedElements<Element: Sendable> {
    var all: [Element] = []
    func append(_ e: Element) -> Int {
        all.append(e)
        return all.count
    }
}

import Testing

/// Every integration suite nests in here: `.serialized` keeps them from
/// running at once, since one of them restarts the shared broker.
@Suite("Integration against the local broker", .serialized)
struct BrokerIntegration {}
