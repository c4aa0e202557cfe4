/// Runs tasks on the thread of an `AMQPClient`'s current connection, between
/// its reads and writes: a task that awaits a confirm or a delivery resumes
/// where they arrive, without waking a thread of the Swift pool. While the
/// client has no connection, jobs go to the global pool. A job queued on a
/// connection that then ends still runs, but on the global pool too: jobs
/// that reach the thread once its connection is ending (failed, or
/// closing) go there instead (a connection runs every command it accepted,
/// even after failing, and this one passes its job on).
///
/// The work must not block: it shares the thread with the connection's I/O.
/// Run on the thread in the loop's last turn or its end, a task could never
/// leave it: each hop back is refused and resumes it at once, so a loop of
/// sleeps (the sender's tick) spun in the connection's end, and the end
/// never came.
public final class ConnectionTaskExecutor: TaskExecutor {
    private let current: @Sendable () -> ConnectionCore?

    init(current: @escaping @Sendable () -> ConnectionCore?) { self.current = current }

    public func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        // What earlier commands buffered goes out before the job runs: a
        // job's work must not delay the acks and publishes queued ahead of it.
        if let core = current(), core.submit({ loop in
            loop.flushOutput()  // (a failed write ends the connection)
            guard !loop.isEnding else { return globalConcurrentExecutor.enqueue(ExecutorJob(unowned)) }
            unowned.runSynchronously(on: executor)
        }) { return }
        globalConcurrentExecutor.enqueue(ExecutorJob(unowned))
    }
}
