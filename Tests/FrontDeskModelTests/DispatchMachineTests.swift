import Foundation
@testable import FrontDeskModel
import Testing

/// A manual clock: seconds after the dispatch started.
func at(_ seconds: Double) -> Date { Date(timeIntervalSince1970: 1_778_665_260 + seconds) }

func routedRecord(lifetime: Double = 14_400) -> DispatchRecord {
    DispatchRecord(
        id: "d-1", bodyFingerprint: "f", outcome: .routed, input: "Reply to Lisa about the AGM agenda — short, confirm 14:00",
        user: "u-42", threadId: "t-9",
        project: .init(id: "yemaya", name: "Yemaya", glyph: "YE", accent: "#6E56CF"), target: .init(id: "board-prep", name: "Board Prep"),
        route: .init(confidence: 0.82, reason: "keywords: agm, agenda; contact: Lisa", alternatives: []), invalid: false,
        startedAt: RFC3339.format(at(0)), decidedAt: RFC3339.format(at(0.01)), expiresAt: RFC3339.format(at(lifetime)), lastSeq: 2)
}

extension DispatchMachine.Action {
    var isPark: Bool { if case .park = self { true } else { false } }
    var isFinish: Bool { if case .finish = self { true } else { false } }
    /// The attempt of a task delivered, if this is one.
    var deliveredAttempt: Int? { if case .deliver(let task) = self { task.attempt } else { nil } }
}

extension [DispatchMachine.Action] {
    var events: [StatusEvent] { compactMap { if case .publish(let e) = $0 { e } else { nil } } }
    var states: [DispatchState] { events.map(\.state) }
    var timer: Date?? { for a in self.reversed() { if case .setTimer(let d) = a { return d } }; return nil }
}

func reply(_ kind: AgentReply.Kind, attempt: Int = 1, text: String? = nil, activity: String? = nil, eta: Int? = nil, retryable: Bool = false) -> AgentReply {
    AgentReply(dispatchId: "d-1", attempt: attempt, kind: kind, text: text, activity: activity, etaMs: eta,
               error: kind == .error ? .init(code: "busy", message: "agent busy") : nil, retryable: retryable)
}

@Suite("Dispatch state machine")
struct DispatchMachineTests {
    let policy = RetryPolicy(baseMs: 1000, maxMs: 60_000, maxAttempts: 3, replyTimeoutSeconds: 600)

    func machine(lifetime: Double = 14_400) -> DispatchMachine {
        DispatchMachine(record: routedRecord(lifetime: lifetime), policy: policy)!
    }

    @Test func offlineTargetQueuesThenDeliversWhenAnAgentComes() {
        var m = machine()
        let queued = m.received(now: at(1), targetOnline: false)
        #expect(queued.first?.isPark == true)
        let q = queued.events[0]
        #expect(q.state == .queued && q.seq == 3 && q.step == 1 && q.attempt == 1)
        #expect(q.queue == .init(reason: "agent_offline") && q.etaMs == nil && q.preview == nil)
        #expect(q.activity == "Queued — will dispatch on reconnect")
        #expect(q.project?.id == "yemaya" && q.input == routedRecord().input && q.routingKey == "status.yemaya.board-prep.queued")
        let sent = m.agentCameOnline(now: at(30))
        #expect(sent.first?.deliveredAttempt == 1)
        #expect(sent.states == [.sending])
        #expect(sent.events[0].seq == 4 && sent.events[0].step == 2 && sent.events[0].elapsedMs == 30_000)
        #expect(sent.timer == .some(at(630)))  // the reply timeout
    }

    @Test func repliesStreamIntoSendingThenReplied() {
        var m = machine()
        #expect(m.received(now: at(1), targetOnline: true).first?.deliveredAttempt == 1)
        let progress = m.replyReceived(reply(.progress, text: "Hi Lisa, confirmed for 14:00 on Thursday.\n\nThe agenda", activity: "Drafting reply", eta: 2000), now: at(4), jitter: 0)
        let p = progress.events[0]
        #expect(p.state == .sending && p.activity == "Drafting reply" && p.etaMs == 2000)
        #expect(p.preview == ["Hi Lisa, confirmed for 14:00 on Thursday.", "The agenda"])
        let noEta = m.replyReceived(reply(.progress, text: "a\nb\nc\nd"), now: at(5), jitter: 0).events[0]
        #expect(noEta.etaMs == nil && noEta.preview == ["b", "c", "d"] && noEta.activity == "Drafting reply")
        let final = m.replyReceived(reply(.final, text: "Hi Lisa,\nconfirmed."), now: at(6), jitter: 0)
        #expect(final.states == [.replied])
        #expect(final.events[0].reply == "Hi Lisa,\nconfirmed." && final.events[0].step == 3 && final.events[0].etaMs == nil)
        #expect(final.contains { $0.isFinish })
        #expect(m.replyReceived(reply(.progress, text: "late"), now: at(7), jitter: 0).isEmpty)
        #expect(m.cancelRequested(reason: "user", now: at(8)).isEmpty)
    }

