@testable import AMQP
import Foundation
import Glibc
import Synchronization
import Testing

extension BrokerIntegration {
    @Suite("Tasks on a connection's thread", .timeLimit(.minutes(1)))
    struct ExecutorTests {
        /// Threads seen, by who saw them.
        final class Threads: Sendable {
            private let seen = Mutex<[String: Set<UInt>]>([:])
            func note(_ who: String) { seen.withLock { _ = $0[who, default: []].insert(UInt(pthread_self())) } }
            subscript(_ who: String) -> Set<UInt> { seen.withLock { $0[who] ?? [] } }
        }

        /// The sleepers' durations, in the order they woke.
        final class Woken: Sendable {
            private let seen = Mutex<[Int]>([])
            func note(_ ms: Int) { seen.withLock { $0.append(ms) } }
            var order: [Int] { seen.withLock { $0 } }
        }

        @Test func aTaskPreferringTheExecutorRunsOnTheConnectionsThreadAcrossSuspensions() async throws {
            let connection = try await TestBroker.connect("executor")
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("executor")
            try await channel.queueDeclare(queue, durable: false, autoDelete: true)
            let threads = Threads()
            // A consumer's closure runs on the connection's thread: that thread is the reference.
            let (delivered, arrival) = AsyncStream<Void>.makeStream()
            _ = try await channel.consume(queue: queue, noAck: true, deliver: { _ in
                threads.note("connection")
                arrival.yield()
            }, finished: { _ in })
            try await channel.publish(exchange: "", routingKey: queue, body: Data("x".utf8))
            // A deadline, so a delivery that never comes fails an assertion rather than hanging.
            #expect(try await delivered.first(1, timeout: .seconds(10)).count == 1, "the message was not delivered")
            try await withTaskExecutorPreference(connection.executor) {
                for _ in 0..<3 {
                    // Resumed by a timer and by a broker reply: both come back to the connection's thread.
                    try await Task.sleep(for: .milliseconds(5))
                    threads.note("task")
                    _ = try await channel.queueDeclare(queue, passive: true)
                    threads.note("task")
                }
            }
            #expect(threads["connection"].count == 1)
            #expect(threads["task"] == threads["connection"], "the task ran off the connection's thread")
            await connection.close()
        }

        @Test func aTaskStillRunsOnceItsConnectionHasEnded() async throws {
            let connection = try await TestBroker.connect("executor-closed")
            let executor = connection.executor
            // Suspended on the connection's thread while the connection closes under it.
            let (started, start) = AsyncStream<Void>.makeStream()
            let waiter = Task(executorPreference: executor) { () async -> Bool in
                start.yield()
                try? await Task.sleep(for: .milliseconds(200))
                return true
            }
            #expect(try await started.first(1, timeout: .seconds(10)).count == 1, "the task did not start")
            await connection.close()
            #expect(await waiter.value)
            // Started after the end: the global pool runs it.
            let late = await withTaskExecutorPreference(executor) { () async -> Bool in
                try? await Task.sleep(for: .milliseconds(5))
                return true
            }
            #expect(late)
        }

        @Test func aSleepIsTimedByTheConnectionsThreadWhichGoesOnWithItsWork() async throws {
            let connection = try await TestBroker.connect("executor-sleep")
            let channel = try await connection.openChannel()
            let queue = TestBroker.uniqueName("executor-sleep")
            try await channel.queueDeclare(queue, durable: false, autoDelete: true)
            let threads = Threads()
            let (delivered, arrival) = AsyncStream<ContinuousClock.Instant>.makeStream()
            _ = try await channel.consume(queue: queue, noAck: true, deliver: { _ in
                threads.note("connection")
                arrival.yield(.now)
            }, finished: { _ in })
            // Three sleepers at once, woken in the order of their deadlines.
            let woken = Woken()
            let started = ContinuousClock.now
            try await withTaskExecutorPreference(connection.executor) {
                try await withThrowingDiscardingTaskGroup { group in
                    for ms in [300, 100, 200] {
                        group.addTask {
                            await connection.sleep(for: .milliseconds(ms))
                            threads.note("sleeper")
                            woken.note(ms)
                        }
                    }
                    // While they sleep, the connection still delivers at once.
                    let sent = ContinuousClock.now
                    try await channel.publish(exchange: "", routingKey: queue, body: Data("x".utf8))
                    let at = try await delivered.first(1, timeout: .seconds(10))
                    #expect(at.count == 1 && at[0] - sent < .milliseconds(90), "a delivery waited for the sleepers")
                }
            }
            let elapsed = ContinuousClock.now - started
            #expect(woken.order == [100, 200, 300])
            #expect(elapsed >= .milliseconds(300) && elapsed < .seconds(5), "slept \(elapsed)")
            #expect(threads["sleeper"] == threads["connection"] && threads["connection"].count == 1, "a sleeper woke off the connection's thread")
            await connection.close()
        }

