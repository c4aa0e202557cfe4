import Foundation

/// `--name value` from the command line, or `fallback`.
public func argument(_ name: String, _ fallback: String) -> String {
    let args = CommandLine.arguments
    if let i = args.firstIndex(of: name), i + 1 < args.count { return args[i + 1] }
    return fallback
}

/// Runs `scripts/broker.sh ctl ARGS` (the benchmarks run from the repository).
public func brokerCtl(_ arguments: [String]) throws {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/bash")
    p.arguments = ["scripts/broker.sh", "ctl"] + arguments
    p.standardOutput = FileHandle.nullDevice
    p.standardError = FileHandle.nullDevice
    try p.run()
    p.waitUntilExit()
}

extension Duration {
    /// The duration in seconds, as a Double.
    public var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
