import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

/// The inputs of a term: each goes through the dispatch's machine, and the
/// actions it returns are carried out by `execute`.
extension SenderTerm {
    func handle(_ input: Input) async throws {
        let now = Date()
        switch input {
        case .inbox(let d):
            switch d.properties.type {
            case DispatchRecord.handoffType: try await handOff(d, now: now)
            case "frontdesk.handoff.cancel.v1", "frontdesk.handoff.reroute.v1": try await command(d, now: now)
            default:
                logger.warning("unknown message in the sender inbox", [("type", .string(d.properties.type ?? "none"))])
                try d.ack()
            }
        case .parked(let d, let route):
            try await takeUpParked(d, route: route, now: now)
        case .expired(let d):
            try await expiredWhileParked(d, now: now)
        case .retryDue(let d):
            try await retryDue(d, now: now)
        case .reply(let d):
            switch AgentReply.classify(d.body) {
            case .success(let reply):
                // A reply for a dispatch this term does not hold (finished, or
                // a late copy) is ignored: replies may come more than once.
                if var h = held[reply.dispatchId] {
                    // Jitter matters only for a retry, which only an error reply starts
                    // (a random draw is a getrandom(2) call).
                    let jitter = reply.kind == .error ? Double.random(in: 0..<1) : 0
                    let actions = h.machine.replyReceived(reply, now: now, jitter: jitter)
                    held[reply.dispatchId] = h
                    try await execute(actions, id: reply.dispatchId)
                }
            case .failure(let rejection):
                logger.info("dead-lettered a reply", [("code", .string(rejection.code.rawValue)), ("reason", .string(rejection.reason))])
                metrics.deadLetters.increment(rejection.code.rawValue)
                pendingMessages.append(SharedTopology.deadLetter(d, code: rejection.code, reason: rejection.reason, service: "frontdesk-sender"))
            }
            pendingAcks.append(d)  // after the events (or the dead letter) it caused are confirmed
        case .tick:
            for due in timers.due(at: now) {
                guard var h = held[due.key], h.timerGeneration == due.generation else { continue }
                let actions = h.machine.timerFired(now: now, targetOnline: online(h.machine.route), jitter: Double.random(in: 0..<1))
                held[due.key] = h
                try await execute(actions, id: due.key)
            }
        case .presence(let snapshot):
            try await presenceChanged(snapshot, now: now)
        }
    }

    /// The seq to number above: what the status log shows for the dispatch,
    /// and for a lease handed back by a dead leader a margin above anything
    /// it may have published that the log has not shown yet.
    private func seqFloor(_ d: AMQPDelivery, base: Int, id: String) -> Int {
        let count = Int(d.properties.headers?["x-delivery-count"]?.intValue ?? (d.redelivered ? 1 : 0))
        return max(base, Int(statusLog[id]?.lastSeq ?? 0)) + count * 1000
    }

    /// True when the status log shows the dispatch ended: anything more for it is a late copy.
    private func alreadyEnded(_ id: String) -> Bool { statusLog[id]?.ended == true }

    private func handOff(_ d: AMQPDelivery, now: Date) async throws {
        guard let record = try? DispatchRecord(jsonData: d.body),
            var machine = DispatchMachine(record: record, policy: policy, seqFloor: seqFloor(d, base: 2, id: record.id))
        else {
            logger.warning("unreadable hand-off dropped", [("message_id", .string(d.properties.messageID ?? ""))])
            return try d.ack()
        }
        // A hand-off sent again (by a router that died before its ack): the
        // sender has published for this dispatch already. A redelivered one is
        // a lease to resume, unless the dispatch ended.
        let known = statusLog[record.id]
        let publishedBefore = (known?.lastSeq ?? 0) > 2
        guard held[record.id] == nil, known?.accepted != true, known?.ended != true,
            d.redelivered || !publishedBefore
        else {
            logger.info("duplicate hand-off dropped", [("dispatch_id", .string(record.id))])
            return try d.ack()
        }
        statusLog.markAccepted(record.id)
        metrics.dispatches.increment("received")
        if let reason = pendingCancels[record.id] {
            let actions = machine.cancelRequested(reason: reason, now: now)
            held[record.id] = Held(machine: machine, lease: d)
            return try await execute(actions, id: record.id)
        }
        if let route = pendingReroutes.removeValue(forKey: record.id), let parts = table.eventParts(route) {
            _ = machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
        }
        // First in, first out: while older dispatches wait in the park queue, a new one waits too.
        let route = machine.route
        let deliverNow = online(route) && (presence[route]?.parked ?? 0) == 0
        let actions = machine.received(now: now, targetOnline: deliverNow)
        held[record.id] = Held(machine: machine, lease: d)
        try await execute(actions, id: record.id)
    }

    private func takeUpParked(_ d: AMQPDelivery, route: RoutingTable.Route, now: Date) async throws {
        guard let parked = try? ParkedDispatch(jsonData: d.body),
            var machine = DispatchMachine(parked: parked, policy: policy, seqFloor: seqFloor(d, base: parked.lastSeq, id: parked.record.id))
        else { return try d.ack() }
        let id = parked.record.id
        guard held[id] == nil, !alreadyEnded(id) else { return try d.ack() }  // a second copy
        if let reason = pendingCancels[id] {
            let actions = machine.cancelRequested(reason: reason, now: now)
            held[id] = Held(machine: machine, lease: d)
            return try await execute(actions, id: id)
        }
        guard online(route) else {
            // The agent left again: back to the head of the park queue.
            return try d.nack(requeue: true)
        }
        if let to = pendingReroutes.removeValue(forKey: id), let parts = table.eventParts(to) {
            // Rerouted while parked: take it to the new target instead.
            _ = machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
            let actions = machine.received(now: now, targetOnline: online(to) && (presence[to]?.parked ?? 0) == 0)
            held[id] = Held(machine: machine, lease: d)
            return try await execute(actions, id: id)
        }
        let actions = machine.agentCameOnline(now: now)
        held[id] = Held(machine: machine, lease: d)
        try await execute(actions, id: id)
    }

