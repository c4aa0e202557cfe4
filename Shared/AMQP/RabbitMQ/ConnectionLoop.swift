import CRabbitMQ
import Foundation
import Glibc

/// The owner of one rabbitmq-c connection. It lives on the connection's own
/// thread and is never touched from anywhere else: rabbitmq-c is blocking and
/// not thread-safe per connection. Other threads reach it through
/// `ConnectionCore` commands.
final class ConnectionLoop {
    let core: ConnectionCore
    let conn: amqp_connection_state_t
    let heartbeatSeconds: Int
    /// The frame size negotiated at tune (0, no limit, is read as the default).
    let frameMax: Int
    let channelMax: Int
    /// Plain TCP: publish windows and acknowledgements are encoded into
    /// `output` and written once a turn of the loop (`flushOutput`); over TLS
    /// every frame goes through rabbitmq-c.
    let writesWindows: Bool
    var channels: [UInt16: ChannelState] = [:]
    /// Deliveries and returns whose header and body frames are still coming, by channel.
    var arriving: [UInt16: ArrivingContent] = [:]
    private var nextChannelHint: UInt16 = 1
    private var nextEpoch: UInt64 = 1
    /// Set once the connection has failed or closed; every later command fails with it.
    private(set) var failure: AMQPError?
    private var closeRequested = false
    private var lastHeartbeatSent = ContinuousClock.now

    /// The C memory of the window being published, reset after each.
    let publishArena = CArena()
    /// What this turn of the loop writes (plain TCP), kept for the next turn.
    /// Anything written through rabbitmq-c itself calls `flushOutput` first,
    /// so the broker sees every frame in the order it was made.
    let output: OpaquePointer? = fd_buffer_create()
    /// Output past this much is written at once rather than at the end of the turn.
    static let outputFlushBytes = 256 * 1024

    let confirmTimeout: Duration
    /// When a repeatable message still waiting for its confirm is published again.
    let republishAfter: Duration
    /// At most this many copies a sweep (every 100 ms): a broker slow to
    /// confirm gets its repeatable messages again at a bounded pace.
    static let maxCopiesPerSweep = 256
    /// How often overdue confirms are looked for (expired, copied) and retired channels closed.
    static let confirmSweepInterval = Duration.milliseconds(100)
    private var lastConfirmSweep = ContinuousClock.now
    /// Messages a queue refused, to offer again (`ConnectionLoop+Reoffer`):
    /// their bodies' bytes, and the confirming channel they go on.
    var reoffers: [Reoffer] = []
    var reofferBytes = 0
    var reofferChannel: ChannelState?
    var lastReofferRound = ContinuousClock.now
    /// Sleepers timed by this thread's own wait (`ConnectionCore.sleep`): a
    /// task on the connection's executor pauses without another thread's
    /// timer waking it and then this one. Few at a time: scanned, not sorted.
    private var timers: [(deadline: ContinuousClock.Instant, wake: () -> Void)] = []

    init(
        core: ConnectionCore, conn: amqp_connection_state_t, heartbeatSeconds: Int, confirmTimeout: Duration,
        republishAfter: Duration, writesWindows: Bool
    ) {
        self.core = core
        self.writesWindows = writesWindows
        self.confirmTimeout = confirmTimeout
        self.republishAfter = republishAfter
        self.conn = conn
        self.heartbeatSeconds = heartbeatSeconds
        let frame = Int(amqp_get_frame_max(conn))
        frameMax = frame == 0 ? AMQPURL.defaultFrameMax : frame
        let max = Int(amqp_get_channel_max(conn))
        channelMax = max == 0 ? 65535 : max
        core.noteSocket(amqp_get_sockfd(conn))
    }

    deinit { fd_buffer_free(output) }

