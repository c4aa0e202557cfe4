import Foundation

/// Where a consumer's deliveries go, and how it learns that it ended.
struct ConsumerSink: Sendable {
    let deliver: @Sendable (AMQPDelivery) -> Void
    /// nil: cancelled by us; an error: by the broker or with the connection.
    let finish: @Sendable (AMQPError?) -> Void
}

/// The publishes of one `publish` call, resolved together.
final class PublishBatch {
    /// Message 0's result and the others': most windows are one message, and
    /// need no array until they complete (an array here was 7% of a paced
    /// stage's user-space CPU: its allocation and element metadata).
    private var first: Result<Void, AMQPError>?
    private var rest: [Result<Void, AMQPError>?]
    private var remaining: Int
    /// What was published, when a basic.return is to be matched against
    /// it or a message may be published again.
    var messages: [OutboundMessage] = []
    /// Set for a copy (a message published again, `OutboundMessage.repeatable`):
    /// the publish it copies, whose result its own is.
    private(set) var original: Original?

    struct Original {
        let batch: PublishBatch
        let index: Int
        let seq: UInt64
        /// The copy's confirm timeout counts from here: repeatable or not, a
        /// message fails once its first publish has waited the timeout.
        let publishedAt: ContinuousClock.Instant
        /// A copy sent to the message's `ifNacked` after a nack: its nack is final.
        var redirected = false
    }
    /// Called once, on the connection thread, with every result or the error.
    let complete: (Result<[Result<Void, AMQPError>], Error>) -> Void

    init(count: Int, complete: @escaping (Result<[Result<Void, AMQPError>], Error>) -> Void) {
        rest = count > 1 ? Array(repeating: nil, count: count - 1) : []
        remaining = count
        self.complete = complete
    }

    /// A batch for publishing `original`'s message again. Its ack is that
    /// message's; a failure is passed on by `ChannelState` alone, which
    /// knows whether the original still waits (and then decides).
    static func copy(of original: Original) -> PublishBatch {
        let copy = PublishBatch(count: 1) { outcome in
            if case .success(let results) = outcome, case .success? = results.first {
                original.batch.resolve(original.index, .success(()))
            }
        }
        copy.original = original
        return copy
    }

    /// Message `index`'s result; the first for each index counts.
    func resolve(_ index: Int, _ result: Result<Void, AMQPError>) {
        if index == 0 {
            guard first == nil else { return }
            first = result
        } else {
            guard rest[index - 1] == nil else { return }
            rest[index - 1] = result
        }
        remaining -= 1
        guard remaining == 0, let first else { return }
        var all: [Result<Void, AMQPError>] = []
        all.reserveCapacity(1 + rest.count)
        all.append(first)
        for r in rest { all.append(r!) }
        complete(.success(all))
    }
}

/// A publish waiting for its confirm: message `index` of `batch`.
struct PendingPublish {
    let batch: PublishBatch
    let index: Int
    /// Set when a basic.return matched it: the reply, not the message (a
    /// slot of the ring stays small).
    var returned: (code: UInt16, text: String)?
    let publishedAt: ContinuousClock.Instant
    /// Whether it was published again (`OutboundMessage.repeatable`).
    var copy = CopyState.none

    enum CopyState: UInt8 {
        case none
        /// Its copy waits and decides: this one's ack still counts, its nack or timeout does not.
        case waiting
        /// Its copy failed: this one decides again (and is not copied again).
        case failed
    }

    init(batch: PublishBatch, index: Int, publishedAt: ContinuousClock.Instant) {
        self.batch = batch
        self.index = index
        self.publishedAt = publishedAt
    }
}

/// The publishes of a channel that wait for their confirms, by sequence
/// number: a ring over `lowest ..< lowest + span`, with a hole where a
/// confirm came out of order (a message routed to a stream and a quorum
/// queue). Sequence numbers are consecutive, so a slot is found by
/// subtraction, not hashing.
struct PendingWindow {
    static let initialSlots = 16
    /// A ring grown past this is shrunk back once nothing waits.
    static let keptSlots = 256
    private var slots: [PendingPublish?] = Array(repeating: nil, count: initialSlots)
    /// How many slots the ring has (for tests).
    var capacity: Int { slots.count }
    /// The slot of `lowest`.
    private var head = 0
    /// The lowest sequence number that may still wait.
    private(set) var lowest: UInt64 = 1
    /// How many sequence numbers from `lowest` the ring covers (waiting or holes).
    private(set) var span = 0
    /// How many wait.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }
    /// The sequence number the next `append` takes.
    var next: UInt64 { lowest &+ UInt64(span) }

    private func slot(_ seq: UInt64) -> Int? {
        guard seq >= lowest, seq - lowest < UInt64(span) else { return nil }
        return (head + Int(seq - lowest)) % slots.count
    }

