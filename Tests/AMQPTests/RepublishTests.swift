@testable import AMQP
import Foundation
import Testing

/// A repeatable message whose confirm is overdue is published once more
/// (RabbitMQ's streams can lose a message at a leader change without
/// confirming or nacking it); either copy's ack settles it.
@Suite("Publishing an overdue repeatable message again")
struct RepublishTests {
    private func message(_ i: Int, repeatable: Bool = true, mandatory: Bool = false) -> OutboundMessage {
        OutboundMessage(exchange: "", routingKey: "q", body: Data("\(i)".utf8), mandatory: mandatory, repeatable: repeatable)
    }

    private func succeeded(_ r: Result<Void, AMQPError>) -> Bool {
        if case .success = r { return true }
        return false
    }

    /// A batch of `messages` on a fresh channel, published at the given instants.
    private func published(_ messages: [OutboundMessage], at instants: [ContinuousClock.Instant])
        -> (ChannelState, PublishBatch, () -> [Result<Void, AMQPError>]?) {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        let batch = PublishBatch(count: messages.count) { outcome = try? $0.get() }
        batch.messages = messages
        for (i, at) in instants.enumerated() { ch.pending.append(PendingPublish(batch: batch, index: i, publishedAt: at)) }
        return (ch, batch, { outcome })
    }

    @Test("only overdue repeatable, unmandatory messages are picked, once each, and never a copy")
    func picksOnlyOverdueRepeatablesOnce() {
        let start = ContinuousClock.now
        let (ch, batch, outcome) = published(
            [message(0), message(1, mandatory: true), message(2, repeatable: false), message(3)],
            at: [start, start, start, start + .seconds(10)])
        let picked = ch.supersedeOverdue(after: .seconds(5), now: start + .seconds(6))
        #expect(picked.map(\.index) == [0])
        #expect(picked.allSatisfy { $0.batch === batch })
        #expect(ch.supersedeOverdue(after: .seconds(5), now: start + .seconds(7)).isEmpty)
        // The copy (sequence number 5) is not published again, however late.
        ch.pending.append(PendingPublish(batch: .copy(of: batch, 0), index: 0, publishedAt: start + .seconds(6)))
        #expect(ch.supersedeOverdue(after: .seconds(5), now: start + .seconds(16)).map(\.index) == [3])
        // The original's nack does not count; the copy's ack does.
        ch.confirm(tag: 1, multiple: false, ack: false)
        ch.confirm(tag: 4, multiple: true, ack: true)
        #expect(outcome() == nil)
        ch.confirm(tag: 5, multiple: false, ack: true)
        let results = outcome() ?? []
        #expect(results.count == 4 && results.allSatisfy(succeeded))
    }

    @Test("the original's ack settles it, and the copy's later nack changes nothing")
    func theOriginalsAckCounts() {
        let start = ContinuousClock.now
        nonisolated(unsafe) var completions = 0
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        let batch = PublishBatch(count: 1) {
            completions += 1
            outcome = try? $0.get()
        }
        batch.messages = [message(0)]
        ch.pending.append(PendingPublish(batch: batch, index: 0, publishedAt: start))
        #expect(ch.supersedeOverdue(after: .seconds(5), now: start + .seconds(5)).count == 1)
        ch.pending.append(PendingPublish(batch: .copy(of: batch, 0), index: 0, publishedAt: start + .seconds(5)))
        ch.confirm(tag: 1, multiple: false, ack: true)
        #expect(outcome.map { $0.allSatisfy(succeeded) } == true)
        ch.confirm(tag: 2, multiple: false, ack: false)
        #expect(completions == 1 && outcome.map { $0.allSatisfy(succeeded) } == true)
        #expect(ch.pending.isEmpty)
    }

    @Test("a superseded message times out silently; its copy's own timeout fails it")
    func onlyTheCopysTimeoutFails() {
        let start = ContinuousClock.now
        let (ch, batch, outcome) = published([message(0)], at: [start])
        #expect(ch.supersedeOverdue(after: .seconds(5), now: start + .seconds(5)).count == 1)
        ch.pending.append(PendingPublish(batch: .copy(of: batch, 0), index: 0, publishedAt: start + .seconds(5)))
        ch.expireConfirms(olderThan: .seconds(30), now: start + .seconds(31))
        #expect(outcome() == nil && ch.pending.count == 1 && ch.pending.lowest == 2)
        ch.expireConfirms(olderThan: .seconds(30), now: start + .seconds(35))
        let results = outcome() ?? []
        #expect(results.count == 1)
        if case .failure(let error)? = results.first { #expect(error.code == .timeout) } else { Issue.record("expected a timeout") }
    }

    @Test("a channel that fails fails the original and its copy's message once")
    func aFailedChannelFailsOnce() {
        let start = ContinuousClock.now
        let (ch, batch, outcome) = published([message(0), message(1)], at: [start, start])
        #expect(ch.supersedeOverdue(after: .seconds(1), now: start + .seconds(2)).map(\.index) == [0, 1])
        // A copy is a batch of one: its message is index 0.
        for i in 0..<2 { ch.pending.append(PendingPublish(batch: .copy(of: batch, i), index: 0, publishedAt: start + .seconds(2))) }
        ch.fail(AMQPError(.connectionClosed, "gone"))
        let results = outcome() ?? []
        #expect(results.count == 2 && !results.contains(where: succeeded))
    }
}
