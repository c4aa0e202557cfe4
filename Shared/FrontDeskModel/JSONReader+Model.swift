import Foundation

// Readers for the bodies the services read per dispatch, on JSONReader
// instead of JSONDecoder. Each accepts what the synthesized Decodable
// accepts for the same type (the tests decode the same bytes both ways).

extension StatusEvent.Project {
    init(json: JSONFields) throws {
        self.init(
            id: try json.string("id"), name: try json.string("name"), glyph: try json.string("glyph"),
            accent: try json.optionalString("accent"))
    }
}

extension StatusEvent.Target {
    init(json: JSONFields) throws {
        self.init(id: try json.string("id"), name: try json.string("name"))
    }
}

extension StatusEvent.Route {
    init(json: JSONFields) throws {
        let alternatives = try json.array("alternatives").map { value in
            let a = try JSONFields(value)
            return Alternative(project: try a.string("project"), target: try a.string("target"), confidence: try a.double("confidence"))
        }
        self.init(confidence: try json.double("confidence"), reason: try json.string("reason"), alternatives: alternatives)
    }
}

extension StatusEvent.ErrorInfo {
    init(json: JSONFields) throws {
        self.init(code: try json.string("code"), message: try json.string("message"))
    }
}

extension DispatchRecord {
    /// A decision record or hand-off body.
    public init(jsonData: Data) throws { try self.init(json: try JSONFields(jsonData)) }

    init(json: JSONFields) throws {
        guard let outcome = Outcome(rawValue: try json.string("outcome")) else {
            throw JSONReadError(message: "unknown outcome", offset: 0)
        }
        self.init(
            id: try json.string("id"), bodyFingerprint: try json.string("bodyFingerprint"), outcome: outcome,
            input: try json.optionalString("input"), user: try json.optionalString("user"),
            threadId: try json.optionalString("threadId"),
            project: try json.optionalObject("project").map(StatusEvent.Project.init(json:)),
            target: try json.optionalObject("target").map(StatusEvent.Target.init(json:)),
            route: try json.optionalObject("route").map(StatusEvent.Route.init(json:)),
            error: try json.optionalObject("error").map(StatusEvent.ErrorInfo.init(json:)),
            invalid: try json.bool("invalid"), startedAt: try json.string("startedAt"),
            decidedAt: try json.string("decidedAt"), expiresAt: try json.string("expiresAt"),
            lastSeq: try json.int("lastSeq", in: ParkedDispatch.seqRange))
    }
}

extension ParkedDispatch {
    /// Seqs a body may carry: room above for every event a dispatch can have,
    /// so `lastSeq + 1` (and a takeover's margin) never overflows.
    static let seqRange = 0...Int(Int32.max)

    /// A parked or delayed dispatch's body.
    public init(jsonData: Data) throws {
        let json = try JSONFields(jsonData)
        self.init(
            record: try DispatchRecord(json: try json.object("record")),
            project: try StatusEvent.Project(json: try json.object("project")),
            target: try StatusEvent.Target(json: try json.object("target")),
            attempt: try json.int("attempt", in: 1...1_000_000), everDelivered: try json.bool("everDelivered"),
            lastSeq: try json.int("lastSeq", in: Self.seqRange), stepReached: try json.int("stepReached", in: 0...3),
            retryAt: try json.optionalString("retryAt"))
    }
}

extension AgentTask {
    /// A task body of the agent protocol.
    public init(jsonData: Data) throws {
        let json = try JSONFields(jsonData)
        self.init(
            dispatchId: try json.string("dispatchId"), attempt: try json.int("attempt"), input: try json.string("input"),
            project: try StatusEvent.Project(json: try json.object("project")),
            target: try StatusEvent.Target(json: try json.object("target")),
            user: try json.optionalString("user"), threadId: try json.optionalString("threadId"),
            deadline: try json.string("deadline"))
    }
}
