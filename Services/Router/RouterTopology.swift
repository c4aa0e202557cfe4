import AMQP
import FrontDeskModel
import ServiceKit

/// The router's broker objects, besides the shared ones.
enum RouterTopology {
    /// Every message on `frontdesk.commands` (bound with `#`, so an unknown
    /// routing key is dead-lettered, not dropped). Quorum.
    static let intakeQueue = "frontdesk.router.intake"
    /// The decision log: one record per request id, in one total order. The
    /// first record of an id wins on every replica. A stream, replayed on start.
    static let decisionLog = "frontdesk.router.decisions"
    static func declare(
        on channel: AMQPChannel, partitions: SenderPartitions, statusLogWayRefused: (AMQPError) -> Void = { _ in }
    ) async throws {
        try await SharedTopology.declare(on: channel)
        try await channel.queueDeclare(intakeQueue, arguments: ["x-queue-type": "quorum"])
        try await channel.queueBind(intakeQueue, exchange: SharedTopology.commandsExchange, routingKey: "#")
        // A day of decisions: longer than the default 4-hour lifetime; older
        // records are skipped on replay by their time.
        try await channel.queueDeclare(decisionLog, arguments: [
            "x-queue-type": "stream", "x-max-age": "1D", "x-stream-max-segment-size-bytes": .int64(16_000_000),
        ])
        // The hand-off to the sender, one inbox per partition: routed dispatches, cancels and reroutes.
        for k in partitions.all {
            try await SharedTopology.declareSenderInbox(partition: k, on: channel)
        }
        // Last: where a status event refused by a surface's queue goes again
        // (the sender binds it to the status log).
        if let refused = try await SharedTopology.declareStatusLogWay(on: channel, bindingTheLog: false) { statusLogWayRefused(refused) }
    }
}
