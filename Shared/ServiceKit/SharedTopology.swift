import AMQP

/// The broker objects both services declare (CONTRACT.md, Broker objects).
public enum SharedTopology {
    public static let commandsExchange = "frontdesk.commands"
    public static let statusExchange = "frontdesk.status"
    public static let deadLetterExchange = "frontdesk.dead"
    public static let deadLetterQueue = "frontdesk.dead"

    public static func declare(on channel: AMQPChannel) async throws {
        try await channel.exchangeDeclare(commandsExchange, type: "topic")
        try await channel.exchangeDeclare(statusExchange, type: "topic")
        try await channel.exchangeDeclare(deadLetterExchange, type: "fanout")
        try await channel.queueDeclare(deadLetterQueue, arguments: ["x-queue-type": "quorum"])
        try await channel.queueBind(deadLetterQueue, exchange: deadLetterExchange, routingKey: "")
    }
}