    /// Adds the publish with sequence number `next`.
    mutating func append(_ p: PendingPublish) {
        if span == slots.count {
            // Full: unroll into a ring twice the size.
            var grown: [PendingPublish?] = Array(repeating: nil, count: slots.count * 2)
            for i in 0..<span { grown[i] = slots[(head + i) % slots.count] }
            slots = grown
            head = 0
        }
        slots[(head + span) % slots.count] = p
        span += 1
        count += 1
    }

    subscript(seq: UInt64) -> PendingPublish? {
        guard let i = slot(seq) else { return nil }
        return slots[i]
    }

    /// Replaces the waiting publish `seq` (no effect if it does not wait).
    mutating func update(_ seq: UInt64, _ p: PendingPublish) {
        guard let i = slot(seq), slots[i] != nil else { return }
        slots[i] = p
    }

    mutating func remove(_ seq: UInt64) -> PendingPublish? {
        guard let i = slot(seq), let p = slots[i] else { return nil }
        slots[i] = nil
        count -= 1
        // Move `lowest` past the holes at the front.
        while span > 0, slots[head] == nil {
            head = (head + 1) % slots.count
            lowest += 1
            span -= 1
        }
        // Empty after a burst: give the grown ring back.
        if count == 0, slots.count > Self.keptSlots {
            slots = Array(repeating: nil, count: Self.initialSlots)
            head = 0
        }
        return p
    }

    /// Every waiting publish, lowest sequence number first; the window is empty after.
    mutating func removeAll() -> [PendingPublish] {
        var all: [PendingPublish] = []
        all.reserveCapacity(count)
        for i in 0..<span {
            if let p = slots[(head + i) % slots.count] { all.append(p) }
        }
        let after = next
        slots = Array(repeating: nil, count: Self.initialSlots)
        head = 0
        span = 0
        count = 0
        lowest = after
        return all
    }
}

/// One open channel, seen from the owner thread.
final class ChannelState {
    let id: UInt16
    /// Distinguishes this channel from a later one that reuses its number, so
    /// that a stale delivery tag is never acked on the wrong channel.
    let epoch: UInt64
    var closedError: AMQPError?
    var confirming = false
    var pending = PendingWindow()
    var consumers: [String: ConsumerSink] = [:]
    /// Consumers (live or cancelled) whose deliveries must never be handed
    /// back with basic.reject: no-ack ones (nothing to settle) and those of a
    /// stream (RabbitMQ answers a reject there by closing the whole
    /// connection, 540 NOT_IMPLEMENTED). A delivery of theirs that races with
    /// the cancel is left alone: it goes nowhere, and the channel's close
    /// forgets it.
    var neverRejected: Set<String> = []
    /// Set by `AMQPChannel.closeWhenSettled`: the connection's sweep closes
    /// the channel once nothing waits for a confirm, a sweep or more later.
    var closeWhenSettled: ContinuousClock.Instant?
    /// The copies waiting (`republishOverdue`), whose timeouts count from
    /// their originals' publish and so are looked at apart from the ring's order.
    private var copies: [UInt64] = []
    /// Publishes below this were considered for a copy already.
    private var republishScanned: UInt64 = 1

    init(id: UInt16, epoch: UInt64) {
        self.id = id
        self.epoch = epoch
    }

    /// Ends the channel: fails waiting publishes and ends consumers.
    func fail(_ error: AMQPError) {
        guard closedError == nil else { return }
        closedError = error
        for p in pending.removeAll() { failed(p, error) }
        copies.removeAll()
        let sinks = consumers.values
        consumers.removeAll()
        for s in sinks { s.finish(error) }
    }

    /// Applies basic.ack / basic.nack for `tag` (and below it when `multiple`).
    /// A nacked message with an `ifNacked` way is published there through
    /// `redirect` (`ConnectionLoop.publish` on this channel) and waits for
    /// that copy's confirm; returns the messages that were (as published first).
    @discardableResult
    func confirm(
        tag: UInt64, multiple: Bool, ack: Bool, redirect: ((OutboundMessage, PublishBatch) -> Void)? = nil
    ) -> [OutboundMessage] {
        // A tag beyond what was published, or a range reaching back past the
        // lowest waiting one, only covers what waits: no loop over numbers
        // the broker made up.
        // Tag 0 with `multiple` is every outstanding one (AMQP 0-9-1, basic.ack).
        let upper = tag == 0 && multiple ? pending.next &- 1 : min(tag, pending.next &- 1)
        let lower = multiple ? pending.lowest : tag
        guard lower <= upper else { return [] }
        var redirected: [OutboundMessage] = []
        for seq in lower...upper {
            guard let p = pending.remove(seq) else { continue }
            if p.copy == .waiting {
                if ack { p.batch.resolve(p.index, .success(())) }
            } else if let r = p.returned {
                // `failed`, not the batch: a returned copy's failure is its original's.
                failed(p, AMQPError(
                    .returned, "the broker returned the message: \(AMQPError.replyName(r.code)) \(r.text)",
                    replyCode: r.code))
            } else if ack {
                p.batch.resolve(p.index, .success(()))
            } else if let redirect, let message = self.redirect(p, seq: seq, write: redirect) {
                redirected.append(message)
            } else {
                failed(p, AMQPError(.nacked, "the broker nacked the message"))
            }
        }
        return redirected
    }

