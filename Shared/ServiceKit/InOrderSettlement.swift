import Synchronization

/// Runs the settle work of numbered items strictly in their order, on the
/// thread that completes the item at the head — for work that must not
/// overtake (a `multiple` ack covers every lower delivery tag) and is
/// usually a few non-blocking calls, so that the thread that learns of an
/// outcome (a connection's own thread, for publisher confirms) settles it
/// without a task in between.
///
/// Work that has to wait (a back-off before handing messages back) runs in a
/// task; later items wait for it.
public final class InOrderSettlement: Sendable {
    /// What settling one item takes.
    public enum Work: Sendable {
        /// Quick, non-blocking: runs on the completing thread.
        case now(@Sendable () -> Void)
        /// Has to wait: runs in a task, and later items wait for it.
        case later(@Sendable () async -> Void)
    }

    private struct State {
        var issued: UInt64 = 0
        var next: UInt64 = 0
        var ready: [UInt64: Work] = [:]
        /// Someone is running the work at the head.
        var running = false
        var idleWaiters: [CheckedContinuation<Void, Never>] = []

        var idle: Bool { !running && next == issued }
    }

    private let state = Mutex(State())

    public init() {}

    /// Numbers the next item; call in the order the items must settle.
    public func issue() -> UInt64 {
        state.withLock { s in
            defer { s.issued += 1 }
            return s.issued
        }
    }

    /// Item `number`'s outcome is known: its work runs once every earlier
    /// item has settled (now, if it is at the head and nothing runs).
    public func complete(_ number: UInt64, _ work: Work) {
        state.withLock { $0.ready[number] = work }
        drain()
    }

    /// Returns once every issued item has settled.
    public func idle() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = state.withLock { s -> Bool in
                if s.idle { return true }
                s.idleWaiters.append(c)
                return false
            }
            if now { c.resume() }
        }
    }

    private func drain() {
        while true {
            let work = state.withLock { s -> Work? in
                guard !s.running, let w = s.ready.removeValue(forKey: s.next) else { return nil }
                s.running = true
                s.next += 1
                return w
            }
            guard let work else { return resumeIdleWaiters() }
            switch work {
            case .now(let run):
                run()
                state.withLock { $0.running = false }
            case .later(let run):
                Task {
                    await run()
                    state.withLock { $0.running = false }
                    drain()
                }
                return
            }
        }
    }

    private func resumeIdleWaiters() {
        let waiters = state.withLock { s -> [CheckedContinuation<Void, Never>] in
            guard s.idle else { return [] }
            defer { s.idleWaiters = [] }
            return s.idleWaiters
        }
        for w in waiters { w.resume() }
    }
}
