import AMQP

/// Who may write the services' internal messages (hand-offs, decision
/// records, parked and delayed copies, waiting records, markers, kept
/// commands). Agents must be allowed to publish to the default exchange
/// (their replies go there), so they can reach any queue by name; what
/// tells the services' own messages apart is the `user_id` the broker
/// validates against the login of the connection that published it. Every
/// internal message carries its writer's login, and a consumer of an
/// internal queue takes only those of `logins`.
public struct InternalWriters: Sendable {
    public let logins: Set<String>

    public init(_ logins: Set<String>) { self.logins = logins }

    /// True when the broker vouches that one of `logins` published it.
    public func wrote(_ delivery: AMQPDelivery) -> Bool {
        delivery.properties.userID.map(logins.contains) ?? false
    }
}

extension AMQPProperties {
    /// The same properties, with `user_id` set to the publishing connection's
    /// login (the broker refuses any other): what marks an internal message.
    public func stamped(by login: String) -> AMQPProperties {
        var p = self
        p.userID = login
        return p
    }
}