    /// Publishes nacked `p` (sequence number `seq`) once more to its
    /// message's `ifNacked` way; the copy's result becomes the message's.
    /// Returns the message as first published, or nil when it has no way, the
    /// nack is a redirected copy's own (final), the original still waits and
    /// decides, or the copy could not be written.
    private func redirect(_ p: PendingPublish, seq: UInt64, write: (OutboundMessage, PublishBatch) -> Void) -> OutboundMessage? {
        var root: PublishBatch.Original
        if let original = p.batch.original {
            // An overdue copy's nack: its original decides while it waits.
            guard !original.redirected, pending[original.seq] == nil else { return nil }
            root = original
        } else {
            root = PublishBatch.Original(batch: p.batch, index: p.index, seq: seq, publishedAt: p.publishedAt)
        }
        guard root.batch.messages.indices.contains(root.index) else { return nil }
        let first = root.batch.messages[root.index]
        guard let message = first.redirected else { return nil }
        root.redirected = true
        let copySeq = pending.next
        write(message, .copy(of: root))
        // Not written (refused at once, or the connection failed): the nack stands.
        guard pending[copySeq]?.batch.original != nil else { return nil }
        copies.append(copySeq)
        return first
    }

    /// `p`'s publish failed. A copy's failure is its original's, unless the
    /// original still waits: then the original decides again.
    private func failed(_ p: PendingPublish, _ error: AMQPError) {
        guard let original = p.batch.original else {
            return p.batch.resolve(p.index, .failure(error))
        }
        if var o = pending[original.seq], o.copy == .waiting {
            o.copy = .failed
            pending.update(original.seq, o)
        } else {
            original.batch.resolve(original.index, .failure(error))
        }
    }

    /// Fails publishes whose confirm has not come within `timeout` (a
    /// blocked or overloaded broker); a late confirm then changes nothing.
    func expireConfirms(olderThan timeout: Duration, now: ContinuousClock.Instant) {
        let expired = AMQPError(.timeout, "no publisher confirm within \(timeout); the broker may be blocked or overloaded")
        while !pending.isEmpty {
            let seq = pending.lowest
            guard let p = pending[seq] else { break }  // cannot be: the lowest always waits
            guard now - (p.batch.original?.publishedAt ?? p.publishedAt) >= timeout else { break }
            _ = pending.remove(seq)
            // One whose copy waits leaves the result to the copy, expired below.
            if p.copy != .waiting { failed(p, expired) }
        }
        guard !copies.isEmpty else { return }
        copies.removeAll { seq in
            guard let p = pending[seq], let original = p.batch.original else { return true }
            guard now - original.publishedAt >= timeout else { return false }
            _ = pending.remove(seq)
            failed(p, expired)
            return true
        }
    }

    /// Publishes once more, through `write`, each repeatable message that
    /// has waited `after` for its confirm and was not published again yet,
    /// oldest first, at most `limit`; returns how many. `write` publishes on
    /// this channel (`ConnectionLoop.publish`), and the copy waits here with
    /// the sequence number after the last.
    func republishOverdue(
        after: Duration, now: ContinuousClock.Instant, limit: Int, write: (OutboundMessage, PublishBatch) -> Void
    ) -> Int {
        var seq = max(republishScanned, pending.lowest)
        var count = 0
        // Published in sequence order, so the first one young enough ends the search.
        while seq < pending.next, count < limit {
            guard var p = pending[seq] else {
                seq += 1
                continue
            }
            guard now - p.publishedAt >= after else { break }
            defer { seq += 1 }
            guard p.copy == .none, p.batch.original == nil, p.returned == nil, p.batch.messages.indices.contains(p.index)
            else { continue }
            let m = p.batch.messages[p.index]
            guard m.repeatable, !m.mandatory else { continue }
            p.copy = .waiting
            pending.update(seq, p)
            let copySeq = pending.next
            write(m, .copy(of: .init(batch: p.batch, index: p.index, seq: seq, publishedAt: p.publishedAt)))
            if pending[copySeq]?.batch.original?.seq == seq {
                copies.append(copySeq)
                count += 1
            } else if var o = pending[seq], o.copy == .waiting {
                // Not written (refused at once): the original decides.
                o.copy = .failed
                pending.update(seq, o)
            }
        }
        republishScanned = seq
        return count
    }

    /// Marks the earliest waiting mandatory publish that matches a basic.return.
    func markReturned(_ r: ReturnedMessage) {
        var seq = pending.lowest
        while seq < pending.next {
            // A batch keeps its messages only when one is mandatory.
            if var p = pending[seq], p.returned == nil, p.batch.messages.indices.contains(p.index) {
                let m = p.batch.messages[p.index]
                if m.mandatory, m.exchange == r.exchange, m.routingKey == r.routingKey, m.body == r.body {
                    p.returned = (r.replyCode, r.replyText)
                    pending.update(seq, p)
                    return
                }
            }
            seq += 1
        }
    }
}
