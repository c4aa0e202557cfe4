import Foundation

/// The states of a dispatch, and the 3-step indicator they light.
public enum DispatchState: String, Sendable, Codable, CaseIterable {
    case drafted, routing, sending, queued, replied, failed, cancelled

    public var isTerminal: Bool { self == .replied || self == .failed || self == .cancelled }

    /// drafted 0, routing 1, sending 2, replied 3; the others keep the step reached.
    public var step: Int? {
        switch self {
        case .drafted: 0
        case .routing: 1
        case .sending: 2
        case .replied: 3
        case .queued, .failed, .cancelled: nil
        }
    }
}

/// A status event on `frontdesk.status` (CONTRACT.md, Status event).
/// Optional fields are left out when nil.
public struct StatusEvent: Sendable, Codable, Equatable {
    public struct Project: Sendable, Codable, Equatable {
        public var id: String, name: String, glyph: String
        public var accent: String?
        public init(id: String, name: String, glyph: String, accent: String? = nil) {
            self.id = id
            self.name = name
            self.glyph = glyph
            self.accent = accent
        }
    }

    public struct Target: Sendable, Codable, Equatable {
        public var id: String, name: String
        public init(id: String, name: String) {
            self.id = id
            self.name = name
        }
    }

    public struct Route: Sendable, Codable, Equatable {
        public struct Alternative: Sendable, Codable, Equatable {
            public var project: String, target: String, confidence: Double
            public init(project: String, target: String, confidence: Double) {
                self.project = project
                self.target = target
                self.confidence = confidence
            }
        }
        public var confidence: Double
        public var reason: String
        public var alternatives: [Alternative]

        public init(confidence: Double, reason: String, alternatives: [Alternative]) {
            self.confidence = confidence
            self.reason = reason
            self.alternatives = alternatives
        }
    }

    public struct ErrorInfo: Sendable, Codable, Equatable {
        public var code: String, message: String
    }

    public struct QueueInfo: Sendable, Codable, Equatable {
        public var reason: String
        public var retryAt: String?
    }

    public struct CancelInfo: Sendable, Codable, Equatable {
        public var reason: String
    }

    public var dispatchId: String
    public var seq: Int
    public var state: DispatchState
    public var step: Int
    public var steps = 3
    public var activity: String
    public var input: String?
    public var project: Project?
    public var target: Target?
    public var route: Route?
    public var attempt: Int?
    public var preview: [String]?
    public var etaMs: Int?
    public var queue: QueueInfo?
    public var reply: String?
    public var error: ErrorInfo?
    public var cancel: CancelInfo?
    public var startedAt: String
    public var at: String
    public var elapsedMs: Int
    public var expiresAt: String
    public var threadId: String?
    /// The request's `user` (an extension of the contract's fields): how the
    /// gateway tells whose dispatch it is.
    public var user: String?

    /// `status.<project>.<target>.<state>`, with `_` before the route is known.
    public var routingKey: String {
        "status.\(project?.id ?? "_").\(target?.id ?? "_").\(state.rawValue)"
    }

    /// Unique per event, and the same when the same event is published again.
    public var messageID: String { "\(dispatchId)/\(seq)" }

    public static let type = "frontdesk.status.v1"
}
