import CRabbitMQ
import Dispatch
import Glibc
import Synchronization

/// The part of one connection that any thread may touch: the command inbox,
/// the eventfd that wakes the owner thread, and the connection's end.
///
/// Commands are closures run on the owner thread with its `ConnectionLoop`;
/// that loop is the only code that touches the rabbitmq-c handle.
final class ConnectionCore: Sendable {
    typealias Command = @Sendable (ConnectionLoop) -> Void

    private struct State {
        var commands: [Command] = []
        var accepting = true
        var ended = false
        var endError: AMQPError?
        var failure: AMQPError?
        var endWaiters: [CheckedContinuation<AMQPError?, Never>] = []
        var blockedReason: String?
        /// True while the owner thread waits in poll(2): only then does a
        /// new command need the eventfd write that wakes it.
        var ownerIsWaiting = false
        /// The connection's socket while its handle lives (-1 before and after).
        var socket: Int32 = -1
        /// Turns of the owner thread's loop that reached their wait
        /// (`prepareToWait`); a turn that skips it (rabbitmq-c still holds
        /// bytes) is followed within milliseconds by one that does not.
        var turns: UInt64 = 0
    }

    private let state = Mutex(State())
    private let wakeFD: Int32
    let name: String
    private let republished = Atomic<Int>(0)
    private let abandoning = Atomic<Bool>(false)
    private let abandoned = Atomic<Bool>(false)

