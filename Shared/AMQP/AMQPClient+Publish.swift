import Foundation

extension AMQPClient {
    /// Publishes with confirms on the current connection; see `AMQPChannel.publish`.
    /// Throws `.connectionClosed` while disconnected: the caller retries, or
    /// leaves its input unacked so that the broker redelivers it.
    public func publish(_ message: OutboundMessage) async throws {
        try await publish([message])[0].get()
    }

    public func publish(_ messages: [OutboundMessage]) async throws -> [Result<Void, AMQPError>] {
        let channel = try await publishChannel()
        do {
            let results = try await channel.publish(messages)
            retireIfNacked(channel, results)
            return results
        } catch let error as AMQPError where error.code == .channelClosed {
            // The broker closed the channel (e.g. 404 on an exchange): the next publish gets a new one.
            forget(channel)
            throw error
        }
    }

    /// Hands a window to the current connection now, in call order, without
    /// waiting for its confirms (see `AMQPChannel.publishWithoutWaiting`).
    /// `then` runs once on the connection thread when the window is confirmed
    /// or has failed: for callers that only need to note the outcome.
    public func publishWithoutWaiting(
        _ messages: [OutboundMessage], then: (@Sendable (Result<PublishConfirms.Results, Error>) -> Void)? = nil
    ) async throws -> PublishConfirms {
        let channel = try await publishChannel()
        // Should the broker have closed the channel, the next window gets a new one.
        return channel.publishWithoutWaiting(messages) { [weak self] result in
            // Before `then`: a window it publishes next goes on the new channel.
            switch result {
            case .success(let results): self?.retireIfNacked(channel, results)
            case .failure(let error as AMQPError) where error.code == .channelClosed: self?.forget(channel)
            case .failure: break
            }
            then?(result)
        }
    }

    /// The next publish opens a new channel if `channel` is still the current one.
    private func forget(_ channel: AMQPChannel) {
        state.withLock { s in
            if let current = s.live?.publishChannel, current.isSame(as: channel) { s.live?.publishChannel = nil }
        }
    }

    /// A nack retires the publish channel at most this often: a queue that
    /// refuses every publish (full, `reject-publish`) must not cost a channel
    /// open and close a window.
    public static let retireInterval = Duration.seconds(1)

    /// A nack retires the channel: later publishes go to a new one, and it
    /// closes once its other publishes are settled. On RabbitMQ 3.10 a
    /// channel whose first publish to a quorum queue found that queue's
    /// recorded leader node down keeps nacking every publish to that queue
    /// for as long as it lives (its queue client never looks for the new
    /// leader); a new channel starts from the queue's current record.
    /// A nack answered by the message's `ifNacked` way counts too: the
    /// queue that refused it may be one that such a channel can no longer reach.
    private func retireIfNacked(_ channel: AMQPChannel, _ results: PublishConfirms.Results) {
        guard channel.hadRedirectedNack || results.contains(where: { if case .failure(let e) = $0 { e.code == .nacked } else { false } })
        else { return }
        let now = ContinuousClock.now
        let retired = state.withLock { s -> Bool in
            guard let current = s.live?.publishChannel, current.isSame(as: channel),
                s.live?.retiredAt.map({ now - $0 >= Self.retireInterval }) ?? true
            else { return false }
            s.live?.publishChannel = nil
            s.live?.retiredAt = now
            return true
        }
        if retired { channel.closeWhenSettled() }
    }

    private func publishChannel() async throws -> AMQPChannel {
        let (connection, channel) = state.withLock { ($0.live?.connection, $0.live?.publishChannel) }
        guard let connection else {
            throw AMQPError(.connectionClosed, "not connected to \(configuration.connection.url)")
        }
        if let channel { return channel }
        let fresh = try await connection.openChannel()
        try await fresh.confirmSelect()
        let winner = state.withLock { s -> AMQPChannel? in
            guard s.live?.connection === connection else { return nil }
            if let existing = s.live?.publishChannel { return existing }
            s.live?.publishChannel = fresh
            return fresh
        }
        if winner?.id != fresh.id { await fresh.close() }
        guard let winner else { throw AMQPError(.connectionClosed, "the connection changed while opening a channel") }
        return winner
    }
}
