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
            return try await channel.publish(messages)
        } catch let error as AMQPError where error.code == .channelClosed {
            // The broker closed the channel (e.g. 404 on an exchange): the next publish gets a new one.
            state.withLock { s in
                if s.live?.publishChannel?.id == channel.id { s.live?.publishChannel = nil }
            }
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
            then?(result)
            guard case .failure(let error as AMQPError) = result, error.code == .channelClosed else { return }
            self?.state.withLock { s in
                if s.live?.publishChannel?.id == channel.id { s.live?.publishChannel = nil }
            }
        }
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
