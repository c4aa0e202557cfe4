import AMQP
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
    }
}
