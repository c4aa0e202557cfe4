import AMQP
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// The router's view of the decision log stream: the first record of every
/// id, learnt by reading the stream from its start, and a way to append a
/// record and learn whether it came first.
///
/// Every replica reads the same stream in the same order, so every replica
/// agrees on which record of an id came first, with no state of its own
/// that another replica needs.
final class DecisionLog: Sendable {
    struct Entry: Sendable {
        let id: String
        /// When it was written (seconds since 1970): it counts for the lifetime window from then.
        let writtenAt: UInt64
        /// The record as written; decoded only when a redelivery needs it.
        let body: Data
        /// Who appended it: unique per append.
        let token: String

        var record: DispatchRecord? { try? DispatchRecord(jsonData: body) }
    }

    private struct State {
        var first: [String: Entry] = [:]
        /// Tokens appended by this replica and not yet read back: their id,
        /// deadline, and when they were confirmed, with the reads by then.
        var expected: [String: Expected] = [:]
        var watch = ReadBackWatch(limit: DecisionLog.hangsAfter, gap: DecisionLog.reconnectGap)
        /// Read back (or failed) before its appender started waiting.
        var arrived: [String: Result<Entry, any Error>] = [:]
        var waiters: [String: CheckedContinuation<Entry, Error>] = [:]
    }

    struct Expected {
        let id: String
        let deadline: ContinuousClock.Instant
        /// Once the broker confirmed it (stored in the stream): when, and the
        /// reads by then. A publish slow to confirm (a leader election, a
        /// blocked connection) is not the reader's fault.
        var confirmed: (at: ContinuousClock.Instant, mark: UInt64)?
    }

    /// A record unread this long, with nothing read since it was stored: the
    /// log's consumer hangs (`ReadBackWatch`), and the router reconnects.
    /// (Only a record confirmed within the read-back's timeout less this, 5 s,
    /// of its append can give that verdict; in the hang confirms are prompt,
    /// and each later window is another chance.)
    static let hangsAfter = Duration.seconds(10)
    /// At most one such reconnect this often.
    static let reconnectGap = Duration.seconds(60)

    private let state = Mutex(State())
    private let tokenPrefix = UUID().uuidString
    private let tokenCounter = Mutex<UInt64>(0)
    /// Records taken in since the last credit ack.
    private let credit = Mutex(0)
    let client: AMQPClient
    let windowSeconds: Int
    /// The router's login: records written by anyone else are not read.
    let login: String

    let logger: Logger

    init(client: AMQPClient, windowSeconds: Int, login: String, logger: Logger) {
        self.client = client
        self.windowSeconds = windowSeconds
        self.login = login
        self.logger = logger
    }

    /// The first record of `id` seen so far.
    func first(_ id: String) -> Entry? { state.withLock { $0.first[id] } }

