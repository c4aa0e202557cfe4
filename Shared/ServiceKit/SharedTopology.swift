import AMQP
import Foundation
import FrontDeskModel
import Synchronization

/// The broker objects both services declare (CONTRACT.md, Broker objects).
public enum SharedTopology {
    public static let commandsExchange = "frontdesk.commands"
    public static let statusExchange = "frontdesk.status"
    public static let deadLetterExchange = "frontdesk.dead"
    public static let deadLetterQueue = "frontdesk.dead"

    /// Every status event, kept for a day, in one order: how a new sender
    /// leader learns what was published before it, and where the gateway
    /// reads a dispatch's history. Declared by the sender and the gateway.
    public static let statusLog = "frontdesk.status.log"

    public static func declareStatusLog(on channel: AMQPChannel) async throws {
        try await channel.queueDeclare(statusLog, arguments: ["x-queue-type": "stream", "x-max-age": "1D"])
        try await channel.queueBind(statusLog, exchange: statusExchange, routingKey: "status.#")
    }

    /// Declares `statusLogExchange` (and, `bindingTheLog`, its binding to the
    /// status log: the sender's part) as the last of a service's topology:
    /// a login not yet allowed to (definitions older than this exchange)
    /// makes the broker close `channel` with 403, and the service then
    /// publishes its status events without that way (`statusLogWayInUse`),
    /// as before it, instead of never starting. Returns that refusal.
    public static func declareStatusLogWay(on channel: AMQPChannel, bindingTheLog: Bool) async throws -> AMQPError? {
        do {
            try await channel.exchangeDeclare(statusLogExchange, type: "topic")
            if bindingTheLog { try await channel.queueBind(statusLog, exchange: statusLogExchange, routingKey: "status.#") }
            statusLogWayInUse.store(true, ordering: .relaxed)
            return nil
        } catch let error as AMQPError where error.replyCode == 403 {
            statusLogWayInUse.store(false, ordering: .relaxed)
            return error
        }
    }

    /// What a service logs when `declareStatusLogWay` was refused.
    public static func warnStatusLogWayRefused(_ logger: Logger, _ error: AMQPError) {
        logger.warning(
            "may not declare \(statusLogExchange) (definitions older than this build?): status events go without it, and a surface's queue that refuses them makes the service publish them again", [("error", .string("\(error)"))])
    }

    /// Whether this process's status events name `statusLogExchange` as
    /// their way for a nack: set by `declareStatusLogWay`.
    public static let statusLogWayInUse = Atomic<Bool>(true)

    /// The status log's own way in, bound to nothing else, where only the
    /// services may publish or bind. Any surface may bind a queue to
    /// `frontdesk.status`, also one that refuses what it is sent (full, with
    /// `x-overflow: reject-publish`): the broker then nacks the event, though
    /// the log and every other queue took it. Such an event is published
    /// again here (`statusEvent`), so that the service goes on once the log
    /// surely has it, and one surface's queue cannot stall every dispatch.
    /// Declared by the router and the sender; only the sender binds the log
    /// to it, so no other login needs to read it (and could bind a queue).
    public static let statusLogExchange = "frontdesk.status.refused"

    /// A status event (CONTRACT.md) for `frontdesk.status`, with the status
    /// log's own way for a nack. Repeatable: surfaces and the log drop a
    /// repeated seq, so a copy (an overdue confirm, or a nack) is harmless.
    public static func statusEvent(routingKey: String, body: Data, properties: AMQPProperties) -> OutboundMessage {
        OutboundMessage(
            exchange: statusExchange, routingKey: routingKey, body: body, properties: properties, repeatable: true,
            ifNacked: statusLogWayInUse.load(ordering: .relaxed) ? .init(exchange: statusLogExchange, routingKey: routingKey) : nil)
    }

    /// Hand-offs, cancels and reroutes from the router to the sender's
    /// partition `k` (declared by both). Quorum.
    public static func senderInbox(partition k: Int) -> String { "frontdesk.sender.inbox" + SenderPartitions.suffix(k) }

    /// Where the router publishes hand-offs, cancels and reroutes: a direct
    /// exchange bound to each inbox by the inbox's name. Like
    /// `frontdesk.status`, only the services write to it, so the sender
    /// trusts what comes through it whatever login the router runs as; what
    /// reaches an inbox by the default exchange (which every agent may write
    /// to) counts only with the sender's own or FRONTDESK_ROUTER_USER's
    /// validated user_id.
    public static let handOffExchange = "frontdesk.sender.handoff"

    /// Partition `k`'s inbox and its binding (declared by both services).
    public static func declareSenderInbox(partition k: Int, on channel: AMQPChannel) async throws {
        try await channel.exchangeDeclare(handOffExchange, type: "direct")
        try await channel.queueDeclare(senderInbox(partition: k), arguments: ["x-queue-type": "quorum"])
        try await channel.queueBind(senderInbox(partition: k), exchange: handOffExchange, routingKey: senderInbox(partition: k))
    }

