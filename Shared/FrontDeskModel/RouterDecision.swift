import Foundation

/// What the router decides for a request id: pure, given the time.
public enum RouterDecision {
    /// Routes a valid request: a routed record, or a failed one
    /// (unknown_target, no_route, expired).
    public static func decide(
        _ request: DispatchRequest, body: Data, resolver: RouteResolver, now: Date, lifetimeSeconds: Int
    ) -> DispatchRecord {
        // A phone's clock may run ahead: a createdAt later than intake counts
        // as intake time, so no dispatch outlives intake + lifetime.
        let started = min(request.createdAt ?? now, now)
        let expires = started.addingTimeInterval(TimeInterval(lifetimeSeconds))
        var record = DispatchRecord(
            id: request.id, bodyFingerprint: DispatchRecord.fingerprint(body), outcome: .routed,
            input: request.input, user: request.user, threadId: request.threadId, invalid: false,
            startedAt: RFC3339.format(started), decidedAt: RFC3339.format(now), expiresAt: RFC3339.format(expires), lastSeq: 2)
        if expires <= now {
            record.outcome = .failed
            record.error = .init(code: "expired", message: "the request was created more than \(lifetimeSeconds) s ago")
            return record
        }
        switch resolver.resolve(input: request.input, projectHint: request.project, targetHint: request.target) {
        case .success(let resolution):
            guard let parts = resolver.table.eventParts(resolution.route) else {
                record.outcome = .failed
                record.error = .init(code: "no_route", message: "the resolved route is not in the table")
                return record
            }
            record.project = parts.project
            record.target = parts.target
            record.route = .init(
                confidence: resolution.confidence, reason: resolution.reason,
                alternatives: resolution.alternatives.map {
                    .init(project: $0.route.project, target: $0.route.target, confidence: $0.confidence)
                })
        case .failure(let failure):
            record.outcome = .failed
            record.error = .init(code: failure.code, message: failure.message)
        }
        return record
    }

    /// The record of an invalid request whose id could be read: one failed event.
    public static func invalid(id: String, input: String?, reason: String, body: Data, now: Date, lifetimeSeconds: Int) -> DispatchRecord {
        DispatchRecord(
            id: id, bodyFingerprint: DispatchRecord.fingerprint(body), outcome: .failed, input: input,
            error: .init(code: DeadLetterCode.invalidRequest.rawValue, message: reason), invalid: true,
            startedAt: RFC3339.format(now), decidedAt: RFC3339.format(now),
            expiresAt: RFC3339.format(now.addingTimeInterval(TimeInterval(lifetimeSeconds))), lastSeq: 1)
    }
}
