import AMQP
import FrontDeskModel

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

    /// A dead letter of `delivery`: its body and properties, plus the four
    /// headers of CONTRACT.md (code, reason, service, routing key).
    public static func deadLetter(_ delivery: AMQPDelivery, code: DeadLetterCode, reason: String, service: String) -> OutboundMessage {
        var properties = delivery.properties
        var headers = properties.headers ?? FieldTable()
        headers["x-frontdesk-error"] = .string(code.rawValue)
        headers["x-frontdesk-reason"] = .string(reason)
        headers["x-frontdesk-service"] = .string(service)
        headers["x-frontdesk-routing-key"] = .string(delivery.routingKey)
        properties.headers = headers
        properties.deliveryMode = 2
        return OutboundMessage(exchange: deadLetterExchange, routingKey: delivery.routingKey, body: delivery.body, properties: properties)
    }
}
