import Dispatch
import Foundation
import Glibc
import Synchronization

/// A long-running part of a process.
public protocol Service: Sendable {
    /// Runs until the work is done or `shutdown()` was called.
    func run() async throws
    /// Asks `run()` to stop taking new work, finish or hand back what is in
    /// flight, and return.
    func shutdown() async
    /// What the service's loops are doing now and since when, logged when
    /// the grace period is over: where a stop that does not come waits.
    var whereItWaits: [(String, LogValue)] { get }
}

extension Service {
    public var whereItWaits: [(String, LogValue)] { [] }
}

/// Runs services together and turns SIGTERM / SIGINT into a graceful
/// shutdown: each service's `shutdown()`, last started first; once
/// `gracePeriod` has passed since the shutdown began, the tasks are
/// cancelled; and should they still run `exitDeadline` after that (a task
/// waiting on something that never comes), the process logs so and exits
/// with status 1 rather than never stopping.
public enum ServiceLifecycle {
    /// Returns the process exit status: 0 after a clean stop, 1 when a
    /// service failed or the grace period ran out. `stopSignals` start the
    /// shutdown (SIGTERM and SIGINT; see `SignalStream`). `hardStop` is what ends a process whose services
    /// outlived the grace period and the deadline: `_exit(1)`, which may
    /// run beside a late `exit` of the main thread (plain `exit` may not).
    public static func run(
        _ services: [any Service], logger: Logger, gracePeriod: Duration = .seconds(20),
        exitDeadline: Duration = .seconds(5), hardStop: @escaping @Sendable () -> Void = { _exit(1) },
        signals stopSignals: [Int32] = [SIGTERM, SIGINT]
    ) async -> Int32 {
        let signals = SignalStream(stopSignals)
        defer { signals.cancel() }
        let finished = Flag()  // set once `run` returns: the hard stop then does nothing
        defer { finished.set() }
        return await withTaskGroup(of: ServiceOutcome.self) { group in
            for (index, service) in services.enumerated() {
                group.addTask {
                    do {
                        try await service.run()
                        return .finished(index)
                    } catch {
                        return .failed(index, error)
                    }
                }
            }
            group.addTask {
                for await signal in signals.stream {
                    return .signal(signal)
                }
                return .signal(0)
            }
            var status: Int32 = 0
            var running = services.count
            var shuttingDown = false
            while running > 0, let outcome = await group.next() {
                switch outcome {
                case .signal(Self.graceOver):
                    status = 1  // not a clean stop, however the services end now
                    logger.warning("grace period over: cancelling", services.flatMap(\.whereItWaits))
                    group.cancelAll()
                    continue
                case .signal(let number):
                    guard number != 0, !shuttingDown else { continue }
                    logger.info("stopping", [("signal", .int(Int(number)))])
                case .finished:
                    running -= 1
                case .failed(_, let error):
                    running -= 1
                    status = 1
                    logger.error("a service failed", [("error", .string("\(error)"))])
                }
                if !shuttingDown, running > 0 {
                    shuttingDown = true
                    // Stop the others, last started first. Not a child of the
                    // group: a shutdown() that never returns must neither hold
                    // back the grace period nor keep this function from returning.
                    Task {
                        for service in services.reversed() { await service.shutdown() }
                    }
                    group.addTask {
                        try? await Task.sleep(for: gracePeriod)
                        return .signal(Self.graceOver)
                    }
                    let deadline = DispatchTime.now() + .nanoseconds(Int((gracePeriod + exitDeadline) / .nanoseconds(1)))
                    DispatchQueue.global().asyncAfter(deadline: deadline) {
                        guard !finished.isSet else { return }
                        logger.error("still running after the grace period and the cancellation; exiting", [
                            ("grace_ms", .int(Int(gracePeriod / .milliseconds(1)))),
                            ("deadline_ms", .int(Int(exitDeadline / .milliseconds(1)))),
                        ] + services.flatMap(\.whereItWaits))
                        hardStop()
                    }
                }
            }
            signals.cancel()
            group.cancelAll()
            return status
        }
    }

    /// The grace timer's outcome, told apart from a signal's number.
    private static let graceOver: Int32 = -1

    private enum ServiceOutcome: Sendable {
        case finished(Int)
        case failed(Int, any Error)
        case signal(Int32)
    }
}

/// Signals as an async stream, through DispatchSource (not signal handlers).
/// The signals are set to be ignored first, as DispatchSource asks;
/// libdispatch puts its own handler in their place, but only for the first
/// source of a signal in a process, so a later one leaves it ignored, and an
/// ignored disposition is inherited by every process started then.
/// `cancel()` puts back what they did before (after it, a SIGTERM during
/// the last clean-up ends the process at once).
final class SignalStream: Sendable {
    let stream: AsyncStream<Int32>
    /// Dispatch sources are not Sendable; the mutex makes their hand-over safe.
    private let sources: Mutex<(sources: [any DispatchSourceSignal], before: [(Int32, sigaction)])>
    private let continuation: AsyncStream<Int32>.Continuation

    init(_ numbers: [Int32]) {
        let (stream, continuation) = AsyncStream<Int32>.makeStream()
        self.stream = stream
        self.continuation = continuation
        var before: [(Int32, sigaction)] = []
        let made = numbers.map { number in
            var ignore = sigaction()
            ignore.__sigaction_handler.sa_handler = SIG_IGN
            var old = sigaction()
            if sigaction(number, &ignore, &old) == 0 { before.append((number, old)) }
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { continuation.yield(number) }
            source.resume()
            return source
        }
        sources = Mutex((made, before))
    }

    func cancel() {
        sources.withLock { s in
            for source in s.sources { source.cancel() }
            s.sources.removeAll()
            for (number, old) in s.before {
                var old = old
                sigaction(number, &old, nil)
            }
            s.before.removeAll()
        }
        continuation.finish()
    }
}

/// A flag one thread sets and others read, or take.
public final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    public init() {}
    public func set() { value.store(true, ordering: .releasing) }
    public var isSet: Bool { value.load(ordering: .acquiring) }
    /// Whether it was set, clearing it.
    public func take() -> Bool { value.exchange(false, ordering: .acquiringAndReleasing) }
}
