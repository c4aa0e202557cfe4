@testable import AMQP
import Foundation
import Testing

/// A nack says only that some queue refused the message (a surface's full
/// queue with `reject-publish`, a quorum queue whose leader is gone); a
/// message with an `ifNacked` way is then published there, and that copy's
/// confirm is the message's result.
@Suite("Publishing a nacked message to its ifNacked way")
struct RedirectTests {
    static let way = OutboundMessage.Destination(exchange: "frontdesk.status.refused", routingKey: "status.p.t.replied")

    private func message(_ i: Int, ifNacked: OutboundMessage.Destination? = way, mandatory: Bool = false) -> OutboundMessage {
        OutboundMessage(
            exchange: "frontdesk.status", routingKey: "status.p.t.replied", body: Data("\(i)".utf8),
            properties: .persistentJSON(messageID: "m-\(i)"), mandatory: mandatory, repeatable: true, ifNacked: ifNacked)
    }

    private func failure(_ r: Result<Void, AMQPError>?) -> AMQPError.Code? {
        if case .failure(let e)? = r { return e.code }
        return nil
    }

    private func succeeded(_ r: Result<Void, AMQPError>?) -> Bool {
        if case .success? = r { return true }
        return false
    }

    /// A window of `messages` on a fresh channel (sequence numbers 1...n).
    private func published(_ messages: [OutboundMessage]) -> (ChannelState, () -> [Result<Void, AMQPError>]?, () -> Int) {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        nonisolated(unsafe) var completions = 0
        let batch = PublishBatch(count: messages.count) {
            completions += 1
            outcome = try? $0.get()
        }
        batch.messages = messages
        let now = ContinuousClock.now
        for i in messages.indices { ch.pending.append(PendingPublish(batch: batch, index: i, publishedAt: now)) }
        return (ch, { outcome }, { completions })
    }

    /// Nacks `tag`, writing each redirected copy as the connection loop's
    /// `publish` would (the next sequence number); returns the copies.
    private func nack(_ ch: ChannelState, _ tag: UInt64, multiple: Bool = false, written: inout [OutboundMessage]) -> Int {
        var copies: [OutboundMessage] = []
        let n = ch.confirm(tag: tag, multiple: multiple, ack: false) { m, copy in
            copies.append(m)
            copy.messages = [m]  // as `publish` keeps a mandatory message, for a basic.return
            ch.pending.append(PendingPublish(batch: copy, index: 0, publishedAt: .now))
        }
        written += copies
        // What the connection offers again later: each as first published.
        #expect(n.allSatisfy { $0.exchange == "frontdesk.status" && $0.ifNacked != nil })
        return n.count
    }

    @Test("a nacked message goes to its way, mandatory, and that copy's ack is its result")
    func aNackedMessageIsRedirectedAndTheCopysAckCounts() {
        let (ch, outcome, completions) = published([message(0), message(1, ifNacked: nil), message(2)])
        var written: [OutboundMessage] = []
        #expect(nack(ch, 2, multiple: true, written: &written) == 1)
        // Message 0 went to its way; message 1 has none and failed.
        #expect(written.count == 1)
        let copy = written.first
        #expect(copy?.exchange == Self.way.exchange && copy?.routingKey == Self.way.routingKey)
        #expect(copy?.mandatory == true && copy?.ifNacked == nil && copy?.repeatable == false)
        #expect(copy?.body == Data("0".utf8) && copy?.properties.messageID == "m-0")
        #expect(outcome() == nil)
        ch.confirm(tag: 3, multiple: false, ack: true)
        #expect(outcome() == nil)  // the copy (tag 4) still waits
        ch.confirm(tag: 4, multiple: false, ack: true)
        let results = outcome() ?? []
        #expect(completions() == 1 && results.count == 3)
        #expect(succeeded(results.first) && failure(results.dropFirst().first) == .nacked && succeeded(results.last))
        #expect(ch.pending.isEmpty)
    }

