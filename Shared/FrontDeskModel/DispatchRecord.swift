import Foundation

/// The router's decision about one request id, written to the router's
/// decision log before anything else happens, so that any replica can finish
/// (or recognise) the same dispatch with the same events. It is also the
/// body of the hand-off to the sender.
public struct DispatchRecord: Sendable, Codable, Equatable {
    public enum Outcome: String, Sendable, Codable {
        /// Routed: drafted (seq 1), routing (seq 2), then the sender's.
        case routed
        /// Failed at the router: drafted (seq 1) then failed (seq 2), or only
        /// failed (seq 1) for an invalid request.
        case failed
    }

    public var id: String
    /// A fingerprint of the request body, to tell a redelivery of the
    /// same message from a different request that reuses the id.
    public var bodyFingerprint: String
    public var outcome: Outcome
    public var input: String?
    public var user: String?
    public var threadId: String?
    public var project: StatusEvent.Project?
    public var target: StatusEvent.Target?
    public var route: StatusEvent.Route?
    public var error: StatusEvent.ErrorInfo?
    /// True when the request was invalid: one failed event only, seq 1.
    public var invalid: Bool
    public var startedAt: String
    public var decidedAt: String
    public var expiresAt: String
    /// The last seq the router used; the sender continues above it.
    public var lastSeq: Int

    public init(
        id: String, bodyFingerprint: String, outcome: Outcome, input: String? = nil, user: String? = nil,
        threadId: String? = nil, project: StatusEvent.Project? = nil, target: StatusEvent.Target? = nil,
        route: StatusEvent.Route? = nil, error: StatusEvent.ErrorInfo? = nil, invalid: Bool,
        startedAt: String, decidedAt: String, expiresAt: String, lastSeq: Int
    ) {
        self.id = id
        self.bodyFingerprint = bodyFingerprint
        self.outcome = outcome
        self.input = input
        self.user = user
        self.threadId = threadId
        self.project = project
        self.target = target
        self.route = route
        self.error = error
        self.invalid = invalid
        self.startedAt = startedAt
        self.decidedAt = decidedAt
        self.expiresAt = expiresAt
        self.lastSeq = lastSeq
    }

    /// The router's events for this record, in order.
    public func events() -> [StatusEvent] {
        let started = RFC3339.parse(startedAt) ?? Date()
        let decided = RFC3339.parse(decidedAt) ?? started
        let elapsed = max(0, Int((decided.timeIntervalSince(started) * 1000).rounded()))
        func event(_ seq: Int, _ state: DispatchState, _ step: Int, _ activity: String) -> StatusEvent {
            StatusEvent(
                dispatchId: id, seq: seq, state: state, step: step, activity: activity, input: input,
                startedAt: startedAt, at: decidedAt, elapsedMs: elapsed, expiresAt: expiresAt, threadId: threadId, user: user)
        }
        if invalid {
            var failed = event(1, .failed, 0, "Failed — invalid request")
            failed.error = error
            return [failed]
        }
        let drafted = event(1, .drafted, 0, "Drafted")
        switch outcome {
        case .routed:
            var routing = event(2, .routing, 1, "Routing")
            routing.project = project
            routing.target = target
            routing.route = route
            return [drafted, routing]
        case .failed:
            var failed = event(2, .failed, 0, "Failed — \(error?.code.replacingOccurrences(of: "_", with: " ") ?? "error")")
            failed.error = error
            return [drafted, failed]
        }
    }

    public static let handoffType = "frontdesk.handoff.dispatch.v1"

    /// A stable 64-bit FNV-1a fingerprint of a body, as hex.
    public static func fingerprint(_ body: Data) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in body {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return String(hash, radix: 16)
    }
}