        @Test func aSleepEndsWhenItsConnectionEnds() async throws {
            let connection = try await TestBroker.connect("executor-sleep-end")
            let (started, start) = AsyncStream<Void>.makeStream()
            let sleeper = Task(executorPreference: connection.executor) { () async -> ContinuousClock.Instant in
                start.yield()
                await connection.sleep(for: .seconds(30))
                return ContinuousClock.now
            }
            #expect(try await started.first(1, timeout: .seconds(10)).count == 1, "the sleeper did not start")
            // A round trip through the loop: the sleeper's timer, asked for in
            // the job that yielded, is set before the reply comes.
            _ = try await connection.openChannel()
            let closing = ContinuousClock.now
            await connection.close()
            let woke = await sleeper.value
            #expect(woke >= closing, "the sleep ended before the connection did")
            #expect(woke - closing < .seconds(10), "the sleep outlived its connection")
            // After the end, at once.
            let t = ContinuousClock.now
            await connection.sleep(for: .seconds(30))
            #expect(ContinuousClock.now - t < .seconds(1))
        }

        /// Asks for the close from a task on the connection's thread, before
        /// that task's next sleep: queued ahead of its timer, so that one turn
        /// of the loop takes both.
        static func closeAheadOfNextTimer(_ connection: AMQPConnection, telling asked: AsyncStream<Void>.Continuation) {
            asked.yield()
            _ = connection.core.submit { $0.requestClose() }
        }

        /// The sender's tick (and presence poll) is a loop of sleeps on the
        /// connection's executor that stops once the connection is no longer
        /// open. When the close was taken in the same turn of the loop as the
        /// loop's timer, its job used to run inside the connection's end, where
        /// every sleep returns at once without leaving the thread: the loop
        /// spun there, and the end (every `close()` waiting for it) never came.
        @Test func aLoopOfSleepsDoesNotHoldItsConnectionsEnd() async throws {
            let connection = try await TestBroker.connect("executor-sleep-loop")
            let (asked, ask) = AsyncStream<Void>.makeStream()
            let looper = Task(executorPreference: connection.executor) { () async -> Int in
                var passes = 0
                var passesAfterClose = 0
                // Bounded, so that a failure ends rather than spinning for good.
                let giveUpAt = ContinuousClock.now + .seconds(10)
                while !Task.isCancelled, ContinuousClock.now < giveUpAt {
                    if passes == 3 { Self.closeAheadOfNextTimer(connection, telling: ask) }
                    await connection.sleep(for: .milliseconds(20))
                    guard connection.isOpen else { break }
                    if passes >= 3 { passesAfterClose += 1 }
                    passes += 1
                }
                return passesAfterClose
            }
            #expect(try await asked.first(1, timeout: .seconds(10)).count == 1, "the loop did not get to its third pass")
            let closing = ContinuousClock.now
            _ = await connection.waitForEnd()
            let took = ContinuousClock.now - closing
            let passesAfterClose = await looper.value
            #expect(took < .seconds(3), "the connection took \(took) to end")
            #expect(passesAfterClose <= 1, "the loop went on \(passesAfterClose) times after the close")
        }

        final class Stop: Sendable {
            private let flag = Atomic<Bool>(false)
            func set() { flag.store(true, ordering: .releasing) }
            var isSet: Bool { flag.load(ordering: .acquiring) }
        }

        /// Not every such loop looks at the connection: the sender's term
        /// cancels its tick. Run on the connection's thread in its end, the
        /// loop would spin there, and the job of the task that stops it,
        /// queued behind, would never come: jobs of an ending connection go
        /// to the global pool.
        @Test func aLoopStoppedByAnotherTaskDoesNotHoldItsConnectionsEnd() async throws {
            let connection = try await TestBroker.connect("executor-sleep-loop-stopped")
            let stop = Stop()
            let (asked, ask) = AsyncStream<Void>.makeStream()
            let stopper = Task(executorPreference: connection.executor) {
                _ = await connection.waitForEnd()
                stop.set()
            }
            let looper = Task(executorPreference: connection.executor) { () async -> Bool in
                var passes = 0
                let giveUpAt = ContinuousClock.now + .seconds(10)
                while !stop.isSet, ContinuousClock.now < giveUpAt {
                    if passes == 3 { Self.closeAheadOfNextTimer(connection, telling: ask) }
                    await connection.sleep(for: .milliseconds(20))
                    passes += 1
                }
                return stop.isSet
            }
            #expect(try await asked.first(1, timeout: .seconds(10)).count == 1, "the loop did not get to its third pass")
            let closing = ContinuousClock.now
            _ = await connection.waitForEnd()
            let took = ContinuousClock.now - closing
            await stopper.value
            #expect(took < .seconds(3), "the connection took \(took) to end")
            #expect(await looper.value, "the loop was not stopped by the other task")
            #expect(connection.failure == nil, "a close is not a failure")
        }
    }
}
