@testable import AMQP
import Foundation
import Testing

/// A repeatable message whose confirm is overdue is published once more
/// (RabbitMQ's streams can lose a message at a leader change without
/// confirming or nacking it); the first ack of either copy settles it, and a
/// failure counts only once neither can be acked any more.
@Suite("Publishing an overdue repeatable message again")
struct RepublishTests {
    private func message(_ i: Int, repeatable: Bool = true, mandatory: Bool = false) -> OutboundMessage {
        OutboundMessage(exchange: "", routingKey: "q", body: Data("\(i)".utf8), mandatory: mandatory, repeatable: repeatable)
    }

    private func succeeded(_ r: Result<Void, AMQPError>) -> Bool {
        if case .success = r { return true }
        return false
    }

    private func failure(_ r: Result<Void, AMQPError>?) -> AMQPError.Code? {
        if case .failure(let e)? = r { return e.code }
        return nil
    }

    /// A batch of `messages` on a fresh channel, published at the given instants.
    private func published(_ messages: [OutboundMessage], at instants: [ContinuousClock.Instant])
        -> (ChannelState, () -> [Result<Void, AMQPError>]?, () -> Int) {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        nonisolated(unsafe) var completions = 0
        let batch = PublishBatch(count: messages.count) {
            completions += 1
            outcome = try? $0.get()
        }
        batch.messages = messages
        for (i, at) in instants.enumerated() { ch.pending.append(PendingPublish(batch: batch, index: i, publishedAt: at)) }
        return (ch, { outcome }, { completions })
    }

    /// Republishes what is due at `now`, each copy written as the connection
    /// loop's `publish` would (the next sequence number); returns the copies' messages.
    @discardableResult
    private func republish(_ ch: ChannelState, after: Duration = .seconds(5), now: ContinuousClock.Instant, limit: Int = 256)
        -> [OutboundMessage] {
        var written: [OutboundMessage] = []
        let n = ch.republishOverdue(after: after, now: now, limit: limit) { m, copy in
            written.append(m)
            ch.pending.append(PendingPublish(batch: copy, index: 0, publishedAt: now))
        }
        #expect(n == written.count)
        return written
    }

    @Test("only overdue repeatable, unmandatory messages are copied, once each, and never a copy")
    func copiesOnlyOverdueRepeatablesOnce() {
        let start = ContinuousClock.now
        let (ch, outcome, _) = published(
            [message(0), message(1, mandatory: true), message(2, repeatable: false), message(3)],
            at: [start, start, start, start + .seconds(10)])
        #expect(republish(ch, now: start + .seconds(6)).map(\.body) == [Data("0".utf8)])  // the copy is seq 5
        #expect(republish(ch, now: start + .seconds(7)).isEmpty)
        #expect(republish(ch, now: start + .seconds(16)).map(\.body) == [Data("3".utf8)])  // seq 5's copy: no
        // The original's nack does not count while its copy waits; the copy's ack does.
        ch.confirm(tag: 1, multiple: false, ack: false)
        ch.confirm(tag: 4, multiple: true, ack: true)
        #expect(outcome() == nil)
        ch.confirm(tag: 6, multiple: true, ack: true)
        let results = outcome() ?? []
        #expect(results.count == 4 && results.allSatisfy(succeeded))
    }

    @Test("the original's ack settles it, and the copy's later nack changes nothing")
    func theOriginalsAckCounts() {
        let start = ContinuousClock.now
        let (ch, outcome, completions) = published([message(0)], at: [start])
        republish(ch, now: start + .seconds(5))
        ch.confirm(tag: 1, multiple: false, ack: true)
        #expect(outcome().map { $0.allSatisfy(succeeded) } == true)
        ch.confirm(tag: 2, multiple: false, ack: false)
        #expect(completions() == 1 && outcome().map { $0.allSatisfy(succeeded) } == true)
        #expect(ch.pending.isEmpty)
    }

