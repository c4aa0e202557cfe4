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
/// 3.10 channel keeps asking a dead leader). A repeatable message (its queues
/// drop a repeat) goes to its own exchange again on a confirming channel of
/// its own, `reofferGaps` apart, until every queue takes it (an ack) or the
/// gaps run out; after a refused round that channel is replaced. What waits
/// is bounded in bytes, and a queue that keeps refusing costs a few
/// publishes, never a wait.
extension ConnectionLoop {
    /// The wait before each offer: 1 s after the nack, then 3 s and 9 s.
    static let reofferGaps: [Duration] = [.seconds(1), .seconds(2), .seconds(6)]
    /// At most this many body bytes wait to be offered again; past it a
    /// refused message is not (`AMQPConnection.reofferDroppedMessages`).
    static let maxReofferBytes = 8 * 1024 * 1024
    /// At most this many body bytes a round (at least one message), one round a second.
    static let reofferBytesPerRound = 1024 * 1024
    static let reofferRoundInterval = Duration.seconds(1)

    /// Offers `message` again after gap number `offered`, unless the gaps
    /// ran out or too many bytes wait.
    func scheduleReoffer(_ message: OutboundMessage, offered: Int, now: ContinuousClock.Instant) {
        guard offered < Self.reofferGaps.count else { return }
        guard reofferBytes + message.body.count <= Self.maxReofferBytes else { return core.noteReofferDropped() }
        var m = message
        // Not sent on again by a nack, nor copied when its confirm is late.
        m.ifNacked = nil
        m.repeatable = false
        reoffers.append(Reoffer(message: m, due: now + Self.reofferGaps[offered], offered: offered))
        reofferBytes += message.body.count
    }

    /// Publishes the offers that are due, if a round is.
    func reofferDue(now: ContinuousClock.Instant) {
        guard !reoffers.isEmpty, now - lastReofferRound >= Self.reofferRoundInterval, core.blockedReason == nil else { return }
        var due: [Reoffer] = []
        var kept: [Reoffer] = []
        var bytes = 0
        for r in reoffers {
            if r.due <= now, bytes < Self.reofferBytesPerRound {
                due.append(r)
                bytes += r.message.body.count
            } else {
                kept.append(r)
            }
        }
        guard !due.isEmpty else { return }
        lastReofferRound = now
        reoffers = kept
        reofferBytes -= bytes
        guard let ch = openReofferChannel() else {
            for r in due { scheduleReoffer(r.message, offered: r.offered + 1, now: now) }
            return
        }
        let batch = PublishBatch(count: due.count) { [weak self] outcome in
            // On the connection thread, as the confirms come. A channel or
            // connection that ended takes its offers with it.
            guard let self, case .success(let results) = outcome else { return }
            var refused = false
            for (r, result) in zip(due, results) {
                guard case .failure(let error) = result, error.code == .nacked else { continue }
                refused = true
                scheduleReoffer(r.message, offered: r.offered + 1, now: .now)
            }
            if refused { retireReofferChannel(ch) }
        }
        publish(ch, due.map(\.message), batch: batch)
        core.noteReoffered(due.count)
    }

    /// The channel offers go on: kept between rounds, opened (confirming) when there is none.
    private func openReofferChannel() -> ChannelState? {
        if let ch = reofferChannel, channels[ch.id] === ch, ch.closedError == nil, ch.closeWhenSettled == nil { return ch }
        reofferChannel = nil
        guard let ch = try? openChannel() else { return nil }
        guard (try? confirmSelect(ch)) != nil else {
            closeChannel(ch)
            return nil
        }
        reofferChannel = ch
        return ch
    }

    /// A round refused on `ch`: the next goes on a new channel, and `ch` closes once settled.
    private func retireReofferChannel(_ ch: ChannelState) {
        if reofferChannel === ch { reofferChannel = nil }
        if ch.closeWhenSettled == nil { ch.closeWhenSettled = .now }
    }
}