    @Test func repliesForAnotherAttemptAreIgnored() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        #expect(m.replyReceived(reply(.final, attempt: 2, text: "x"), now: at(2), jitter: 0).isEmpty)
        _ = m.agentWentOffline(now: at(3))
        #expect(m.attempt == 2)
        #expect(m.replyReceived(reply(.final, attempt: 1, text: "stale"), now: at(4), jitter: 0).isEmpty)
        #expect(m.agentCameOnline(now: at(5)).first?.deliveredAttempt == 2)
        #expect(m.replyReceived(reply(.final, attempt: 2, text: "ok"), now: at(6), jitter: 0).states == [.replied])
    }

    @Test func agentThatDisappearsPutsTheDispatchBackInQueued() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        _ = m.replyReceived(reply(.progress, text: "half", eta: 900), now: at(2), jitter: 0)
        let back = m.agentWentOffline(now: at(3))
        #expect(back.first?.isPark == true)
        #expect(back.events[0].state == .queued && back.events[0].queue?.reason == "agent_offline")
        #expect(back.events[0].attempt == 2 && back.events[0].step == 2 && back.events[0].etaMs == nil && back.events[0].preview == nil)
    }

    @Test(arguments: [(0.0, 500), (0.5, 750), (0.999_999, 999)])
    func retryableErrorWaitsWithJitterThenRetries(_ jitter: Double, _ delayMs: Int) {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        let wait = m.replyReceived(reply(.error, retryable: true), now: at(10), jitter: jitter)
        let q = wait.events[0]
        let retryAt = at(10).addingTimeInterval(Double(delayMs) / 1000)
        #expect(q.state == .queued && q.queue == .init(reason: "retry_wait", retryAt: RFC3339.format(retryAt)))
        #expect(q.attempt == 2)
        #expect(wait.timer == .some(retryAt))
        // Not before retryAt: an early timer only re-arms.
        let early = m.timerFired(now: retryAt.addingTimeInterval(-0.001), targetOnline: true, jitter: 0)
        #expect(early == [.setTimer(retryAt)])
        let retry = m.timerFired(now: retryAt, targetOnline: true, jitter: 0)
        #expect(retry.first?.deliveredAttempt == 2)
        #expect(retry.states == [.sending])
    }

    @Test func retryDueWhileOfflineBecomesAgentOffline() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        _ = m.replyReceived(reply(.error, retryable: true), now: at(2), jitter: 0)
        let later = m.timerFired(now: at(3), targetOnline: false, jitter: 0)
        #expect(later.first?.isPark == true)
        #expect(later.events.map { $0.queue?.reason } == ["agent_offline"])
        #expect(m.agentCameOnline(now: at(9)).first?.deliveredAttempt == 2)
    }

    @Test func retriesRunOutAfterMaxAttempts() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        var now = 1.0
        for attempt in 1...3 {
            now += 1
            let out = m.replyReceived(reply(.error, attempt: attempt, retryable: true), now: at(now), jitter: 0)
            if attempt < 3 {
                #expect(out.states == [.queued])
                now += 10
                #expect(m.timerFired(now: at(now), targetOnline: true, jitter: 0).first?.deliveredAttempt == attempt + 1)
            } else {
                #expect(out.states == [.failed])
                #expect(out.events[0].error?.code == "retries_exhausted")
                #expect(out.contains { $0.isFinish })
            }
        }
    }

    /// A task its agent queue refused (nacked or returned) is a failed
    /// attempt of that dispatch: backoff, the next attempt, and after the
    /// last one `retries_exhausted`; a refusal of an old attempt, or while
    /// not in flight, changes nothing.
    @Test func aRefusedTaskIsAFailedAttempt() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        #expect(m.taskRefused(attempt: 2, reason: "refused", now: at(1.1), jitter: 0).isEmpty)
        let first = m.taskRefused(attempt: 1, reason: "refused", now: at(1.1), jitter: 0)
        #expect(first.states == [.queued])
        #expect(first.events[0].queue?.reason == "retry_wait" && first.events[0].attempt == 2 && first.events[0].etaMs == nil)
        #expect(first.contains { if case .delay = $0 { true } else { false } })
        #expect(m.taskRefused(attempt: 1, reason: "refused", now: at(1.2), jitter: 0).isEmpty)  // waiting: not in flight
        #expect(m.timerFired(now: at(3), targetOnline: true, jitter: 0).first?.deliveredAttempt == 2)
        _ = m.taskRefused(attempt: 2, reason: "refused", now: at(3.1), jitter: 0)
        #expect(m.timerFired(now: at(6), targetOnline: true, jitter: 0).first?.deliveredAttempt == 3)
        let last = m.taskRefused(attempt: 3, reason: "the broker did not take the task", now: at(6.1), jitter: 0)
        #expect(last.states == [.failed] && last.contains { $0.isFinish })
        #expect(last.events[0].error?.code == "retries_exhausted" && last.events[0].attempt == 3)
        #expect(last.events[0].error?.message.hasPrefix("the broker did not take the task") == true)
    }

    @Test func nonRetryableErrorFails() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        let out = m.replyReceived(reply(.error, retryable: false), now: at(2), jitter: 0)
        #expect(out.states == [.failed] && out.events[0].error?.code == "agent_error" && out.events[0].step == 2)
    }

    @Test func replyTimeoutRetries() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: true)
        let out = m.timerFired(now: at(601), targetOnline: true, jitter: 0)
        #expect(out.states == [.queued] && out.events[0].queue?.reason == "retry_wait")
    }

    @Test(arguments: ["parked", "inFlight", "retryWait"])
    func expiresFromEveryWaitingPhase(_ phase: String) {
        var m = machine(lifetime: 100)
        switch phase {
        case "parked": _ = m.received(now: at(1), targetOnline: false)
        case "inFlight": _ = m.received(now: at(1), targetOnline: true)
        default:
            _ = m.received(now: at(1), targetOnline: true)
            _ = m.replyReceived(reply(.error, retryable: true), now: at(99.9), jitter: 0.9)
        }
        let out = m.timerFired(now: at(100), targetOnline: false, jitter: 0)
        #expect(out.states == [.failed] && out.events[0].error?.code == "expired")
        #expect(m.isFinished)
    }

    @Test func arrivingAfterItsLifetimeFailsAtOnce() {
        var m = machine(lifetime: 10)
        #expect(m.received(now: at(11), targetOnline: true).states == [.failed])
    }

    @Test(arguments: [false, true])
    func cancelEndsAnyWaitingDispatch(_ delivered: Bool) {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: delivered)
        let out = m.cancelRequested(reason: "user", now: at(2))
        #expect(out.states == [.cancelled] && out.events[0].cancel == .init(reason: "user"))
        #expect(out.events[0].step == (delivered ? 2 : 1))
        #expect(out.contains(.setTimer(nil)) && out.contains { $0.isFinish })
        #expect(m.agentCameOnline(now: at(3)).isEmpty)
        #expect(m.timerFired(now: at(20_000), targetOnline: true, jitter: 0).isEmpty)
    }

    @Test func rerouteMovesOnlyANeverDeliveredDispatch() {
        var m = machine()
        _ = m.received(now: at(1), targetOnline: false)
        guard case .moved(let out) = m.rerouteRequested(
            project: .init(id: "acme", name: "Acme Corp", glyph: "AC"), target: .init(id: "legal", name: "Legal"), now: at(2), targetOnline: false)
        else {
            Issue.record("refused")
            return
        }
        #expect(out.states == [.queued] && out.events[0].routingKey == "status.acme.legal.queued")
        // The route shown is the one asked for, in this event, the parked copy, and the events after it.
        let rerouted = StatusEvent.Route(confidence: 1, reason: "rerouted to Acme Corp / Legal", alternatives: [])
        #expect(out.events[0].route == rerouted && m.parked.record.route == rerouted)
        var taken = DispatchMachine(parked: m.parked, policy: policy)
        #expect(taken?.agentCameOnline(now: at(3)).events.first?.route == rerouted)
        #expect(m.agentCameOnline(now: at(3)).first?.deliveredAttempt == 1)
        #expect(m.route.description == "acme/legal")
        // A table may name a target "": the reason names its id then.
        var unnamed = machine()
        _ = unnamed.received(now: at(1), targetOnline: false)
        _ = unnamed.rerouteRequested(project: .init(id: "acme", name: "", glyph: "AC"), target: .init(id: "legal", name: ""), now: at(2), targetOnline: false)
        #expect(unnamed.record.route?.reason == "rerouted to acme / legal")
        #expect(m.rerouteRequested(project: .init(id: "yemaya", name: "Yemaya", glyph: "YE"), target: .init(id: "board-prep", name: "Board Prep"), now: at(4), targetOnline: true) == .refused)
    }

    @Test func anAgentLostOnTheLastAttemptFailsWithThatAttempt() {
        var m = DispatchMachine(record: routedRecord(), policy: policy, seqFloor: 2)!
        _ = m.received(now: at(1), targetOnline: true)
        var last: [DispatchMachine.Action] = []
        for i in 0..<policy.maxAttempts {
            last = m.agentWentOffline(now: at(2 + 2 * Double(i)))
            if last.events.contains(where: { $0.state.isTerminal }) { break }
            _ = m.agentCameOnline(now: at(3 + 2 * Double(i)))
        }
        let failed = last.events.first { $0.state == .failed }
        #expect(failed?.error?.code == "retries_exhausted")
        #expect(failed?.attempt == policy.maxAttempts)
    }

    @Test func seqOnlyGrowsAndExactlyOneTerminal() {
        var m = DispatchMachine(record: routedRecord(), policy: policy, seqFloor: 40)!
        var all: [StatusEvent] = []
        all += m.received(now: at(1), targetOnline: false).events
        all += m.agentCameOnline(now: at(2)).events
        all += m.replyReceived(reply(.accepted), now: at(3), jitter: 0).events
        all += m.agentWentOffline(now: at(4)).events
        all += m.agentCameOnline(now: at(5)).events
        all += m.replyReceived(reply(.error, attempt: 2, retryable: true), now: at(6), jitter: 0.3).events
        all += m.timerFired(now: at(60), targetOnline: true, jitter: 0).events
        all += m.replyReceived(reply(.final, attempt: 3, text: "done"), now: at(61), jitter: 0).events
        all += m.cancelRequested(reason: "late", now: at(62)).events
        #expect(all.first?.seq == 41)
        #expect(zip(all, all.dropFirst()).allSatisfy { $0.seq < $1.seq })
        #expect(all.filter { $0.state.isTerminal }.count == 1)
        #expect(all.last?.state == .replied)
        #expect(Set(all.map(\.messageID)).count == all.count)
    }

    @Test(arguments: [(1, 1000), (2, 2000), (3, 4000), (7, 60_000), (30, 60_000)])
    func retryDelaysDoubleUpToTheCapAndJitterOnlyShortens(_ attempt: Int, _ ceiling: Int) {
        let p = RetryPolicy(baseMs: 1000, maxMs: 60_000)
        #expect(p.delayMs(afterAttempt: attempt, unit: 0.999_999_999_9) == ceiling - 1 || p.delayMs(afterAttempt: attempt, unit: 0.999_999_999_9) == ceiling)
        #expect(p.delayMs(afterAttempt: attempt, unit: 0) == (ceiling + 1) / 2)
    }

    @Test func repliesParse() {
        let r = AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":2,"kind":"error","error":{"code":"busy","message":"m"},"retryable":true}"#.utf8))
        #expect(r == AgentReply(dispatchId: "d-1", attempt: 2, kind: .error, error: .init(code: "busy", message: "m"), retryable: true))
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1,"kind":"progress","text":"a","etaMs":2000}"#.utf8))?.etaMs == 2000)
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d#1","attempt":1,"kind":"final"}"#.utf8)) == nil)
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":0,"kind":"final"}"#.utf8)) == nil)
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1,"kind":"maybe"}"#.utf8)) == nil)
        #expect(AgentReply.parse(Data("nope".utf8)) == nil)
    }

    /// What is not a reply gets a dead-letter code (the sender dead-letters it).
    @Test(arguments: [
        ("nope", "invalid_json"),
        ("[1,2]", "invalid_request"),  // JSON, but no object: as at intake
        ("\"a string\"", "invalid_request"),
        (#"{"attempt":1,"kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":"d#1","attempt":1,"kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":"","attempt":1,"kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":7,"attempt":1,"kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":"d-1","kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":"d-1","attempt":"1","kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":"d-1","attempt":0,"kind":"final"}"#, "invalid_request"),
        (#"{"dispatchId":"d-1","attempt":1}"#, "invalid_request"),
        (#"{"dispatchId":"d-1","attempt":1,"kind":"maybe"}"#, "invalid_request"),
        (#"{"dispatchId":"d-1","attempt":1,"kind":"final","text":"ok"}"#, "reply"),
        (#"{"dispatchId":"d-1","attempt":3,"kind":"accepted","unknown":[1]}"#, "reply"),
    ])
    func repliesThatAreNoneSayWhy(_ body: String, _ expected: String) {
        switch AgentReply.classify(Data(body.utf8)) {
        case .success: #expect(expected == "reply", "\(body) parsed as a reply")
        case .failure(let rejection):
            #expect(rejection.code.rawValue == expected, "\(body)")
            #expect(rejection.reason.count > 10)
        }
    }
}

extension DispatchMachineTests {
    /// The actions are complete: the copy to park or delay, its deadline and
    /// the task carry everything, so the sender reads nothing back from the machine.
    @Test func actionsCarryTheirCopiesTasksAndDeadlines() throws {
        var m = machine(lifetime: 30)
        let queued = m.received(now: at(1), targetOnline: false)
        guard case .park(let copy, let until) = queued.first else { return #expect(Bool(false), "no park") }
        #expect(copy.lastSeq == queued.events.first?.seq && copy == m.parked && until == at(30))
        let sent = m.agentCameOnline(now: at(2))
        guard case .deliver(let task) = sent.first else { return #expect(Bool(false), "no task") }
        #expect(task.attempt == 1 && task.dispatchId == "d-1" && task.target.id == "board-prep" && task.deadline == RFC3339.format(at(30)))
        let wait = m.replyReceived(reply(.error, retryable: true), now: at(3), jitter: 0)
        guard case .delay(let delayed, let wake) = wait.first else { return #expect(Bool(false), "no delay") }
        #expect(delayed.retryAt == wait.events.first?.queue?.retryAt && delayed.attempt == 2 && delayed.lastSeq == wait.events.first?.seq)
        #expect(wake == RFC3339.parse(delayed.retryAt ?? ""))
        #expect(m.cancelRequested(reason: "user", now: at(4)).last == .finish(.cancelled))
    }
}

extension DispatchMachineTests {
    /// Optional fields of the wrong type are ignored, the required ones are
    /// checked by type: a boolean is no attempt, a string no retryable flag.
    @Test func replyFieldsOfTheWrongType() {
        let loose = AgentReply.parse(Data(
            #"{"dispatchId":"d-1","attempt":1,"kind":"error","text":5,"activity":["a"],"etaMs":"9","retryable":"yes","error":{"code":7}}"#.utf8))
        #expect(loose == AgentReply(dispatchId: "d-1", attempt: 1, kind: .error, error: .init(code: "agent_error", message: "")))
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":true,"kind":"final"}"#.utf8)) == nil)
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1e300,"kind":"final"}"#.utf8)) == nil)
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1e400,"kind":"final"}"#.utf8)) == nil)
        // Beyond a double's range: an etaMs is none, an unknown field changes nothing.
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1,"kind":"progress","etaMs":1e400,"debug":-1e999}"#.utf8))
            == AgentReply(dispatchId: "d-1", attempt: 1, kind: .progress))
        // JSON, but no object: invalid_request, as at intake.
        for body in ["[]", "5", "null", #""x""#] {
            guard case .failure(let r) = AgentReply.classify(Data(body.utf8)) else { Issue.record("\(body) read"); continue }
            #expect(r.code == .invalidRequest, "\(body)")
        }
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1.0,"kind":"final","etaMs":2.5}"#.utf8))?.etaMs == nil)
        #expect(AgentReply.parse(Data([0xEF, 0xBB, 0xBF]) + Data(#"{"dispatchId":"d-1","attempt":1,"kind":"final"}"#.utf8))?.kind == .final)
        #expect(AgentReply.parse(Data([0xEF, 0xBB]) + Data(#"{"dispatchId":"d-1","attempt":1,"kind":"final"}"#.utf8)) == nil)
        // Unknown fields are ignored however they nest (to 512 levels); deeper is no JSON read.
        let nested = { (n: Int) in Data((#"{"dispatchId":"d-1","attempt":1,"kind":"final","x":"# + String(repeating: "[", count: n) + "1"
            + String(repeating: "]", count: n) + "}").utf8) }
        #expect(AgentReply.parse(nested(511))?.kind == .final)
        #expect(AgentReply.parse(nested(512)) == nil)
        guard case .failure(let deep) = AgentReply.classify(nested(100_000)) else { return #expect(Bool(false), "100,000 levels read") }
        #expect(deep.code == .invalidJSON && deep.reason.contains("deeper"))
        // Trailing commas are no JSON (RFC 8259).
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1,"kind":"final",}"#.utf8)) == nil)
        // Duplicate keys: the last one counts.
        #expect(AgentReply.parse(Data(#"{"dispatchId":"d-1","attempt":1,"kind":"progress","kind":"final"}"#.utf8))?.kind == .final)
    }
}
