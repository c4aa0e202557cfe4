import AMQP
import FrontDeskModel
import ServiceKit

/// The sender's broker objects, besides the shared ones.
enum SenderTopology {
    /// Hand-offs, cancels and reroutes from the router (declared by both). Quorum.
    static let inbox = "frontdesk.sender.inbox"
    /// Agents reply here (CONTRACT.md). Quorum.
    static let replies = "frontdesk.replies"
    /// One token message; the replica holding it unacked leads. Quorum, at most one message.
    static let leader = "frontdesk.sender.leader"
    /// Parked dispatches whose lifetime ran out (dead-lettered by TTL). Quorum.
    static let expired = "frontdesk.sender.expired"
    /// Cancels and reroutes for dispatches this sender does not hold yet. A stream, replayed by each new leader.
    static let commands = "frontdesk.sender.commands"

    static func agentQueue(_ r: RoutingTable.Route) -> String { "frontdesk.agent.\(r.project).\(r.target)" }
    static func parkQueue(_ r: RoutingTable.Route) -> String { "frontdesk.sender.park.\(r.project).\(r.target)" }

    static func declare(on channel: AMQPChannel, table: RoutingTable) async throws {
        try await SharedTopology.declare(on: channel)
        let quorum: FieldTable = ["x-queue-type": "quorum"]
        try await channel.queueDeclare(inbox, arguments: quorum)
        try await channel.queueDeclare(replies, arguments: quorum)
        try await channel.queueDeclare(expired, arguments: quorum)
        try await channel.queueDeclare(leader, arguments: ["x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "reject-publish"])
        try await channel.queueDeclare(commands, arguments: ["x-queue-type": "stream", "x-max-age": "1D"])
        for route in table.routes {
            try await channel.queueDeclare(agentQueue(route), arguments: quorum)
            try await channel.queueDeclare(parkQueue(route), arguments: [
                "x-queue-type": "quorum", "x-dead-letter-exchange": "", "x-dead-letter-routing-key": .string(expired),
            ])
        }
    }
}