    /// Reads the stream from its start for as long as the client runs, and
    /// fails appends whose record has not come back in time. Records are
    /// taken in on the connection's own thread: a read-back resumes its
    /// appender without a task in between.
    func follow() async {
        let (ended, endedContinuation) = AsyncStream<Void>.makeStream()
        _ = await client.consume(
            ConsumerSpecification(queue: RouterTopology.decisionLog, prefetchCount: 2000, arguments: [AMQPStream.offsetArgument: "first"]),
            deliver: { [self] delivery in
                ingest(delivery)
                // A stream consumer's acks are credit: give it back 100 records at a time.
                let due = credit.withLock { n -> Bool in
                    n += 1
                    guard n >= 100 else { return false }
                    n = 0
                    return true
                }
                if due { try? delivery.ack(multiple: true) }
            },
            ended: { endedContinuation.finish() })
        let sweeper = Task {
            var turns = 0
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(500))
                if failOverdue(connected: client.connectionState == .connected) {
                    logger.warning("the decision log gives nothing back though records were written to it; connecting again", [
                        ("waited_s", .int(Int(DecisionLog.hangsAfter.components.seconds))),
                    ])
                    await client.reconnect()
                }
                turns += 1
                if turns % 120 == 0 { pruneExpired() }  // once a minute
            }
        }
        for await _ in ended {}
        sweeper.cancel()
    }

    /// Forgets ids whose window has passed, so memory follows the window,
    /// not the stream's whole history.
    func pruneExpired(now: UInt64 = UInt64(Date().timeIntervalSince1970)) {
        let window = UInt64(windowSeconds)
        state.withLock { s in
            s.first = s.first.filter { now.subtractingClamped($0.value.writtenAt) <= window }
        }
    }

    /// Fails the appends whose read-back is overdue; returns whether the
    /// log's consumer hangs (`ReadBackWatch`; asked only while `connected`).
    private func failOverdue(connected: Bool) -> Bool {
        let now = ContinuousClock.now
        let (overdue, hangs) = state.withLock { s -> ([CheckedContinuation<Entry, Error>?], Bool) in
            // The oldest record stored and still unread decides whether the reader hangs.
            let oldest = s.expected.values.lazy.compactMap(\.confirmed).min { $0.at < $1.at }
            let hangs = connected && (oldest.map { s.watch.unread(writtenAt: $0.at, mark: $0.mark, now: now) } ?? false)
            let tokens = s.expected.filter { $0.value.deadline <= now }.map(\.key)
            let waiters = tokens.map { token in
                s.expected[token] = nil
                s.arrived[token] = nil
                return s.waiters.removeValue(forKey: token)
            }
            return (waiters, hangs)
        }
        for waiter in overdue {
            waiter?.resume(throwing: AMQPError(.timeout, "a decision did not come back from the log in time"))
        }
        return hangs
    }

    /// Id, token and time ride in the message's properties (correlation_id,
    /// message_id, timestamp), so following the log decodes no JSON.
    func ingest(_ delivery: AMQPDelivery) {
        // Only the routers' own records count: anyone who can publish to the
        // default exchange could otherwise claim an id first.
        guard delivery.properties.userID == login, let token = delivery.properties.messageID,
            let id = delivery.properties.correlationID
        else {
            // Still a read: the consumer moves.
            return state.withLock { $0.watch.read() }
        }
        let entry = Entry(id: id, writtenAt: delivery.properties.timestamp ?? 0, body: delivery.body, token: token)
        let now = UInt64(Date().timeIntervalSince1970)
        let waiter = state.withLock { s -> (CheckedContinuation<Entry, Error>, Entry)? in
            s.watch.read()
            if let written = delivery.properties.timestamp, now.subtractingClamped(written) > UInt64(clamping: windowSeconds) {
                // Outside the window: it no longer makes a later request a duplicate.
            } else if s.first[id] == nil {
                s.first[id] = entry
            }
            guard let expected = s.expected.removeValue(forKey: token) else { return nil }
            let winner = s.first[expected.id] ?? entry
            guard let w = s.waiters.removeValue(forKey: token) else {
                s.arrived[token] = .success(winner)
                return nil
            }
            return (w, winner)
        }
        if let (continuation, winner) = waiter { continuation.resume(returning: winner) }
    }

    /// Appends records in one publish window and waits until the stream has
    /// given each back. For each: the first record of its id (this one unless
    /// another came first) and this append's token, or why it failed.
    func append(_ records: [(record: DispatchRecord, body: Data)], timeout: Duration = .seconds(15)) async -> [Result<(winner: Entry, token: String), Error>] {
        let tokens = records.map { _ in nextToken() }
        let deadline = ContinuousClock.now + timeout
        state.withLock { s in
            for (token, r) in zip(tokens, records) { s.expected[token] = Expected(id: r.record.id, deadline: deadline) }
        }
        let messages = zip(tokens, records).map { token, r in
            OutboundMessage(
                exchange: "", routingKey: RouterTopology.decisionLog, body: r.body,
                properties: .persistentJSON(messageID: token, correlationID: r.record.id, type: "frontdesk.router.decision.v1").stamped(by: login),
                // A repeat reads back as a later record of its id: the first wins.
                repeatable: true)
        }
        // A record read back is in the log (a stream gives its readers only
        // what it stored), so the read-back is what an append waits for; a
        // publish that fails fails its waiter at once instead of at the timeout.
        do {
            _ = try await client.publishWithoutWaiting(messages) { [self] outcome in
                switch outcome {
                case .success(let results):
                    confirmed(zip(tokens, results).compactMap { token, result in
                        if case .success = result { token } else { nil }
                    })
                    for (token, result) in zip(tokens, results) {
                        if case .failure(let error) = result { fail(token, error) }
                    }
                case .failure(let error):
                    for token in tokens { fail(token, error) }
                }
            }
        } catch {
            state.withLock { s in
                for token in tokens { s.expected[token] = nil }
            }
            return tokens.map { _ in .failure(error) }
        }
        var results: [Result<(winner: Entry, token: String), Error>] = []
        for token in tokens {
            do {
                results.append(.success((try await readBack(token), token)))
            } catch {
                results.append(.failure(error))
            }
        }
        return results
    }

    /// Unique per append across replicas and restarts: a random prefix per
    /// process and a counter (a UUID per record read /dev/urandom each time).
    private func nextToken() -> String {
        let n = tokenCounter.withLock { n in
            n += 1
            return n
        }
        return "\(tokenPrefix)-\(n)"
    }

    /// The broker stored these (still waiting, unless read back already).
    private func confirmed(_ tokens: [String]) {
        let now = ContinuousClock.now
        state.withLock { s in
            for token in tokens where s.expected[token] != nil { s.expected[token]!.confirmed = (now, s.watch.mark) }
        }
    }

    /// Ends the wait for `token`'s read-back with `error`, unless it came back already.
    private func fail(_ token: String, _ error: any Error) {
        let waiter = state.withLock { s -> CheckedContinuation<Entry, Error>? in
            guard s.expected.removeValue(forKey: token) != nil else { return nil }
            guard let waiter = s.waiters.removeValue(forKey: token) else {
                s.arrived[token] = .failure(error)  // for the read-back that has not started waiting
                return nil
            }
            return waiter
        }
        waiter?.resume(throwing: error)
    }

    private func readBack(_ token: String) async throws -> Entry {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<Entry, Error>) in
            let ready = state.withLock { s -> Result<Entry, Error>? in
                if let outcome = s.arrived.removeValue(forKey: token) { return outcome }
                guard s.expected[token] != nil else {
                    return .failure(AMQPError(.timeout, "a decision did not come back from the log in time"))
                }
                s.waiters[token] = c
                return nil
            }
            if let ready { c.resume(with: ready) }
        }
    }
}
