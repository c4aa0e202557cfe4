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

/// What /proc tells of a running process.
public enum ProcStats {
    /// User + system CPU seconds so far (fields 14 and 15 of /proc/PID/stat).
    public static func cpuSeconds(_ pid: Int32) -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        // After "pid (comm)": field 3 is state, so utime (14) is index 11 here.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// User + system CPU seconds so far, all its threads, from the process's
    /// CPU clock: nanoseconds, where /proc counts 10 ms ticks.
    public static func cpuClockSeconds(_ pid: Int32) -> Double? {
        var clock = clockid_t()
        var now = timespec()
        guard clock_getcpuclockid(pid, &clock) == 0, clock_gettime(clock, &now) == 0 else { return nil }
        return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
    }

    /// Jiffies of all cores so far from /proc/stat: busy (user, nice, system,
    /// irq, softirq, steal) and the total with idle and iowait.
    public static func machineJiffies() -> (busy: Double, total: Double)? {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = stat.split(separator: "\n").first, line.hasPrefix("cpu ") else { return nil }
        let v = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard v.count >= 8 else { return nil }
        let idle = v[3] + v[4]
        let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
        return (busy, busy + idle)
    }

    /// The peak resident set size in MiB (VmHWM).
    public static func peakRSSMiB(_ pid: Int32) -> Double? { statusField("VmHWM", pid).map { $0 / 1024 } }

    /// The current resident set size in MiB (VmRSS).
    public static func rssMiB(_ pid: Int32) -> Double? { statusField("VmRSS", pid).map { $0 / 1024 } }

    private static func statusField(_ name: String, _ pid: Int32) -> Double? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix(name + ":") {
            return Double(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
        }
        return nil
    }
}
