import Foundation

/// One AMQP connection. Its rabbitmq-c handle is owned by a dedicated thread;
/// every method hops there and back, so no Swift concurrency thread blocks.
///
/// A connection does not recover by itself: when it ends, `waitForEnd()`
/// returns the reason. `AMQPClient` adds reconnection on top.
public final class AMQPConnection: Sendable {
    let core: ConnectionCore
    public let configuration: AMQPConnectionConfiguration

    private init(core: ConnectionCore, configuration: AMQPConnectionConfiguration) {
        self.core = core
        self.configuration = configuration
    }

    /// Connects, logs in and starts the connection's thread.
    public static func connect(_ configuration: AMQPConnectionConfiguration) async throws -> AMQPConnection {
        let core = ConnectionCore(name: configuration.connectionName)
        try await withCheckedThrowingContinuation { (opened: CheckedContinuation<Void, Error>) in
            let thread = Thread {
                let loop: ConnectionLoop
                do {
                    loop = try ConnectionLoop.open(configuration, core: core)
                } catch {
                    _ = core.stopAccepting()
                    core.end(error as? AMQPError)
                    opened.resume(throwing: error)
                    return
                }
                opened.resume()
                loop.run()
            }
            thread.name = "amqp:\(configuration.connectionName)"
            thread.start()
        }
        return AMQPConnection(core: core, configuration: configuration)
    }

    public func openChannel() async throws -> AMQPChannel {
        try await core.openChannel()
    }

    /// Opens a channel, runs `body` with it and closes it.
    @discardableResult
    public func withChannel<T: Sendable>(_ body: (AMQPChannel) async throws -> T) async throws -> T {
        let channel = try await openChannel()
        do {
            let result = try await body(channel)
            await channel.close()
            return result
        } catch {
            await channel.close()
            throw error
        }
    }

    /// Closes the connection cleanly (connection.close), failing what still waits.
    public func close() async {
        _ = core.submit { loop in loop.requestClose() }
        _ = await core.waitForEnd()
    }

    /// For a stop: the broker reads nothing from a connection it blocks (a
    /// resource alarm), so an answer to an RPC or a close would come only
    /// once the alarm clears. From now on this connection is dropped instead
    /// of waited on: at once if the broker blocks it now (an RPC already
    /// waiting included), else when it says so or before the next RPC or
    /// close. RPCs wait at most `ConnectionLoop.stoppingRPCTimeoutMs`, one
    /// already waiting included. What it held unacked goes back to its
    /// queues once the broker notices.
    public func abandonWhenBlocked() { core.abandonWhenBlocked() }

    /// True once `abandonWhenBlocked` dropped it (`AMQPClient` then connects no more).
    var wasAbandoned: Bool { core.wasAbandoned }

    /// Waits until the connection ends: nil after `close()` (a drop, for a
    /// stop under an alarm, included), else why it failed.
    public func waitForEnd() async -> AMQPError? {
        await core.waitForEnd()
    }

    /// False from the moment the connection is being closed or has failed,
    /// a little before `waitForEnd()` returns.
    public var isOpen: Bool { !core.isClosing }

    /// Why the connection failed, from the moment it did (before
    /// `waitForEnd()` returns); nil while open and after a close.
    public var failure: AMQPError? { core.failure }

    /// Runs tasks on this connection's thread (see `ConnectionTaskExecutor`);
    /// once the connection is ending (failed or closing), on the global pool.
    public var executor: ConnectionTaskExecutor { ConnectionTaskExecutor { [core] in core } }

    /// Pauses for `duration`, timed by this connection's thread: a task on
    /// `executor` resumes there, woken by no other thread. Ends early when
    /// the connection ends; not cancellable (for short pauses).
    public func sleep(for duration: Duration) async {
        await core.sleep(for: duration)
    }

    /// Why the broker currently blocks publishing (connection.blocked), if it does.
    public var blockedReason: String? { core.blockedReason }

    /// How many repeatable messages this connection published again because
    /// their confirms were overdue (`OutboundMessage.repeatable`).
    public var republishedMessages: Int { core.republishedCount }
    /// How many nacked messages this connection published again to their
    /// `OutboundMessage.ifNacked` way, and how many such refused messages it
    /// offered again to their own exchange.
    public var redirectedMessages: Int { core.redirectedCount }
    public var reofferedMessages: Int { core.reofferedCount }
    /// Refused messages not offered again because too many bytes waited.
    public var reofferDroppedMessages: Int { core.reofferDroppedCount }
}
