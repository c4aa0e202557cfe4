import AMQP
import FrontDeskModel
import ServiceKit

/// The router's broker objects, besides the shared ones.
enum RouterTopology {
    /// Every message on `frontdesk.commands` (bound with `#`, so an unknown
    /// routing key is dead-lettered, not dropped). Quorum.
    static let intakeQueue = "frontdesk.router.intake"
    /// Where the intake's messages go when they expire: a producer may set
    /// `expiration` (untrusted, like every property), and a quorum queue
    /// drops an expired message, so a request sent while the router was down
    /// or behind was lost without a trace. The router reads this queue and
    /// dead-letters each message with the reason.
    static let expiredQueue = "frontdesk.router.intake.expired"
    static let intakeArguments: FieldTable = [
        "x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": .string(expiredQueue),
    ]
    /// The decision log: one record per request id, in one total order. The
    /// first record of an id wins on every replica. A stream, replayed on start.
    static let decisionLog = "frontdesk.router.decisions"
    static func declare(
        on channel: AMQPChannel, partitions: SenderPartitions, statusLogWayRefused: (AMQPError) -> Void = { _ in },
        intakeWithoutExpiredWay: (AMQPError) -> Void = { _ in }
    ) async throws {
        var channel = channel
        try await SharedTopology.declare(on: channel)
        try await channel.queueDeclare(expiredQueue, arguments: ["x-queue-type": "quorum"])
        do {
            try await channel.queueDeclare(intakeQueue, arguments: intakeArguments)
        } catch let error as AMQPError where error.replyCode == 406 {
            // Declared by an older build (or definitions) without the way for
            // expired messages: used as it is, and said.
            channel = try await channel.reopened()
            try await channel.queueDeclare(intakeQueue, passive: true)
            intakeWithoutExpiredWay(error)
        }
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
