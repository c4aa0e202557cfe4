import Foundation
import AMQP
import FrontDeskModel
import ServiceKit

/// The sender's broker objects, besides the shared ones.
enum SenderTopology {
    /// Hand-offs, cancels and reroutes from the router to partition `k` (declared by both). Quorum.
    static func inbox(_ k: Int) -> String { SharedTopology.senderInbox(partition: k) }
    /// Agents reply here (CONTRACT.md). Quorum. With several partitions,
    /// partition 0's leader passes each reply on to its dispatch's partition.
    static let replies = "frontdesk.replies"
    /// The replies for partition `k`: partition 0's is the contract's queue.
    static func replies(_ k: Int) -> String { k == 0 ? replies : "frontdesk.sender.replies" + SenderPartitions.suffix(k) }
    /// The lock of partition `k`'s leader: an exclusive, transient queue that
    /// only one connection can hold; gone with that connection or its node.
    static func lock(_ k: Int) -> String { "frontdesk.sender.lock" + SenderPartitions.suffix(k) }
    /// Parked dispatches whose lifetime ran out (dead-lettered by TTL), of
    /// partition `k`. Every park queue dead-letters to partition 0's, whose
    /// leader passes the others' on. Quorum.
    static func expired(_ k: Int) -> String { "frontdesk.sender.expired" + SenderPartitions.suffix(k) }
    /// Dispatches of partition `k` whose retry wait ended (dead-lettered from a delay queue). Quorum.
    static func retry(_ k: Int) -> String { "frontdesk.sender.retry" + SenderPartitions.suffix(k) }
    /// Delays are rounded up to this step: a retry is never early and at most this late.
    static let delayStepMs = 500

    /// The largest TTL the broker accepts, per message or per queue: 2^32 − 1 ms.
    static let maxTTLMs = 4_294_967_295

    /// Milliseconds from `now` until `date`, rounded up and clamped to
    /// 1…`maxTTLMs`: whatever the dates (a far-future lifetime, NaN), the
    /// broker gets a TTL it accepts and nothing traps.
    static func ttlMs(until date: Date, now: Date) -> Int {
        let ms = (date.timeIntervalSince(now) * 1000).rounded(.up)
        guard ms.isFinite else { return ms > 0 ? maxTTLMs : 1 }
        return Int(min(max(ms, 1), Double(maxTTLMs)))
    }

    /// The delay queue for a wait of `ms` (rounded up to the step): every
    /// message in it has the same TTL, so none waits behind a longer one.
    static func delayQueue(ms: Int, partition k: Int = 0) -> (name: String, ttlMs: Int) {
        let step = delayStepMs
        let clamped = min(max(ms, 1), maxTTLMs / step * step)
        let ttl = max(step, (clamped + step - 1) / step * step)
        return ("frontdesk.sender.delay.\(ttl)" + SenderPartitions.suffix(k), ttl)
    }

    static func declareDelayQueue(_ name: String, ttlMs: Int, partition k: Int, on channel: AMQPChannel) async throws {
        try await channel.queueDeclare(name, arguments: [
            "x-queue-type": "quorum", "x-message-ttl": .int64(Int64(ttlMs)),
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": .string(retry(k)),
            "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
        ])
    }

    /// Every status event, kept for a day: how a new leader learns what was
    /// published before it (and what `frontdesk watch` can replay).
    static let statusLog = StatusLog.stream

    /// Cancels and reroutes for dispatches this sender does not hold yet. A stream, replayed by each new leader.
    static let commands = "frontdesk.sender.commands"

    static func agentQueue(_ r: RoutingTable.Route) -> String { SharedTopology.agentQueue(r) }
    static func parkQueue(_ r: RoutingTable.Route) -> String { SharedTopology.parkQueue(r) }

    /// Declares the sender's broker objects. An agent's login may declare
    /// its own target's queue (deploy/README.md), maybe first and otherwise
    /// (a classic queue, a length limit): that queue is used as it is, and
    /// `usedAsItIs` hears of it, so that one target's agents never keep the
    /// sender, and every other target, from starting.
    static func declare(
        on connection: AMQPConnection, table: RoutingTable, partitions: SenderPartitions,
        usedAsItIs: (String, AMQPError) -> Void = { _, _ in }, statusLogWayRefused: (AMQPError) -> Void = { _ in }
    ) async throws {
        var channel = try await connection.openChannel()
        do {
            try await declare(on: &channel, connection, table: table, partitions: partitions, usedAsItIs: usedAsItIs)
            // Last, as it may close the channel (SharedTopology.declareStatusLogWay).
            if let refused = try await SharedTopology.declareStatusLogWay(on: channel, bindingTheLog: true) { statusLogWayRefused(refused) }
            await channel.close()
        } catch {
            await channel.close()
            throw error
        }
    }

    private static func declare(
        on channel: inout AMQPChannel, _ connection: AMQPConnection, table: RoutingTable, partitions: SenderPartitions,
        usedAsItIs: (String, AMQPError) -> Void
    ) async throws {
        try await SharedTopology.declare(on: channel)
        let quorum: FieldTable = ["x-queue-type": "quorum"]
        for k in partitions.all {
            try await SharedTopology.declareSenderInbox(partition: k, on: channel)
            try await channel.queueDeclare(replies(k), arguments: quorum)
            try await channel.queueDeclare(expired(k), arguments: quorum)
            try await channel.queueDeclare(retry(k), arguments: quorum)
        }
        try await channel.queueDeclare(commands, arguments: ["x-queue-type": "stream", "x-max-age": "1D"])
        try await SharedTopology.declareStatusLog(on: channel)
        for route in table.routes {
            do {
                try await channel.queueDeclare(agentQueue(route), arguments: quorum)
            } catch let error as AMQPError where error.replyCode == 406 || error.replyCode == 405 {
                // PRECONDITION_FAILED: it exists with other arguments;
                // RESOURCE_LOCKED: an agent declared it exclusive. The broker
                // closed the channel; the rest go on a new one.
                usedAsItIs(agentQueue(route), error)
                await channel.close()
                channel = try await connection.openChannel()
            }
            try await channel.queueDeclare(parkQueue(route), arguments: [
                "x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": .string(expired(0)),
            ])
        }
    }
}
