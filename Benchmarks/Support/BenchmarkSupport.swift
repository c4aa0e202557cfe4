import Foundation
import Glibc
import Synchronization

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

/// The processes a benchmark starts (services, agents, stages), killed with
/// it when it is interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT): otherwise
/// they run on, and a later run or profile measures them.
public enum Children {
    /// Runs `p`, recorded until Foundation reaps it (its `terminationHandler`
    /// is kept and called after). The first call installs the interrupt handler.
    public static func run(_ p: Process) throws {
        _ = installed
        let slot = claimed.wrappingAdd(1, ordering: .relaxed).oldValue
        guard slot < capacity else {
            FileHandle.standardError.write(Data("\(ProcessInfo.processInfo.processName): more than \(capacity) processes; an interrupt leaves the rest running\n".utf8))
            return try p.run()
        }
        // -1 once reaped; the pid goes in only over a slot still 0, so a
        // child that ended before its pid was stored is never signalled.
        let prior = p.terminationHandler
        p.terminationHandler = { done in
            pids[slot].store(-1, ordering: .releasing)
            prior?(done)
        }
        try p.run()
        _ = pids[slot].compareExchange(expected: 0, desired: p.processIdentifier, ordering: .acquiringAndReleasing)
    }

    /// A signal handler may only read memory and call async-signal-safe
    /// functions: a fixed table of atomics, every slot claimed once and
    /// cleared when its child is reaped, so a reused pid is never hit.
    static let capacity = 256
    nonisolated(unsafe) static let pids: UnsafeMutablePointer<Atomic<Int32>> = {
        let table = UnsafeMutablePointer<Atomic<Int32>>.allocate(capacity: capacity)
        for i in 0..<capacity { (table + i).initialize(to: Atomic(0)) }
        return table
    }()
    static let claimed = Atomic<Int>(0)

    /// SIGKILL to every child still running (an interrupted run's figures are
    /// gone anyway), then the bench ends by that signal. Safe in a handler:
    /// once initialised here, reading a static is one acquire load (the
    /// runtime's swift_once fast path on Linux), and kill, signal and raise
    /// are async-signal-safe. A handler, not an
    /// ignored signal with a Dispatch source: an ignored signal would stay
    /// ignored in every child started after it. Installed from `run`, after
    /// the table and count exist: the handler must not be the first to touch
    /// them (a module's globals are initialised lazily).
    static let installed: Void = {
        _ = pids
        _ = claimed.load(ordering: .relaxed)
        let signals = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { signal in
            let count = min(claimed.load(ordering: .acquiring), capacity)
            var i = 0
            while i < count {
                let pid = pids[i].load(ordering: .acquiring)
                if pid > 0 { kill(pid, SIGKILL) }  // never 0 or -1: those are process groups
                i += 1
            }
            Glibc.signal(signal, SIG_DFL)
            raise(signal)
        }
        sigemptyset(&action.sa_mask)
        for s in signals { sigaddset(&action.sa_mask, s) }
        for s in signals { sigaction(s, &action, nil) }
    }()
}