    /// Runs until the connection ends, then fails what is left and frees the handle.
    func run() {
        // Read when poll said the socket has something (or rabbitmq-c holds
        // frames or bytes already): a read on an empty socket costs a recv
        // that fails and a poll inside rabbitmq-c, on every wake-up. And at
        // least every 200 ms: a read is where rabbitmq-c notices missed
        // heartbeats (a broker gone silent without closing the socket).
        var readable = true
        var lastRead = ContinuousClock.now
        while failure == nil {
            let commands = core.drain()
            for command in commands { command(self) }
            // One write for the turn's acks and publishes, not one each.
            flushOutput()
            if closeRequested || failure != nil { break }
            let now = ContinuousClock.now
            if readable || amqp_frames_enqueued(conn) != 0 || amqp_data_in_buffer(conn) != 0 || now - lastRead >= .milliseconds(200) {
                pumpFrames()
                readable = false
                lastRead = now
            }
            if failure != nil { break }
            sendHeartbeatIfDue()
            expireConfirmsIfDue()
            // A woken sleeper's task is queued as a command: the loop turns
            // again before it waits.
            let timeoutMs = wakeDueTimers()
            // Wait at once, without spinning first: measured with
            // pipeline-bench, 50 turns of sched_yield after work cost CPU and
            // bought no latency. `prepareToWait` re-checks for commands.
            flushOutput()
            if amqp_frames_enqueued(conn) == 0, amqp_data_in_buffer(conn) == 0, core.prepareToWait() {
                readable = waitForInput(timeoutMs: timeoutMs)
                core.finishedWaiting()
            }
        }
        if closeRequested && failure == nil {
            flushOutput()
            // For a stop, a blocked connection's close-ok would come only
            // once the alarm clears (the broker reads nothing from it): drop it instead.
            if !droppedWhileBlocked() {
                _ = amqp_connection_close(conn, Int32(AMQP_REPLY_SUCCESS))
            }
            failure = AMQPError(.connectionClosed, "the connection \(core.name) was closed")
            finish(nil)
        } else {
            finish(failure)
        }
    }

    private func finish(_ error: AMQPError?) {
        let ending = error ?? AMQPError(.connectionClosed, "the connection \(core.name) was closed")
        for ch in channels.values { ch.fail(ending) }
        channels.removeAll()
        // Sleepers end early; any that race with the end are woken as they come (`addTimer`).
        let sleepers = timers
        timers = []
        for t in sleepers { t.wake() }
        // Commands that raced with the end run against the failed loop and fail.
        for command in core.stopAccepting() { command(self) }
        core.forgetSocket()
        amqp_destroy_connection(conn)
        core.end(error)
    }

    func requestClose() {
        closeRequested = true
        core.noteClosing()
    }

    /// Failed or closing: the loop ends at its next turn and runs no more
    /// tasks' jobs (`ConnectionTaskExecutor`).
    var isEnding: Bool { failure != nil || closeRequested }

    /// Calls `wake` on this thread once `deadline` has passed, or at once
    /// when the connection has ended (it never turns again).
    func addTimer(at deadline: ContinuousClock.Instant, _ wake: @escaping () -> Void) {
        guard failure == nil, !closeRequested else { return wake() }
        timers.append((deadline, wake))
    }

    /// Wakes the sleepers whose deadline has passed; returns how long the
    /// loop may wait for input: 200 ms, or less until the next deadline
    /// (rounded up to whole milliseconds, so it never spins before one).
    private func wakeDueTimers() -> Int32 {
        guard !timers.isEmpty else { return 200 }
        let now = ContinuousClock.now
        var due: [() -> Void] = []
        var next = now + .milliseconds(200)
        timers.removeAll { t in
            if t.deadline <= now {
                due.append(t.wake)
                return true
            }
            next = min(next, t.deadline)
            return false
        }
        for wake in due { wake() }
        // Rounded up: a wait of 0.3 ms is 1 ms, not a busy turn.
        let (seconds, attoseconds) = (next - now).components
        let ms = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(clamping: max(0, min(200, ms)))
    }

    /// Waits for the socket or a command; true when the socket has
    /// something to read (or an error to report).
    private func waitForInput(timeoutMs: Int32) -> Bool {
        var fds = [
            pollfd(fd: amqp_get_sockfd(conn), events: Int16(POLLIN), revents: 0),
            pollfd(fd: core.wakeDescriptor, events: Int16(POLLIN), revents: 0),
        ]
        _ = poll(&fds, 2, timeoutMs)
        if fds[1].revents != 0 { core.clearWake() }
        return fds[0].revents != 0
    }