    private func expiredWhileParked(_ d: AMQPDelivery, now: Date) async throws {
        // TTL can run out a little early; the machine fails it at expiresAt.
        try await takeUpWaiting(d, now: now) { machine in
            machine.timerFired(now: max(now, machine.expiresAtDate), targetOnline: false, jitter: 0)
        }
    }

    /// A retry wait ended in its delay queue: the next attempt, or a wait for an agent.
    private func retryDue(_ d: AMQPDelivery, now: Date) async throws {
        try await takeUpWaiting(d, now: now) { [self] machine in
            let due = min(machine.retryAtDate ?? now, machine.expiresAtDate)
            return machine.timerFired(now: max(now, due), targetOnline: online(machine.route), jitter: 0)
        }
    }

    /// Takes up a dispatch that waited in the broker (dead-lettered back to
    /// this sender): a pending cancel wins, else `due` says what happens.
    private func takeUpWaiting(
        _ d: AMQPDelivery, now: Date, due: (inout DispatchMachine) -> [DispatchMachine.Action]
    ) async throws {
        guard let parked = try? ParkedDispatch(jsonData: d.body),
            var machine = DispatchMachine(parked: parked, policy: policy, seqFloor: seqFloor(d, base: parked.lastSeq, id: parked.record.id))
        else { return try d.ack() }
        let id = parked.record.id
        guard held[id] == nil, !alreadyEnded(id) else { return try d.ack() }  // a second copy
        let actions = pendingCancels[id].map { machine.cancelRequested(reason: $0, now: now) } ?? due(&machine)
        held[id] = Held(machine: machine, lease: d)
        try await execute(actions, id: id)
    }

    /// A cancel or reroute: applied to a held dispatch at once; otherwise
    /// remembered (in the commands stream, for later leaders too).
    private func command(_ d: AMQPDelivery, now: Date) async throws {
        guard let o = (try? JSONSerialization.jsonObject(with: d.body)) as? [String: Any], let id = o["id"] as? String else {
            return try d.ack()
        }
        let isCancel = d.properties.type == "frontdesk.handoff.cancel.v1"
        if isCancel, var h = held[id] {
            let actions = h.machine.cancelRequested(reason: (o["reason"] as? String) ?? "user", now: now)
            held[id] = h
            try await execute(actions, id: id)
            metrics.commands.increment("cancel")
            return pendingAcks.append(d)
        }
        if !isCancel, var h = held[id], let p = o["project"] as? String, let t = o["target"] as? String,
            let parts = table.eventParts(.init(project: p, target: t))
        {
            let route = RoutingTable.Route(project: p, target: t)
            let outcome = h.machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: online(route))
            held[id] = h
            if case .moved(let actions) = outcome { try await execute(actions, id: id) }
            return pendingAcks.append(d)
        }
        // Not held: if it waits in the park queue of a target without agents,
        // act on it now; else remember it for when the dispatch shows up.
        if let found = try await findParked(id) {
            let (lease, parked, channel) = found
            defer { Task { await channel.close() } }
            if var machine = DispatchMachine(parked: parked, policy: policy, seqFloor: seqFloor(lease, base: parked.lastSeq, id: id)) {
                var actions: [DispatchMachine.Action] = []
                if isCancel {
                    actions = machine.cancelRequested(reason: (o["reason"] as? String) ?? "user", now: now)
                    metrics.commands.increment("cancel")
                } else if let p = o["project"] as? String, let t = o["target"] as? String,
                    let parts = table.eventParts(.init(project: p, target: t)),
                    case .moved(let moved) = machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
                {
                    // Parked anew at the new target; presence takes it from there.
                    actions = moved
                    metrics.commands.increment("reroute")
                }
                if !actions.isEmpty {
                    held[id] = Held(machine: machine, lease: lease)
                    try await execute(actions, id: id)
                    // The lease lives on the scan channel: settle it before that closes.
                    try await flush()
                    try await settler.settled()
                    if !isCancel { return try d.ack() }
                } else {
                    try lease.nack(requeue: true)
                }
            }
        }
        try await remember(d)
        var properties = d.properties
        properties.correlationID = id
        try await publisher.publish(OutboundMessage(exchange: "", routingKey: SenderTopology.commands, body: d.body, properties: properties))
        try d.ack()
    }

    func remember(_ d: AMQPDelivery) async throws {
        guard let o = (try? JSONSerialization.jsonObject(with: d.body)) as? [String: Any], let id = o["id"] as? String else { return }
        if d.properties.type == "frontdesk.handoff.cancel.v1" {
            pendingCancels[id] = (o["reason"] as? String) ?? "user"
        } else if let p = o["project"] as? String, let t = o["target"] as? String {
            pendingReroutes[id] = .init(project: p, target: t)
        }
    }
}