    @Test("the copy's nack or return is final: the message fails, and is not sent on again")
    func aCopysNackOrReturnFailsTheMessage() {
        for returned in [false, true] {
            let (ch, outcome, _) = published([message(0)])
            var written: [OutboundMessage] = []
            #expect(nack(ch, 1, written: &written) == 1)
            if returned {
                ch.markReturned(ReturnedMessage(
                    replyCode: 312, replyText: "NO_ROUTE", exchange: Self.way.exchange, routingKey: Self.way.routingKey,
                    body: Data("0".utf8), properties: AMQPProperties()))
                ch.confirm(tag: 2, multiple: false, ack: true)
            } else {
                #expect(nack(ch, 2, written: &written) == 0)
            }
            #expect(written.count == 1)
            #expect(failure(outcome()?.first) == (returned ? .returned : .nacked))
            #expect(ch.pending.isEmpty)
        }
    }

    @Test("without a way (or for a mandatory message, or with nothing to write) a nack stands")
    func withoutAWayTheNackStands() {
        let (ch, outcome, _) = published([message(0, ifNacked: nil), message(1, mandatory: true), message(2)])
        var written: [OutboundMessage] = []
        #expect(nack(ch, 2, multiple: true, written: &written) == 0)
        #expect(written.isEmpty)
        // No writer (the connection passes none where it cannot publish): the nack stands too.
        ch.confirm(tag: 3, multiple: false, ack: false)
        #expect((outcome() ?? []).map(failure) == [.nacked, .nacked, .nacked])
    }

    @Test("a copy that could not be written leaves the nack standing")
    func aCopyRefusedAtOnceLeavesTheNack() {
        let (ch, outcome, _) = published([message(0)])
        let n = ch.confirm(tag: 1, multiple: false, ack: false) { _, copy in
            copy.resolve(0, .failure(AMQPError(.connectionBlocked, "blocked")))  // as `publish` does, appending nothing
        }
        #expect(n.isEmpty)
        #expect(failure(outcome()?.first) == .nacked)
    }

    @Test("an overdue copy's nack, once its original no longer waits, is redirected too; the original's own nack waits for it")
    func anOverdueCopysNackIsRedirected() {
        let start = ContinuousClock.now - .seconds(6)
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        let batch = PublishBatch(count: 1) { outcome = try? $0.get() }
        batch.messages = [message(0)]
        ch.pending.append(PendingPublish(batch: batch, index: 0, publishedAt: start))
        // Overdue: copied (tag 2).
        let copies = ch.republishOverdue(after: .seconds(5), now: .now, limit: 10) { _, copy in
            ch.pending.append(PendingPublish(batch: copy, index: 0, publishedAt: .now))
        }
        #expect(copies == 1)
        var written: [OutboundMessage] = []
        // The original's nack: its copy still waits and decides.
        #expect(nack(ch, 1, written: &written) == 0 && outcome == nil)
        // The copy's nack: nothing else waits, so the message goes to its way (tag 3).
        #expect(nack(ch, 2, written: &written) == 1)
        #expect(written.map(\.exchange) == [Self.way.exchange] && outcome == nil)
        ch.confirm(tag: 3, multiple: false, ack: true)
        #expect(succeeded(outcome?.first))
    }

    @Test("a redirected copy times out from its original's publish")
    func aRedirectedCopyTimesOutFromTheOriginal() {
        let (ch, outcome, _) = published([message(0)])
        var written: [OutboundMessage] = []
        #expect(nack(ch, 1, written: &written) == 1)
        ch.expireConfirms(olderThan: .seconds(30), now: .now + .seconds(29))
        #expect(outcome() == nil)
        ch.expireConfirms(olderThan: .seconds(30), now: .now + .seconds(31))
        #expect(failure(outcome()?.first) == .timeout && ch.pending.isEmpty)
    }
}
