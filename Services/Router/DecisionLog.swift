import AMQP
import Foundation
import FrontDeskModel
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
        let record: DispatchRecord
        /// Who appended it: unique per append.
        let token: String
    }

    private struct State {
        var first: [String: Entry] = [:]
        var waiters: [String: (id: String, continuation: CheckedContinuation<Entry, Error>)] = [:]
        /// The publish-and-time-out task of each waiter, cancelled when its record comes back.
        var timers: [String: Task<Void, Never>] = [:]
    }

    private let state = Mutex(State())
    let client: AMQPClient
    let windowSeconds: Int

    init(client: AMQPClient, windowSeconds: Int) {
        self.client = client
        self.windowSeconds = windowSeconds
    }

    /// The first record of `id` seen so far.
    func first(_ id: String) -> Entry? { state.withLock { $0.first[id] } }

    /// Reads the stream from its start for as long as the client runs.
    func follow() async {
        let deliveries = await client.consume(ConsumerSpecification(
            queue: RouterTopology.decisionLog, prefetchCount: 2000, arguments: ["x-stream-offset": "first"]))
        for await delivery in deliveries {
            ingest(delivery)
            try? delivery.ack()
        }
    }

    func ingest(_ delivery: AMQPDelivery) {
        guard let token = delivery.properties.messageID,
            let record = try? JSONDecoder().decode(DispatchRecord.self, from: delivery.body)
        else { return }
        let entry = Entry(record: record, token: token)
        let now = Date()
        let waiter = state.withLock { s -> (CheckedContinuation<Entry, Error>, Entry)? in
            if let decided = RFC3339.parse(record.decidedAt), now.timeIntervalSince(decided) > Double(windowSeconds) {
                // Outside the window: it no longer makes a later request a duplicate.
            } else if s.first[record.id] == nil {
                s.first[record.id] = entry
            }
            s.timers.removeValue(forKey: token)?.cancel()
            guard let w = s.waiters.removeValue(forKey: token) else { return nil }
            return (w.continuation, s.first[w.id] ?? entry)
        }
        if let (continuation, winner) = waiter { continuation.resume(returning: winner) }
    }

    /// Appends `record` and waits until the stream has given it back; returns
    /// the first record of its id, which is this one unless another came first.
    func append(_ record: DispatchRecord, timeout: Duration = .seconds(15)) async throws -> (winner: Entry, token: String) {
        let token = UUID().uuidString
        let winner = try await withCheckedThrowingContinuation { (c: CheckedContinuation<Entry, Error>) in
            state.withLock { $0.waiters[token] = (record.id, c) }
            let timer = Task {
                do {
                    try await client.publish(OutboundMessage(
                        exchange: "", routingKey: RouterTopology.decisionLog, body: record.jsonData(),
                        properties: .persistentJSON(messageID: token, correlationID: record.id, type: "frontdesk.router.decision.v1")))
                } catch {
                    fail(token, error)
                    return
                }
                do {
                    try await Task.sleep(for: timeout)
                } catch {
                    return  // cancelled: the record came back
                }
                fail(token, AMQPError(.timeout, "the decision for \(record.id) did not come back from the log within \(timeout)"))
            }
            state.withLock { s in
                if s.waiters[token] != nil { s.timers[token] = timer } else { timer.cancel() }
            }
        }
        return (winner, token)
    }

    private func fail(_ token: String, _ error: any Error) {
        let waiter = state.withLock { s in
            s.timers.removeValue(forKey: token)
            return s.waiters.removeValue(forKey: token)
        }
        waiter?.continuation.resume(throwing: error)
    }
}