    @Test("a copy nacked while its original waits leaves the decision to the original: ack or nack")
    func aCopysNackLeavesTheOriginalToDecide() {
        for originalAcks in [true, false] {
            let start = ContinuousClock.now
            let (ch, outcome, _) = published([message(0)], at: [start])
            republish(ch, now: start + .seconds(5))
            ch.confirm(tag: 2, multiple: false, ack: false)
            #expect(outcome() == nil)
            // Not copied a second time.
            #expect(republish(ch, now: start + .seconds(11)).isEmpty)
            ch.confirm(tag: 1, multiple: false, ack: originalAcks)
            let result = outcome()?.first
            #expect(originalAcks ? result.map(succeeded) == true : failure(result) == .nacked)
        }
    }

    @Test("a message fails once its first publish has waited the confirm timeout, copied or not")
    func theTimeoutCountsFromTheFirstPublish() {
        let start = ContinuousClock.now
        let (ch, outcome, _) = published([message(0), message(1, repeatable: false)], at: [start, start + .seconds(4)])
        republish(ch, now: start + .seconds(5))
        // A publish after the original and before the copy is still young: the copy expires regardless.
        ch.expireConfirms(olderThan: .seconds(30), now: start + .seconds(29))
        #expect(outcome() == nil && ch.pending.count == 3)
        ch.expireConfirms(olderThan: .seconds(30), now: start + .seconds(30))
        #expect(ch.pending.count == 1 && ch.pending.lowest == 2)
        ch.confirm(tag: 2, multiple: false, ack: true)
        let results = outcome() ?? []
        #expect(results.count == 2 && failure(results[0]) == .timeout && succeeded(results[1]))
    }

    @Test("a copy that is not written at once leaves the original to decide")
    func aCopyNotWrittenLeavesTheOriginal() {
        let start = ContinuousClock.now
        let (ch, outcome, _) = published([message(0)], at: [start])
        let n = ch.republishOverdue(after: .seconds(5), now: start + .seconds(5), limit: 10) { _, _ in }
        #expect(n == 0)
        ch.confirm(tag: 1, multiple: false, ack: false)
        #expect(failure(outcome()?.first) == .nacked)
    }

    @Test("a sweep copies at most its limit, and the next one goes on from there")
    func copiesAreLimitedPerSweep() {
        let start = ContinuousClock.now
        let (ch, outcome, _) = published((0..<5).map { message($0) }, at: Array(repeating: start, count: 5))
        #expect(republish(ch, now: start + .seconds(5), limit: 2).count == 2)
        #expect(republish(ch, now: start + .seconds(5), limit: 2).map(\.body) == [Data("2".utf8), Data("3".utf8)])
        #expect(republish(ch, now: start + .seconds(5), limit: 2).map(\.body) == [Data("4".utf8)])
        #expect(republish(ch, now: start + .seconds(60), limit: 2).isEmpty)
        ch.confirm(tag: 0, multiple: true, ack: true)
        #expect(outcome().map { $0.count == 5 && $0.allSatisfy(succeeded) } == true)
        #expect(ch.pending.isEmpty)
    }

    @Test("timeouts, or a channel that fails, fail each message once, copied or not")
    func aFailedChannelFailsOnce() {
        let start = ContinuousClock.now
        let (ch, outcome, completions) = published([message(0), message(1)], at: [start, start])
        republish(ch, after: .seconds(1), now: start + .seconds(2))
        ch.confirm(tag: 1, multiple: false, ack: false)  // ignored: its copy waits
        ch.expireConfirms(olderThan: .seconds(1), now: start + .seconds(2))  // originals gone; copies expire from the first publish
        #expect(outcome().map { $0.allSatisfy { failure($0) == .timeout } } == true)
        let (ch2, outcome2, completions2) = published([message(0), message(1)], at: [start, start])
        republish(ch2, after: .seconds(1), now: start + .seconds(2))
        _ = ch2.pending.remove(1)  // say the original was given up, its copy waiting
        ch2.fail(AMQPError(.connectionClosed, "gone"))
        #expect(completions() == 1 && completions2() == 1)
        #expect(outcome2().map { $0.allSatisfy { failure($0) == .connectionClosed } } == true)
    }
}
