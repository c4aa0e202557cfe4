import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

/// Presence: who is online and how many wait in each park queue, polled by
/// passive declares; a target that comes online starts its park consumer, one
/// that goes offline puts its dispatches back in `queued`.
extension SenderTerm {
    /// Every 300 ms: consumers on each agent queue and messages in each park queue.
    static func pollPresence(channel: AMQPChannel, routes: [RoutingTable.Route], feed: BatchQueue<Input>) async {
        while !Task.isCancelled {
            guard let snapshot = try? await presenceSnapshot(channel, routes: routes) else { return feed.finish() }
            feed.yield(.presence(snapshot))
            try? await Task.sleep(for: .milliseconds(300))
        }
    }

    /// Consumers on each agent queue and messages in each park queue, by passive declares.
    static func presenceSnapshot(
        _ channel: AMQPChannel, routes: [RoutingTable.Route]
    ) async throws -> [RoutingTable.Route: (consumers: UInt32, parked: UInt32)] {
        var snapshot: [RoutingTable.Route: (consumers: UInt32, parked: UInt32)] = [:]
        for r in routes {
            let agents = try await channel.queueDeclare(SenderTopology.agentQueue(r), passive: true)
            let parked = try await channel.queueDeclare(SenderTopology.parkQueue(r), passive: true)
            snapshot[r] = (agents.consumerCount, parked.messageCount)
        }
        return snapshot
    }

    func presenceChanged(_ snapshot: [RoutingTable.Route: (consumers: UInt32, parked: UInt32)], now: Date) async throws {
        let before = presence
        presence = snapshot
        for (route, now_) in snapshot {
            let wasOnline = (before[route]?.consumers ?? 0) > 0
            let isOnline = now_.consumers > 0
            metrics.parked.set(Double(now_.parked), route.description)
            metrics.agents.set(Double(now_.consumers), route.description)
            if isOnline, now_.parked > 0, parkConsumers[route] == nil {
                let channel = try await connection.openChannel()
                try await channel.qos(prefetchCount: 200)
                let consumer = try await channel.consume(queue: SenderTopology.parkQueue(route))
                parkConsumers[route] = consumer
                forwarders.append(Task(executorPreference: connection.executor) { [feed] in
                    do { for try await d in consumer { feed.yield(.parked(d, route)) } } catch {}
                })
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
