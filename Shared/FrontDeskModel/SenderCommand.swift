import Foundation

/// A cancel or reroute as the router hands it to the sender (and the sender
/// remembers it): a body the router writes itself from the validated
/// command, never the producer's bytes or properties.
public enum SenderCommand: Sendable, Equatable {
    case cancel(id: String, reason: String)
    case reroute(id: String, route: RoutingTable.Route)

    public static let cancelType = "frontdesk.handoff.cancel.v1"
    public static let rerouteType = "frontdesk.handoff.reroute.v1"

    public var id: String {
        switch self {
        case .cancel(let id, _), .reroute(let id, _): id
        }
    }

    /// The AMQP `type` of its message.
    public var type: String {
        switch self {
        case .cancel: Self.cancelType
        case .reroute: Self.rerouteType
        }
    }

    public init(_ command: CancelCommand) { self = .cancel(id: command.id, reason: command.reason) }
    public init(_ command: RerouteCommand) { self = .reroute(id: command.id, route: command.route) }

    public func jsonData() -> Data {
        switch self {
        case .cancel(let id, let reason):
            JSONWriter.object { json in
                json.field("id", id)
                json.field("reason", reason)
            }
        case .reroute(let id, let route):
            JSONWriter.object { json in
                json.field("id", id)
                json.field("project", route.project)
                json.field("target", route.target)
            }
        }
    }

    /// Reads a command message by its `type` and body; nil for anything else.
    public init?(type: String?, body: Data) {
        guard let json = try? JSONFields(body), let id = try? json.string("id"), Identifiers.isValidDispatchID(id) else { return nil }
        switch type {
        case Self.cancelType:
            self = .cancel(id: id, reason: ((try? json.optionalString("reason")) ?? nil) ?? "user")
        case Self.rerouteType:
            guard let project = try? json.string("project"), let target = try? json.string("target") else { return nil }
            self = .reroute(id: id, route: .init(project: project, target: target))
        default:
            return nil
        }
    }
}
