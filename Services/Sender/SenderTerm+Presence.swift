import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

/// Presence: who is online and how many wait in each park queue, polled by
/// passive declares; a target that comes online starts its park consumer, one
/// that goes offline puts its dispatches back in `queued`.
extension SenderTerm {
    static let presencePollInterval = Duration.milliseconds(300)
    /// A target without agents has its park queue counted every this many
    /// polls (3 s), not every poll: the count then feeds only the
    /// `frontdesk_sender_parked` gauge. Idle with 100 targets and no agents
    /// the polls' 667 declares a second cost the sender 16.5 and the broker
    /// 42.5 CPU-ms a second (scripts/evidence/idle.py, 2026-12-07).
    static let offlineParkCountEvery = 10

    /// Every `presencePollInterval`: consumers on each agent queue and
    /// messages in each park queue. The pause is timed by the connection's
    /// thread, as `tick`'s is.
    static func pollPresence(channel: AMQPChannel, _ connection: AMQPConnection, routes: [RoutingTable.Route], feed: BatchQueue<Input>) async {
        var channel = channel
        var last: PresenceSnapshot?
        var polls = 0
        while !Task.isCancelled {
            // At once first (counting every park queue): an agent may have come
            // since the term's own snapshot, taken before its consumers started.
            let countAll = polls % offlineParkCountEvery == 0
            guard let snapshot = try? await presenceSnapshot(&channel, connection, routes: routes, last: countAll ? nil : last)
            else { return feed.finish() }
            last = snapshot
            feed.yield(.presence(snapshot))
            polls &+= 1
            await connection.sleep(for: presencePollInterval)
            // Closed: the sleep ends at once from now on (with no routes, no declare fails).
            guard connection.isOpen else { return feed.finish() }
        }
    }

    /// Consumers on each agent queue and messages in each park queue, by
    /// passive declares. An agent's login may delete its own target's queue:
    /// a queue that is gone (404, which closes `channel`: a new one takes its
    /// place) counts as no agents, and is declared again for when they come
    /// back; one an agent holds exclusive (405) counts as no agents too. Only
    /// that target is offline; the term goes on. With `last`, a target
    /// without agents keeps its park count from it (no declare).
    static func presenceSnapshot(
        _ channel: inout AMQPChannel, _ connection: AMQPConnection, routes: [RoutingTable.Route],
        last: PresenceSnapshot? = nil
    ) async throws -> PresenceSnapshot {
        var snapshot: PresenceSnapshot = [:]
        for r in routes {
            var agents: UInt32 = 0
            do {
                agents = try await channel.queueDeclare(SenderTopology.agentQueue(r), passive: true).consumerCount
            } catch let error as AMQPError where error.replyCode == 404 {
                channel = try await connection.openChannel()
                do {
                    try await channel.queueDeclare(SenderTopology.agentQueue(r), arguments: ["x-queue-type": "quorum"])
                } catch let error as AMQPError where error.code == .channelClosed {
                    channel = try await connection.openChannel()
                }
            } catch let error as AMQPError where error.replyCode == 405 {
                // RESOURCE_LOCKED: an agent holds it exclusive (its login may
                // declare it so); no task can reach another connection's
                // consumer there as the sender sees it: offline.
                channel = try await connection.openChannel()
            }
            if agents == 0, let kept = last?[r] {
                snapshot[r] = (0, kept.parked)
                continue
            }
            let parked = try await channel.queueDeclare(SenderTopology.parkQueue(r), passive: true)
            snapshot[r] = (agents, parked.messageCount)
        }
        return snapshot
    }

    /// A consumer of `route`'s park queue, on the channel its earlier ones
    /// used: one channel a target for as long as the term lasts. (A channel
    /// each time the target came online was never closed: an agent that
    /// came and went 2,047 times used up the connection's channels, and the
    /// term ended for every target.) A channel the broker closed is replaced.
    func consumeParked(_ route: RoutingTable.Route) async throws -> AMQPConsumer {
        if let channel = parkChannels[route], let consumer = try? await channel.consume(queue: SenderTopology.parkQueue(route)) {
            return consumer
        }
        let channel = try await connection.openChannel()
        try await channel.qos(prefetchCount: 200)
        parkChannels[route] = channel
        return try await channel.consume(queue: SenderTopology.parkQueue(route))
    }

    func presenceChanged(_ snapshot: PresenceSnapshot, now: Date) async throws {
        let before = presence
        presence = snapshot
        for (route, now_) in snapshot {
            let wasOnline = (before[route]?.consumers ?? 0) > 0
            let isOnline = now_.consumers > 0
            metrics.parked.set(Double(now_.parked), route.description)
            metrics.agents.set(Double(now_.consumers), route.description)
            if isOnline, now_.parked > 0, parkConsumers[route] == nil {
                let consumer = try await consumeParked(route)
                parkConsumers[route] = consumer
                parkForwarders[route] = Task(executorPreference: connection.executor) { [feed] in
                    do { for try await d in consumer { feed.yield(.parked(d, route)) } } catch {}
                }
            }
            if wasOnline, !isOnline {
                if let consumer = parkConsumers.removeValue(forKey: route) {
                    try? await consumer.cancel()
                }
                for id in held.keys.sorted() where held[id]?.machine.route == route {
                    var h = held[id]!
                    let actions = h.machine.agentWentOffline(now: now)
                    held[id] = h
                    try await execute(actions, id: id)
                }
            }
        }
    }
}