    /// Set for a stop: an RPC on this connection while the broker blocks
    /// it drops the connection instead of waiting for an answer
    /// (`AMQPConnection.abandonWhenBlocked`).
    var abandonsWhenBlocked: Bool { abandoning.load(ordering: .relaxed) }
    func abandonWhenBlocked(cutAfterMs: Int = ConnectionLoop.stoppingRPCTimeoutMs) {
        let first = !abandoning.exchange(true, ordering: .relaxed)
        // An RPC already waiting on the owner thread would wait out its
        // timeout: shutting the socket down ends that wait with an error.
        let (turn, busy) = state.withLock { s -> (UInt64, Bool) in
            if s.blockedReason != nil { dropSocket(&s) }
            return (s.turns, !s.ownerIsWaiting)
        }
        guard first else { return }
        // Later RPCs wait less. One already waiting may be on a block the
        // broker has sent but rabbitmq-c holds unread: if that turn of the
        // loop has not ended by then, it is cut short the same way, and the
        // connection counts as dropped for the stop (were it merely slow,
        // what it held unacked is delivered again: a duplicate, not a loss).
        _ = submit { loop in loop.useStoppingRPCTimeout() }
        guard busy else { return }
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(cutAfterMs)) { [self] in
            state.withLock { s in
                if s.turns == turn, !s.ownerIsWaiting { dropSocket(&s) }
            }
        }
    }

    /// Dropped for a stop (`abandonWhenBlocked`): the client does not connect again.
    var wasAbandoned: Bool { abandoned.load(ordering: .relaxed) }
    func noteAbandoned() { abandoned.store(true, ordering: .relaxed) }

    private let closing = Atomic<Bool>(false)

    /// Set once the connection is being closed or has failed (its loop
    /// notes it at once, before the connection's end is signalled):
    /// `AMQPConnection.isOpen` is false from then on, so loops that sleep
    /// on the connection stop, rather than spin on sleeps that return at once.
    var isClosing: Bool { closing.load(ordering: .acquiring) }
    /// `failure`: why it failed (the first reason kept); nil for a close.
    func noteClosing(failure: AMQPError? = nil) {
        if let failure { state.withLock { s in if s.failure == nil { s.failure = failure } } }
        closing.store(true, ordering: .releasing)
    }
    /// Why the connection failed, from the moment it did; nil after a close.
    var failure: AMQPError? { state.withLock { $0.failure } }

    private func dropSocket(_ s: inout State) {
        guard s.socket >= 0 else { return }
        noteAbandoned()
        _ = Glibc.shutdown(s.socket, Int32(SHUT_RDWR))
    }

    /// A duplicate of the owner thread's socket, for `abandonWhenBlocked`:
    /// rabbitmq-c may close its own descriptor (an RPC or heartbeat timeout)
    /// and the number be reused; the duplicate names the same socket until
    /// `forgetSocket()`, called before the handle is destroyed.
    func noteSocket(_ fd: Int32) {
        let copy = fd >= 0 ? dup(fd) : -1
        state.withLock { $0.socket = copy }
    }
    func forgetSocket() {
        let fd = state.withLock { s -> Int32 in
            defer { s.socket = -1 }
            return s.socket
        }
        if fd >= 0 { _ = Glibc.close(fd) }
    }

    /// Messages published again because their confirms were overdue.
    var republishedCount: Int { republished.load(ordering: .relaxed) }
    func noteRepublished(_ count: Int) { republished.add(count, ordering: .relaxed) }

    private let redirected = Atomic<Int>(0)
    private let reoffered = Atomic<Int>(0)
    /// Nacked messages published again to their `ifNacked` way.
    var redirectedCount: Int { redirected.load(ordering: .relaxed) }
    /// Refused messages offered again to their own exchange (`ConnectionLoop+Reoffer`).
    var reofferedCount: Int { reoffered.load(ordering: .relaxed) }
    func noteReoffered(_ count: Int) { reoffered.add(count, ordering: .relaxed) }
    private let reofferDropped = Atomic<Int>(0)
    /// Refused messages not offered again: more bytes waited than the bound.
    var reofferDroppedCount: Int { reofferDropped.load(ordering: .relaxed) }
    func noteReofferDropped() { reofferDropped.add(1, ordering: .relaxed) }

    private let redirectedEpoch = Atomic<UInt64>(0)
    /// The channel (by epoch; 0: none) whose nacked publish was last sent to
    /// its `ifNacked` way: its caller did not see the nack, and still retires
    /// the channel (`AMQPClient.retireIfNacked`).
    var lastRedirectedEpoch: UInt64 { redirectedEpoch.load(ordering: .acquiring) }
    func noteRedirected(_ count: Int, channelEpoch: UInt64) {
        redirected.add(count, ordering: .relaxed)
        redirectedEpoch.store(channelEpoch, ordering: .releasing)
    }

    init(name: String) {
        self.name = name
        wakeFD = fd_eventfd_create()
    }

    deinit {
        // Closed only here: while anyone can still submit, the descriptor stays valid.
        close(wakeFD)
    }

    var wakeDescriptor: Int32 { wakeFD }

    /// Queues a command for the owner thread; false once the connection has ended.
    func submit(_ command: @escaping Command) -> Bool {
        let (accepted, needsWake) = state.withLock { s -> (Bool, Bool) in
            guard s.accepting else { return (false, false) }
            s.commands.append(command)
            let wake = s.ownerIsWaiting
            s.ownerIsWaiting = false
            return (true, wake)
        }
        if needsWake { wake() }
        return accepted
    }

    /// The commands queued so far. Taken by swapping: keeping the capacity
    /// of an array whose storage is handed out allocated a fresh one on
    /// every turn of the loop, even with nothing queued (3% of the sender's
    /// user-space samples at 166/s).
    func drain() -> [Command] {
        state.withLock { s in
            guard !s.commands.isEmpty else { return [] }
            var c: [Command] = []
            swap(&c, &s.commands)
            return c
        }
    }

    /// Refuses further commands and hands back those still queued, so the
    /// loop can fail them.
    func stopAccepting() -> [Command] {
        state.withLock { s in
            s.accepting = false
            let c = s.commands
            s.commands = []
            return c
        }
    }

    var hasCommands: Bool { state.withLock { !$0.commands.isEmpty } }

    /// Called by the owner thread before it waits: false when a command
    /// arrived meanwhile and it should not wait at all.
    func prepareToWait() -> Bool {
        state.withLock { s in
            s.turns &+= 1
            guard s.commands.isEmpty else { return false }
            s.ownerIsWaiting = true
            return true
        }
    }

    func finishedWaiting() {
        state.withLock { $0.ownerIsWaiting = false }
    }

    func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    func clearWake() {
        var value: UInt64 = 0
        _ = read(wakeFD, &value, 8)
    }

    var blockedReason: String? {
        get { state.withLock { $0.blockedReason } }
        set { state.withLock { $0.blockedReason = newValue } }
    }

    var endError: AMQPError? { state.withLock { $0.endError } }
    var hasEnded: Bool { state.withLock { $0.ended } }

    /// Marks the connection ended and wakes everyone waiting for that.
    func end(_ error: AMQPError?) {
        noteClosing()
        let waiters = state.withLock { s -> [CheckedContinuation<AMQPError?, Never>] in
            guard !s.ended else { return [] }
            s.ended = true
            s.endError = error
            let w = s.endWaiters
            s.endWaiters = []
            return w
        }
        for w in waiters { w.resume(returning: error) }
    }

    /// Waits until the connection ends; returns the error that ended it, or
    /// nil after a clean close.
    func waitForEnd() async -> AMQPError? {
        await withCheckedContinuation { (c: CheckedContinuation<AMQPError?, Never>) in
            let done: (Bool, AMQPError?) = state.withLock { s in
                if s.ended { return (true, s.endError) }
                s.endWaiters.append(c)
                return (false, nil)
            }
            if done.0 { c.resume(returning: done.1) }
        }
    }

    var closedError: AMQPError {
        endError ?? AMQPError(.connectionClosed, "the connection \(name) is closed")
    }

    /// Returns after `duration`, timed by the owner thread's own wait: a task
    /// on this connection's executor resumes there without another thread's
    /// timer. Returns early once the connection ends, and at once if it has.
    /// Not cancellable: meant for short pauses.
    func sleep(for duration: Duration) async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let deadline = ContinuousClock.now + duration
            let accepted = submit { loop in loop.addTimer(at: deadline) { c.resume() } }
            if !accepted { c.resume() }
        }
    }

    /// Runs `body` on the owner thread and returns its result.
    func perform<T: Sendable>(_ body: @escaping @Sendable (ConnectionLoop) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<T, Error>) in
            let accepted = submit { loop in c.resume(with: Result { try body(loop) }) }
            if !accepted { c.resume(throwing: closedError) }
        }
    }

    /// Runs `body` on the owner thread, which resumes the continuation when the
    /// result is known (a publisher confirm, for one).
    func performDeferred<T: Sendable>(
        _ body: @escaping @Sendable (ConnectionLoop, CheckedContinuation<T, Error>) -> Void
    ) async throws -> T {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<T, Error>) in
            let accepted = submit { loop in body(loop, c) }
            if !accepted { c.resume(throwing: closedError) }
        }
    }
}