    /// A target's task queue (CONTRACT.md): online while it has a consumer.
    public static func agentQueue(_ r: RoutingTable.Route) -> String { "frontdesk.agent.\(r.project).\(r.target)" }
    /// Where the sender keeps a target's dispatches while it is offline.
    public static func parkQueue(_ r: RoutingTable.Route) -> String { "frontdesk.sender.park.\(r.project).\(r.target)" }

    /// Status events reach the status log and the surfaces' queues through
    /// `frontdesk.status`, where only the services may publish. Whoever may
    /// write to the default exchange (every agent) can put a message in any of
    /// those queues by its name; such a message carries the queue's name as its
    /// routing key, never `status.…`, and is no status event.
    public static func cameByTheStatusExchange(_ d: AMQPDelivery) -> Bool {
        d.exchange == statusExchange || d.routingKey.hasPrefix("status.")
    }

    public static func declare(on channel: AMQPChannel) async throws {
        try await channel.exchangeDeclare(commandsExchange, type: "topic")
        try await channel.exchangeDeclare(statusExchange, type: "topic")
        try await channel.exchangeDeclare(deadLetterExchange, type: "fanout")
        try await channel.queueDeclare(deadLetterQueue, arguments: ["x-queue-type": "quorum"])
        try await channel.queueBind(deadLetterQueue, exchange: deadLetterExchange, routingKey: "")
    }

    /// A dead letter of `delivery`: its body, exactly the properties that
    /// CONTRACT.md keeps (content_type, type, message_id, correlation_id,
    /// timestamp, headers less `CC` and `BCC`), plus the four headers of
    /// code, reason, service and routing key. Nothing else of the incoming
    /// message (user_id, expiration, reply_to, priority, …) is carried over:
    /// the broker would refuse another user's `user_id`, and act on `CC`.
    ///
    /// The properties must fit one frame, as the incoming message's did
    /// (the delivery's connection's `frameMax`), with less room: copied
    /// headers are kept in order while they fit in `frameMax -
    /// deadLetterReserve`, the rest are left out and counted in
    /// `x-frontdesk-headers-dropped`. Without that, a message whose headers
    /// nearly fill a frame would have a dead letter no broker takes, and be
    /// retried forever. For the same reason what was read longer than AMQP
    /// carries (bytes that are not UTF-8 read as U+FFFD, three bytes each) is
    /// cut: short strings to 255 bytes; a header with a longer key in it is
    /// left out.
    public static func deadLetter(
        _ delivery: AMQPDelivery, code: DeadLetterCode, reason: String, service: String
    ) -> OutboundMessage {
        let incoming = delivery.properties
        var kept: [(String, FieldValue)] = []
        var room = delivery.frameMax - deadLetterReserve
        var dropped: Int64 = 0
        for (key, value) in incoming.headers ?? FieldTable() where !routingHeaders.contains(key.uppercased()) {
            let size = 1 &+ key.utf8.count &+ value.encodedSize
            if size <= room, FieldTable.keysFit(key, value) {
                kept.append((key, value))
                room -= size
            } else {
                dropped += 1
            }
        }
        // Appended, not assigned one by one: assignment looks for the key, and
        // a producer may send thousands of headers.
        var headers = FieldTable(kept)
        // The service's own count, never a producer's header of that name.
        headers["x-frontdesk-headers-dropped"] = dropped > 0 ? .int64(dropped) : nil
        headers["x-frontdesk-error"] = .string(code.rawValue)
        headers["x-frontdesk-reason"] = .string(reason.utf8Prefix(maxReasonBytes))
        headers["x-frontdesk-service"] = .string(service)
        headers["x-frontdesk-routing-key"] = .string(delivery.routingKey)
        let short = FieldTable.maxShortStringBytes
        let properties = AMQPProperties(
            contentType: incoming.contentType?.utf8Prefix(short), headers: headers, deliveryMode: 2,
            correlationID: incoming.correlationID?.utf8Prefix(short), messageID: incoming.messageID?.utf8Prefix(short),
            timestamp: incoming.timestamp, type: incoming.type?.utf8Prefix(short))
        // `frontdesk.dead` is a fanout that whoever may read it can bind a
        // queue to: one that refuses (full, `reject-publish`) must not make
        // the letter fail and its message come again for ever. The letter
        // then goes to the queue `frontdesk.dead` alone, which most likely
        // took it already (a nack does not say which queue refused): then it
        // holds that letter twice, never more.
        return OutboundMessage(
            exchange: deadLetterExchange, routingKey: delivery.routingKey.utf8Prefix(short), body: delivery.body, properties: properties,
            ifNacked: .init(exchange: "", routingKey: deadLetterQueue))
    }

    /// What a dead letter's properties may take beyond the copied headers:
    /// the frame's own bytes, four short strings of ≤ 255 bytes, and the four
    /// x-frontdesk headers (the routing key as read ≤ 765: 255 bytes, each maybe
    /// U+FFFD; the reason ≤ `maxReasonBytes`).
    static let deadLetterReserve = 4096
    static let maxReasonBytes = 1024

    /// Headers the broker itself acts on when routing (sender-selected
    /// distribution): never carried into a message the services publish.
    static let routingHeaders: Set<String> = ["CC", "BCC"]
}
