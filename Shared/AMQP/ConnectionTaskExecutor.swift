/// Runs tasks on the thread of an `AMQPClient`'s current connection, between
/// its reads and writes: a task that awaits a confirm or a delivery resumes
/// where they arrive, without waking a thread of the Swift pool. While the
/// client has no connection, jobs go to the global pool; a job queued on a
/// connection that then ends still runs (a connection runs every command it
/// accepted, even after failing).
///
/// The work must not block: it shares the thread with the connection's I/O.
public final class ConnectionTaskExecutor: TaskExecutor {
    private let current: @Sendable () -> ConnectionCore?

    init(current: @escaping @Sendable () -> ConnectionCore?) { self.current = current }

    public func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        // What earlier commands buffered goes out before the job runs: a
        // job's work must not delay the acks and publishes queued ahead of it.
        if let core = current(), core.submit({ loop in
            loop.flushOutput()
            unowned.runSynchronously(on: executor)
        }) { return }
        globalConcurrentExecutor.enqueue(ExecutorJob(unowned))
    }
}