    private func expireConfirmsIfDue() {
        let now = ContinuousClock.now
        guard now - lastConfirmSweep >= Self.confirmSweepInterval else { return }
        lastConfirmSweep = now
        var settled: [ChannelState] = []
        for ch in channels.values {
            guard !ch.pending.isEmpty else {
                if let since = ch.closeWhenSettled, now - since >= Self.confirmSweepInterval { settled.append(ch) }
                continue
            }
            ch.expireConfirms(olderThan: confirmTimeout, now: now)
            // Published again only while the broker takes publishes: a
            // blocked connection would fail the copy, and so its message.
            guard core.blockedReason == nil, ch.closedError == nil else { continue }
            let copies = ch.republishOverdue(after: republishAfter, now: now, limit: Self.maxCopiesPerSweep) { message, copy in
                publish(ch, [message], batch: copy)
            }
            if copies > 0 { core.noteRepublished(copies) }
        }
        for ch in settled { closeChannel(ch) }
        reofferDue(now: now)
    }

    private func sendHeartbeatIfDue() {
        guard heartbeatSeconds > 0 else { return }
        let now = ContinuousClock.now
        guard now - lastHeartbeatSent >= .milliseconds(heartbeatSeconds * 1000 / 2) else { return }
        lastHeartbeatSent = now
        flushOutput()
        guard failure == nil else { return }
        let rc = fd_amqp_send_heartbeat(conn)
        if rc != AMQP_STATUS_OK.rawValue { fail(.library(rc, "sending a heartbeat")) }
    }

    /// Writes what this turn has buffered (a no-op when empty or over TLS).
    /// A failed write ends the connection, which fails every pending confirm.
    func flushOutput() {
        guard failure == nil, fd_buffer_length(output) > 0 else { return }
        let rc = fd_buffer_flush(conn, output)
        if rc != AMQP_STATUS_OK.rawValue { fail(.library(rc, "writing to the broker")) }
    }

    /// Writes what this turn has buffered before rabbitmq-c writes itself
    /// (an RPC, a channel open); throws if that write, or anything before
    /// it, ended the connection, so nothing is written after a cut-off frame.
    func flushBeforeDirectWrite() throws {
        flushOutput()
        _ = droppedWhileBlocked()
        if let failure { throw failure }
    }

    /// How long an RPC may wait once the connection is being stopped
    /// (`ConnectionCore.abandonWhenBlocked`): long enough for a busy broker's
    /// answer, short enough that a block it has not yet reported does not
    /// hold the stop for the full RPC timeout.
    static let stoppingRPCTimeoutMs = 5000

    func useStoppingRPCTimeout() {
        var timeout = timeval(tv_sec: Self.stoppingRPCTimeoutMs / 1000, tv_usec: (Self.stoppingRPCTimeoutMs % 1000) * 1000)
        _ = amqp_set_rpc_timeout(conn, &timeout)
    }

    /// For a stop (`ConnectionCore.abandonsWhenBlocked`): true, and the
    /// connection ends, if the broker blocks it. It reads nothing from a
    /// blocked connection, so an RPC would be answered only once the alarm
    /// clears; dropped, what it held unacked goes back to its queues once
    /// the broker reads again.
    func droppedWhileBlocked() -> Bool {
        guard core.abandonsWhenBlocked, let reason = core.blockedReason else { return false }
        core.noteAbandoned()
        fail(AMQPError(.connectionClosed, "the connection \(core.name) was dropped while the broker blocks it (\(reason))"))
        return true
    }

    /// Flushes when a burst has buffered more than `outputFlushBytes`.
    func flushOutputIfLarge() {
        if fd_buffer_length(output) >= Self.outputFlushBytes { flushOutput() }
    }

    /// Ends the connection with `error` (the loop exits at its next turn).
    func fail(_ error: AMQPError) {
        guard failure == nil else { return }
        failure = error
        // A write that fails while closing (the socket already gone) does not
        // make a close of our own a failure.
        core.noteClosing(failure: closeRequested ? nil : error)
    }

    /// Throws if the connection has ended.
    func ensureOpen() throws {
        if let failure { throw failure }
        if closeRequested { throw AMQPError(.connectionClosed, "the connection \(core.name) is closing") }
    }

    /// The open channel `id` of this `epoch`, or the error that closed it.
    func channel(_ id: UInt16, epoch: UInt64? = nil) throws -> ChannelState {
        try ensureOpen()
        guard let ch = channels[id], epoch == nil || ch.epoch == epoch else {
            throw AMQPError(.channelClosed, "channel \(id) is closed")
        }
        if let e = ch.closedError { throw e }
        return ch
    }

