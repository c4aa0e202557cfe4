import Foundation
import ServiceKit
import Synchronization
import Testing

/// The lifecycle's stop: the grace period runs from the start of the
/// shutdown, whatever `shutdown()` does, and a process whose services ignore
/// their cancellation too is ended rather than left running.
@Suite("Service lifecycle stop", .serialized)
struct ServiceLifecycleTests {
    /// A gate a test opens: what waits on it ignores cancellation.
    final class Gate: Sendable {
        private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))
        func wait() async {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let open = state.withLock { s -> Bool in
                    if !s.open { s.waiters.append(c) }
                    return s.open
                }
                if open { c.resume() }
            }
        }
        func open() {
            for c in state.withLock({ s -> [CheckedContinuation<Void, Never>] in
                s.open = true
                defer { s.waiters = [] }
                return s.waiters
            }) { c.resume() }
        }
    }

    /// Returns at once: the lifecycle then stops the others.
    struct Done: Service {
        func run() async throws {}
        func shutdown() async {}
    }

    /// Its run ends on cancellation, or never (`ignoresCancellation`); its shutdown never returns.
    struct Stuck: Service {
        let gate: Gate
        let ignoresCancellation: Bool
        func run() async throws {
            if ignoresCancellation {
                await gate.wait()
            } else {
                try await Task.sleep(for: .seconds(3600))
            }
        }
        func shutdown() async { await gate.wait() }
        var whereItWaits: [(String, LogValue)] { [("waits.run", "the gate")] }
    }

    let sink = LogSink.memory()
    var logger: Logger { Logger(service: "test", level: .info, sink: sink) }

    @Test func aShutdownThatNeverReturnsDoesNotHoldBackTheGracePeriod() async {
        let gate = Gate()
        let began = ContinuousClock.now
        let status = await ServiceLifecycle.run(
            [Stuck(gate: gate, ignoresCancellation: false), Done()], logger: logger,
            gracePeriod: .milliseconds(300), hardStop: { Issue.record("a service that ends on cancellation needs no hard stop") },
            signals: [])
        let took = ContinuousClock.now - began
        #expect(status == 1)  // its run ended by the cancellation: a failure
        #expect(sink.lines.contains { $0.contains("grace period over") })
        #expect(took >= .milliseconds(300) && took < .seconds(5), "took \(took)")
        gate.open()
    }

    /// The lifecycle sets its stop signals to be ignored while it runs (a
    /// dispatch source reads them); afterwards they must not stay ignored,
    /// or every process started later inherits them so. libdispatch puts its
    /// own handler in place only for the first source of a signal in a
    /// process, so it is a second run that left them ignored. (SIGUSR2 here:
    /// the other tests of this process start processes, which must not
    /// inherit SIGTERM ignored; the other lifecycle tests take no signals.)
    @Test func aStopSignalIsNotLeftIgnoredAfterTheLifecycleReturns() async {
        func ignored(_ number: Int32) -> Bool {
            var current = sigaction()
            sigaction(number, nil, &current)
            return unsafeBitCast(current.__sigaction_handler.sa_handler, to: Int.self) == unsafeBitCast(SIG_IGN, to: Int.self)
        }
        for _ in 1...2 {
            _ = await ServiceLifecycle.run([Done()], logger: logger, signals: [SIGUSR2])
            #expect(!ignored(SIGUSR2))
        }
    }

    @Test func servicesThatIgnoreTheirCancellationAreEndedAfterTheDeadline() async throws {
        let gate = Gate()
        let stopped = Gate()
        let began = ContinuousClock.now
        let run = Task {
            await ServiceLifecycle.run(
                [Stuck(gate: gate, ignoresCancellation: true), Done()], logger: logger,
                gracePeriod: .milliseconds(200), exitDeadline: .milliseconds(1500), hardStop: { stopped.open() }, signals: [])
        }
        await stopped.wait()
        let took = ContinuousClock.now - began
        #expect(took >= .milliseconds(1700) && took < .seconds(8), "took \(took)")
        // Both lines say where the service waits.
        #expect(sink.lines.contains { $0.contains("grace period over") && $0.contains(#""waits.run":"the gate""#) })
        #expect(sink.lines.contains {
            $0.contains("exiting") && $0.contains("\"level\":\"error\"") && $0.contains(#""waits.run":"the gate""#)
        })
        // (In a service the hard stop exits the process; here the test lets the service go.)
        gate.open()
        _ = await run.value
    }
}
