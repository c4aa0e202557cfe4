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
            case SenderCommand.cancelType, SenderCommand.rerouteType: try await command(d, now: now)
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
            switch AgentReply.classify(type: d.properties.type, body: d.body) {
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
        // Clamped: a header value, however large, must not overflow the seq.
        let count = min(max(Int(d.properties.headers?["x-delivery-count"]?.intValue ?? (d.redelivered ? 1 : 0)), 0), 1000)
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
            metrics.dispatches.increment("duplicate")
            return try d.ack()
        }
        statusLog.markAccepted(record.id)
        metrics.dispatches.increment("received")
        if let reason = pendingCommands.cancelReason(record.id) {
            let actions = machine.cancelRequested(reason: reason, now: now)
            held[record.id] = Held(machine: machine, lease: d)
            return try await execute(actions, id: record.id)
        }
        if let route = pendingCommands.takeReroute(record.id), let parts = table.eventParts(route) {
            _ = machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
        }
        // First in, first out: while older dispatches wait in the park queue, a new one waits too.
        // First in, first out: while older dispatches wait in the park queue, a
        // new one waits too; and past its share of the inbox window, a target's
        // new dispatches wait in its park queue (its own window), not here.
        let route = machine.route
        let deliverNow = online(route) && (presence[route]?.parked ?? 0) == 0 && hasRoom(route, in: .inbox)
        let actions = machine.received(now: now, targetOnline: deliverNow)
        held[record.id] = Held(machine: machine, lease: d)
        try await execute(actions, id: record.id, window: .inbox)
    }

    private func takeUpParked(_ d: AMQPDelivery, route: RoutingTable.Route, now: Date) async throws {
        guard let parked = try? ParkedDispatch(jsonData: d.body),
            var machine = DispatchMachine(parked: parked, policy: policy, seqFloor: seqFloor(d, base: parked.lastSeq, id: parked.record.id))
        else { return try d.ack() }
        let id = parked.record.id
        guard held[id] == nil, !alreadyEnded(id), !statusLog.superseded(id, copySeq: parked.lastSeq) else {
            return try d.ack()  // a second copy, or one superseded by a reroute or a newer wait
        }
        if let reason = pendingCommands.cancelReason(id) {
            let actions = machine.cancelRequested(reason: reason, now: now)
            held[id] = Held(machine: machine, lease: d)
            return try await execute(actions, id: id)
        }
        guard online(route) else {
            // The agent left again: back to the head of the park queue.
            return try d.nack(requeue: true)
        }
        // Events published after this copy mean it was taken up and delivered
        // (by a leader that died with it in flight): a reroute then changes nothing.
        let deliveredSince = Int(statusLog[id]?.lastSeq ?? 0) > parked.lastSeq
        if let to = pendingCommands.takeReroute(id), !deliveredSince, let parts = table.eventParts(to) {
            // Rerouted while parked: take it to the new target instead.
            _ = machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
            let actions = machine.received(now: now, targetOnline: online(to) && (presence[to]?.parked ?? 0) == 0)
            held[id] = Held(machine: machine, lease: d)
            return try await execute(actions, id: id, window: .park)
        }
        let actions = machine.agentCameOnline(now: now)
        held[id] = Held(machine: machine, lease: d)
        try await execute(actions, id: id, window: .park)
    }

    private func expiredWhileParked(_ d: AMQPDelivery, now: Date) async throws {
        // TTL can run out a little early; the machine fails it at expiresAt.
        try await takeUpWaiting(d, now: now) { machine in
            machine.timerFired(now: max(now, machine.expiresAtDate), targetOnline: false, jitter: 0)
        }
    }

    /// A retry wait ended in its delay queue: the next attempt, or a wait for an agent.
    private func retryDue(_ d: AMQPDelivery, now: Date) async throws {
        try await takeUpWaiting(d, now: now, window: .retry) { [self] machine in
            let due = min(machine.retryAtDate ?? now, machine.expiresAtDate)
            let deliver = online(machine.route) && hasRoom(machine.route, in: .retry)
            return machine.timerFired(now: max(now, due), targetOnline: deliver, jitter: 0)
        }
    }

    /// Takes up a dispatch that waited in the broker (dead-lettered back to
    /// this sender): a pending cancel wins, else `due` says what happens.
    private func takeUpWaiting(
        _ d: AMQPDelivery, now: Date, window: LeaseWindow = .none, due: (inout DispatchMachine) -> [DispatchMachine.Action]
    ) async throws {
        guard let parked = try? ParkedDispatch(jsonData: d.body),
            var machine = DispatchMachine(parked: parked, policy: policy, seqFloor: seqFloor(d, base: parked.lastSeq, id: parked.record.id))
        else { return try d.ack() }
        let id = parked.record.id
        guard held[id] == nil, !alreadyEnded(id), !statusLog.superseded(id, copySeq: parked.lastSeq) else {
            return try d.ack()  // a second copy, or one superseded
        }
        let actions = pendingCommands.cancelReason(id).map { machine.cancelRequested(reason: $0, now: now) } ?? due(&machine)
        held[id] = Held(machine: machine, lease: d)
        try await execute(actions, id: id, window: window)
    }

    /// A cancel or reroute, applied at once wherever the dispatch is: held
    /// (in flight), or waiting in a park or delay queue (from the copy the
    /// log keeps: its message there is dropped when it surfaces, under any
    /// leader). For a dispatch not seen yet it is remembered, here and in
    /// the commands stream for later leaders. No scan, no round trip: the
    /// command is acked once what it caused is confirmed.
    private func command(_ d: AMQPDelivery, now: Date) async throws {
        guard let command = SenderCommand(type: d.properties.type, body: d.body) else {
            logger.warning("unreadable command dropped", [("message_id", .string(d.properties.messageID ?? ""))])
            return try d.ack()
        }
        let id = command.id
        defer { pendingAcks.append(d) }
        if alreadyEnded(id) { return }
        // The record is used only while nothing was published since it was
        // written: a dispatch taken up since (by a leader that died with it
        // in flight) is acted on when its copy comes back.
        if held[id] == nil, let copy = statusLog.waiting(id), Int(statusLog[id]?.lastSeq ?? 0) <= copy.lastSeq,
            let machine = DispatchMachine(parked: copy, policy: policy, seqFloor: copy.lastSeq)
        {
            // Held from here on without a lease of its own: the copy in the
            // broker is settled when it surfaces.
            held[id] = Held(machine: machine, lease: nil)
        }
        guard var h = held[id] else { return remember(command, persist: true) }
        var actions: [DispatchMachine.Action] = []
        switch command {
        case .cancel(_, let reason):
            actions = h.machine.cancelRequested(reason: reason, now: now)
            metrics.commands.increment("cancel")
        case .reroute(_, let route):
            // Parked at the new target even when it is online: its park
            // consumer takes it at once, and no task leaves before the new
            // copy is in the broker.
            if let parts = table.eventParts(route),
                case .moved(let moved) = h.machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
            {
                actions = moved
                metrics.commands.increment("reroute")
            }
        }
        held[id] = h
        if actions.isEmpty, h.lease == nil { return held[id] = nil }
        try await execute(actions, id: id)
    }

    /// Keeps a command for a dispatch not seen yet; `persist` also appends
    /// it to the commands stream (confirmed with the batch), for later leaders.
    func remember(_ command: SenderCommand, persist: Bool) {
        // At the cap, old commands are pruned at most once a minute: a flood
        // of commands for unknown ids must not make each one cost a full pass.
        if pendingCommands.count >= Self.maxPendingCommands, Date().timeIntervalSince(lastCommandsPrune) > 60 {
            lastCommandsPrune = Date()
            pendingCommands.prune(olderThan: policy.lifetimeSeconds, now: lastCommandsPrune)
        }
        guard pendingCommands.count < Self.maxPendingCommands else {
            metrics.commands.increment("dropped")
            return logger.warning("too many commands for unknown dispatches; one dropped", [("dispatch_id", .string(command.id))])
        }
        pendingCommands.add(command, at: Date())
        guard persist else { return }
        metrics.commands.increment("remembered")
        pendingMessages.append(OutboundMessage(
            exchange: "", routingKey: SenderTopology.commands, body: command.jsonData(),
            properties: .persistentJSON(messageID: "\(command.id)/\(command.type)", correlationID: command.id, type: command.type)))
    }
}