    // MARK: - Channels

    func openChannel() throws -> ChannelState {
        try ensureOpen()
        guard let id = freeChannelID() else {
            throw AMQPError(.library, "no free channel: all \(channelMax) are open")
        }
        try flushBeforeDirectWrite()
        amqp_channel_open(conn, id)
        try check(amqp_get_rpc_reply(conn), channel: nil, "opening channel \(id)")
        let ch = ChannelState(id: id, epoch: nextEpoch)
        nextEpoch += 1
        channels[id] = ch
        return ch
    }

    private func freeChannelID() -> UInt16? {
        for _ in 0..<channelMax {
            let id = nextChannelHint
            nextChannelHint = nextChannelHint >= UInt16(channelMax) ? 1 : nextChannelHint + 1
            if channels[id] == nil { return id }
        }
        return nil
    }

    func closeChannel(_ ch: ChannelState) {
        guard channels[ch.id] === ch else { return }
        flushOutput()
        if ch.closedError == nil, failure == nil, !droppedWhileBlocked() {
            // The answer may be the broker's own close of the channel or of
            // the connection (an error of something flushed just before),
            // each answered with its close-ok here: unanswered, the channel's
            // number would stay unusable, or the connection would look open
            // while the broker waited 30 s for us.
            let reply = amqp_channel_close(conn, ch.id, Int32(AMQP_REPLY_SUCCESS))
            try? check(reply, channel: ch, "closing channel \(ch.id)")
        }
        ch.fail(AMQPError(.channelClosed, "channel \(ch.id) was closed"))
        channels[ch.id] = nil
        arriving[ch.id] = nil  // a message half arrived on it is the broker's again
    }

    // MARK: - Errors

    /// Turns a rabbitmq-c reply into success or an error, doing what the
    /// protocol asks on the way: close-ok for a closed channel or connection.
    func check(_ reply: amqp_rpc_reply_t, channel: ChannelState?, _ context: String) throws {
        switch RabbitMQOutcome(reply) {
        case .ok:
            return
        case .channelClosed(let code, let text):
            let error = AMQPError(
                .channelClosed, "\(context): \(AMQPError.describeReply(code, text))", replyCode: code)
            if let channel { brokerClosedChannel(channel, error) }
            throw error
        case .connectionClosed(let code, let text):
            throw brokerClosedConnection(code: code, text: text, context: context)
        case .library(let status):
            let error = AMQPError.library(status, context)
            // Stopping, an RPC that timed out most likely waited on a block
            // rabbitmq-c holds unread: the connection is dropped for the
            // stop, not replaced (`AMQPClient`).
            if status == AMQP_STATUS_TIMEOUT.rawValue, core.abandonsWhenBlocked { core.noteAbandoned() }
            // A library failure leaves the stream in an unknown state: end the connection.
            fail(error)
            throw error
        }
    }

    func checkStatus(_ status: Int32, _ context: String) throws {
        guard status != AMQP_STATUS_OK.rawValue else { return }
        let error = AMQPError.library(status, context)
        fail(error)
        throw error
    }

    func brokerClosedChannel(_ ch: ChannelState, _ error: AMQPError) {
        sendChannelCloseOK(ch.id)
        ch.fail(error)
        channels[ch.id] = nil
        arriving[ch.id] = nil  // a message half arrived on it is the broker's again
    }

    /// Answers the broker's channel.close: until then it keeps the number
    /// closing and ignores everything else sent on it (a later channel.open too).
    func sendChannelCloseOK(_ id: UInt16) {
        flushOutput()
        if failure == nil {
            var ok = amqp_channel_close_ok_t()
            _ = amqp_send_method(conn, id, FD_CHANNEL_CLOSE_OK, &ok)
        }
    }

    func brokerClosedConnection(code: UInt16, text: String, context: String) -> AMQPError {
        flushOutput()
        if failure == nil {
            var ok = amqp_connection_close_ok_t()
            _ = amqp_send_method(conn, 0, FD_CONNECTION_CLOSE_OK, &ok)
        }
        let errorCode: AMQPError.Code = (code == 403 || code == 530) ? .authenticationFailed : .connectionClosed
        let error = AMQPError(
            errorCode, "\(context): the broker closed the connection: \(AMQPError.describeReply(code, text))",
            replyCode: code)
        fail(error)
        return error
    }
}
