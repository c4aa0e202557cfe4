/// A message a queue refused, to be offered to it again.
struct Reoffer {
    let message: OutboundMessage
    var due: ContinuousClock.Instant
    /// How many times it was offered again so far.
    var offered: Int
}

/// Offering refused messages again. A nack answered through the message's
/// `ifNacked` way leaves the queue that refused it without it: a surface's
/// queue that was full for a moment, or one whose leader had moved (a RabbitMQ
/// 3.10 channel keeps asking a dead leader). The message goes to its own
/// exchange again, unconfirmed, `reofferGaps` apart, on a channel opened for
/// the round: only a repeatable message, whose queues drop the repeat; and a
/// queue that keeps refusing costs a bounded few publishes, never a wait.
extension ConnectionLoop {
    /// The wait before each offer: 1 s after the nack, then 3 s and 9 s.
    static let reofferGaps: [Duration] = [.seconds(1), .seconds(2), .seconds(6)]
    /// At most this many wait to be offered again; later ones are not.
    static let maxReoffers = 4096
    /// At most this many a round, and one round a second.
    static let reoffersPerRound = 512
    static let reofferRoundInterval = Duration.seconds(1)

    /// Offers `message` again later if it is repeatable (its queues drop a
    /// repeat); one that is not (a dead letter) would be taken again by
    /// every queue that took it.
    func scheduleReoffer(_ message: OutboundMessage) {
        guard message.repeatable, reoffers.count < Self.maxReoffers else { return }
        var m = message
        m.ifNacked = nil
        m.repeatable = false
        reoffers.append(Reoffer(message: m, due: .now + Self.reofferGaps[0], offered: 0))
    }

    /// Publishes the offers that are due, if a round is.
    func reofferDue(now: ContinuousClock.Instant) {
        guard !reoffers.isEmpty, now - lastReofferRound >= Self.reofferRoundInterval, core.blockedReason == nil else { return }
        var due: [OutboundMessage] = []
        var kept: [Reoffer] = []
        kept.reserveCapacity(reoffers.count)
        for var r in reoffers {
            guard r.due <= now, due.count < Self.reoffersPerRound else {
                kept.append(r)
                continue
            }
            due.append(r.message)
            r.offered += 1
            if r.offered < Self.reofferGaps.count {
                r.due = now + Self.reofferGaps[r.offered]
                kept.append(r)
            }
        }
        guard !due.isEmpty else { return }
        lastReofferRound = now
        reoffers = kept
        // A channel of its own, without confirms: a new one each round, since
        // a channel that met a dead leader keeps refusing that queue.
        guard let ch = try? openChannel() else { return }
        publish(ch, due, batch: PublishBatch(count: due.count) { _ in })
        closeChannel(ch)
        core.noteReoffered(due.count)
    }
}
