import Foundation

/// Where a consumer's deliveries go, and how it learns that it ended.
struct ConsumerSink: Sendable {
    let deliver: @Sendable (AMQPDelivery) -> Void
    /// nil: cancelled by us; an error: by the broker or with the connection.
    let finish: @Sendable (AMQPError?) -> Void
}

/// The publishes of one `publish` call, resolved together.
final class PublishBatch {
    var results: [Result<Void, AMQPError>?]
    var remaining: Int
    /// Called once, on the connection thread, with every result or the error.
    let complete: (Result<[Result<Void, AMQPError>], Error>) -> Void

    init(count: Int, complete: @escaping (Result<[Result<Void, AMQPError>], Error>) -> Void) {
        results = Array(repeating: nil, count: count)
        remaining = count
        self.complete = complete
    }

    func resolve(_ index: Int, _ result: Result<Void, AMQPError>) {
        guard results[index] == nil else { return }
        results[index] = result
        remaining -= 1
        if remaining == 0 { complete(.success(results.map { $0! })) }
    }
}

/// A publish waiting for its confirm.
struct PendingPublish {
    let batch: PublishBatch
    let index: Int
    /// For mandatory publishes: what a basic.return is matched against.
    let exchange: String?
    let routingKey: String?
    let body: Data?
    var returned: ReturnedMessage?
    let publishedAt: ContinuousClock.Instant
}

/// One open channel, seen from the owner thread.
final class ChannelState {
    let id: UInt16
    /// Distinguishes this channel from a later one that reuses its number, so
    /// that a stale delivery tag is never acked on the wrong channel.
    let epoch: UInt64
    var closedError: AMQPError?
    var confirming = false
    var nextPublishSeq: UInt64 = 1
    var lowestPending: UInt64 = 1
    var pending: [UInt64: PendingPublish] = [:]
    var consumers: [String: ConsumerSink] = [:]

    init(id: UInt16, epoch: UInt64) {
        self.id = id
        self.epoch = epoch
    }

    /// Ends the channel: fails waiting publishes and ends consumers.
    func fail(_ error: AMQPError) {
        guard closedError == nil else { return }
        closedError = error
        for seq in pending.keys.sorted() {
            let p = pending[seq]!
            p.batch.resolve(p.index, .failure(error))
        }
        pending.removeAll()
        let sinks = consumers.values
        consumers.removeAll()
        for s in sinks { s.finish(error) }
    }

    /// Applies basic.ack / basic.nack for `tag` (and below it when `multiple`).
    func confirm(tag: UInt64, multiple: Bool, ack: Bool) {
        let range: ClosedRange<UInt64> = multiple ? min(lowestPending, tag)...tag : tag...tag
        for seq in range {
            guard let p = pending.removeValue(forKey: seq) else { continue }
            if let r = p.returned {
                p.batch.resolve(p.index, .failure(AMQPError(
                    .returned, "the broker returned the message: \(AMQPError.replyName(r.replyCode)) \(r.replyText)",
                    replyCode: r.replyCode)))
            } else if ack {
                p.batch.resolve(p.index, .success(()))
            } else {
                p.batch.resolve(p.index, .failure(AMQPError(.nacked, "the broker nacked the message")))
            }
        }
        while lowestPending < nextPublishSeq, pending[lowestPending] == nil { lowestPending += 1 }
    }

    /// Fails publishes whose confirm has not come within `timeout` (a
    /// blocked or overloaded broker); a late confirm then changes nothing.
    func expireConfirms(olderThan timeout: Duration, now: ContinuousClock.Instant) {
        while lowestPending < nextPublishSeq {
            guard let p = pending[lowestPending] else {
                lowestPending += 1
                continue
            }
            guard now - p.publishedAt >= timeout else { return }
            pending[lowestPending] = nil
            p.batch.resolve(p.index, .failure(AMQPError(
                .timeout, "no publisher confirm within \(timeout); the broker may be blocked or overloaded")))
            lowestPending += 1
        }
    }

    /// Marks the earliest waiting mandatory publish that matches a basic.return.
    func markReturned(_ r: ReturnedMessage) {
        var seq = lowestPending
        while seq < nextPublishSeq {
            if var p = pending[seq], p.returned == nil, p.exchange == r.exchange,
                p.routingKey == r.routingKey, p.body == r.body
            {
                p.returned = r
                pending[seq] = p
                return
            }
            seq += 1
        }
    }
}
