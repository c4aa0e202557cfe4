/// Where an `AMQPClient` stands; services answer /readyz from it.
public enum ConnectionState: Sendable, Equatable, CustomStringConvertible {
    case connecting
    /// Connected, topology declared, consumers running.
    case connected
    /// The connection failed; the next try is on its way.
    case reconnecting(reason: String)
    case closed

    public var isReady: Bool { self == .connected }

    public var description: String {
        switch self {
        case .connecting: "connecting"
        case .connected: "connected"
        case .reconnecting(let reason): "reconnecting (\(reason))"
        case .closed: "closed"
        }
    }
}
