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
            guard handOffWriters.wrote(d) else { return try rejectForged(d, SenderTopology.inbox(partition), handOffWriters) }
            switch d.properties.type {
            case DispatchRecord.handoffType: try await handOff(d, now: now)
            case SenderCommand.cancelType, SenderCommand.rerouteType: try await command(d, now: now)
            default:
                logger.warning("unknown message in the sender inbox", [("type", .string(d.properties.type ?? "none"))])
                try d.ack()
            }
        case .parked(let d, let route):
            guard copyWriters.wrote(d) else { return try rejectForged(d, SenderTopology.parkQueue(route), copyWriters) }
            try await surfaced(d, .parked, from: route, window: .park, now: now)
        case .expired(let d):
            guard copyWriters.wrote(d) else { return try rejectForged(d, SenderTopology.expired(partition), copyWriters) }
            if passesOn, let copy = try? ParkedDispatch(jsonData: d.body), !owns(copy.route) {
                return passOn(d, to: SenderTopology.expired(partitions.partition(of: copy.route)), id: copy.record.id, type: ParkedDispatch.type)
            }
            try await surfaced(d, .expired, window: .none, now: now)
        case .retryDue(let d):
            guard copyWriters.wrote(d) else { return try rejectForged(d, SenderTopology.retry(partition), copyWriters) }
            try await surfaced(d, .retryDue, window: .retry, now: now)
        case .reply(let d):
            // Another partition's replies were passed on by partition 0's leader.
            if partition != 0, !copyWriters.wrote(d) { return try rejectForged(d, SenderTopology.replies(partition), copyWriters) }
            switch AgentReply.classify(type: d.properties.type, body: d.body) {
            case .success(let reply) where passesOn && held[reply.dispatchId] == nil:
                return placeReply(d, reply.dispatchId, now: now)
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
            if now.timeIntervalSince(lastExpirySweep) >= 1 {
                lastExpirySweep = now
                try await expireWaiting(now: now)
            }
            if !heldReplies.isEmpty { placeHeldReplies(now: now) }
            if !recentCommands.isEmpty { try await lookAgainAtRecentCommands(now: now) }
        case .presence(let snapshot):
            try await presenceChanged(snapshot, now: now)
        }
    }

    /// A message in an internal queue that neither service wrote (no
    /// `user_id`, or another login's): someone published it there through
    /// the default exchange — or FRONTDESK_ROUTER_USER is not the router's
    /// login. Nothing acts on it; it is dead-lettered with the reason (so a
    /// misconfiguration loses nothing silently), logged and counted.
    private func rejectForged(_ d: AMQPDelivery, _ queue: String, _ trusted: InternalWriters) throws {
        let writer = d.properties.userID.map { "'\($0.prefix(100))'" } ?? "none"
        logger.warning("dead-lettered a message no service wrote", [
            ("queue", .string(queue)), ("user_id", .string(writer)),
            ("message_id", .string(String((d.properties.messageID ?? "").prefix(100)))),
        ])
        metrics.rejected.increment(queue)
        pendingMessages.append(SharedTopology.deadLetter(
            d, code: .invalidRequest,
            reason: "\(queue) takes only messages the services wrote; this one's user_id is \(writer) (trusted: \(trusted.logins.sorted().joined(separator: ", ")))",
            service: "frontdesk-sender"))
        pendingAcks.append(d)  // once the dead letter is confirmed
    }

    /// How often the broker handed this message out before: a lease handed
    /// back by a dead leader numbers its events above a margin.
    private func deliveryCount(_ d: AMQPDelivery) -> Int {
        Int(clamping: d.properties.headers?["x-delivery-count"]?.intValue ?? (d.redelivered ? 1 : 0))
    }

    /// The targets as the decisions see them, for a lease in `window`.
    private func targets(_ window: LeaseWindow) -> (RoutingTable.Route) -> TargetView {
        { [self] route in TargetView(online: online(route), parked: Int(presence[route]?.parked ?? 0), hasRoom: hasRoom(route, in: window)) }
    }

    private func handOff(_ d: AMQPDelivery, now: Date) async throws {
        guard let record = try? DispatchRecord(jsonData: d.body) else {
            logger.warning("unreadable hand-off dropped", [("message_id", .string(d.properties.messageID ?? ""))])
            return try d.ack()
        }
        let outcome = SenderDecisions.handOff(
            record, redelivered: d.redelivered, deliveryCount: deliveryCount(d), known: statusLog.knowledge(record.id, term: term),
            held: held[record.id] != nil, pending: &pendingCommands, target: targets(.inbox), parts: table.eventParts,
            policy: policy, now: now)
        if case .take = outcome {
            statusLog.markAccepted(record.id, term: term)
            metrics.dispatches.increment("received")
        }
        try await carryOut(outcome, d, id: record.id, window: .inbox)
    }

    /// A copy that surfaced from a park, delay or expiry queue.
    private func surfaced(
        _ d: AMQPDelivery, _ wait: SenderDecisions.Wait, from queueRoute: RoutingTable.Route? = nil, window: LeaseWindow, now: Date
    ) async throws {
        guard let copy = try? ParkedDispatch(jsonData: d.body) else { return try d.ack() }
        let id = copy.record.id
        let outcome = SenderDecisions.surfaced(
            copy, wait, queueRoute: queueRoute, deliveryCount: deliveryCount(d), known: statusLog.knowledge(id, term: term), held: held[id] != nil,
            pending: &pendingCommands, target: targets(window), parts: table.eventParts, policy: policy, now: now)
        try await carryOut(outcome, d, id: id, window: window)
    }

    private func carryOut(_ outcome: SenderDecisions.Outcome, _ d: AMQPDelivery, id: String, window: LeaseWindow) async throws {
        switch outcome {
        case .drop(let why):
            if why == .duplicateHandOff {
                logger.info("duplicate hand-off dropped", [("dispatch_id", .string(id))])
                metrics.dispatches.increment("duplicate")
            }
            try d.ack()
        case .requeue:
            try d.nack(requeue: true)
        case .take(let machine, let actions):
            held[id] = Held(machine: machine, lease: d)
            try await execute(actions, id: id, window: window)
        }
    }

    /// Ends, at their expiry, dispatches that wait in a queue (parked, or
    /// waiting for a retry), from the copies the log keeps — as a cancel
    /// does: the copy in the broker is dropped when it surfaces. A park
    /// queue's own TTL fires only at the queue's head, which a copy with a
    /// longer lifetime can hold for hours; the contract allows 5 s.
    private func expireWaiting(now: Date) async throws {
        for id in statusLog.dueWaiting(now: now, limit: 1000, partition: partition) where held[id] == nil {
            guard case .actOnCopy(var machine) = SenderDecisions.expiry(known: statusLog.knowledge(id, term: term), policy: policy, owns: owns)
            else { continue }
            let actions = machine.timerFired(now: max(now, machine.expiresAtDate), targetOnline: false, jitter: 0)
            held[id] = Held(machine: machine, lease: nil)
            metrics.dispatches.increment("expired_waiting")
            try await execute(actions, id: id)
        }
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
        defer { pendingAcks.append(d) }
        try await apply(command, now: now)
    }

    /// Carries out a command where the decisions say it acts; `lookingAgain`:
    /// one remembered a moment ago, not remembered a second time.
    func apply(_ command: SenderCommand, now: Date, lookingAgain: Bool = false) async throws {
        let id = command.id
        switch SenderDecisions.command(command, known: statusLog.knowledge(id, term: term), held: held[id] != nil, policy: policy, owns: owns) {
        case .ignore: return
        case .remember:
            if lookingAgain { return }
            // (At most `maxRecentCommands`: a flood of commands for unknown ids costs no more each tick.)
            if partitions.count > 1, recentCommands.count < Self.maxRecentCommands { recentCommands.append((command, now)) }
            return remember(command, persist: true)
        case .actOnCopy(let machine):
            // Held from here on without a lease of its own.
            held[id] = Held(machine: machine, lease: nil)
        case .applyToHeld: break
        }
        guard var h = held[id] else { return }
        var actions: [DispatchMachine.Action] = []
        switch command {
        case .cancel(_, let reason):
            actions = h.machine.cancelRequested(reason: reason, now: now)
            metrics.commands.increment("cancel")
        case .reroute(_, let route):
            // Parked at the new target even when it is online: its park
            // consumer takes it at once, and no task leaves before the new
            // copy is in the broker. (A reroute to where it is changes nothing.)
            if route != h.machine.route, let parts = table.eventParts(route),
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
            properties: .persistentJSON(messageID: "\(command.id)/\(command.type)", correlationID: command.id, type: command.type)
                .stamped(by: login)))
    }
}

/// With several partitions, partition 0's leader takes every agent reply (the
/// contract has one reply queue) and every expired copy (every park queue
/// dead-letters to one queue), and passes on the other partitions' — with
/// properties of its own, acked once the broker has confirmed the copy.
extension SenderTerm {
    /// How long a reply waits for its dispatch's partition to show in the
    /// log before it goes to every partition (the one holding it acts).
    static let replyPlacementWait: TimeInterval = 0.25
    /// The type of a reply passed on to another partition.
    static let passedOnReplyType = "frontdesk.sender.reply.v1"

    func passOn(_ d: AMQPDelivery, to queue: String, id: String, type: String) {
        pendingMessages.append(passedOn(d, to: queue, id: id, type: type))
        pendingAcks.append(d)
    }

    /// A copy of `d` for `queue`: its body, with properties of our own.
    func passedOn(_ d: AMQPDelivery, to queue: String, id: String, type: String) -> OutboundMessage {
        OutboundMessage(
            exchange: "", routingKey: queue, body: d.body,
            properties: .persistentJSON(messageID: "\(id)/passed-on", correlationID: id, type: type).stamped(by: login),
            mandatory: true)
    }

    /// A reply for a dispatch this term does not hold: to its partition as
    /// the log knows it, else held back a moment (behind any held before it:
    /// one dispatch's replies keep their order).
    func placeReply(_ d: AMQPDelivery, _ id: String, now: Date) {
        if heldReplies[id] != nil { return heldReplies[id]!.deliveries.append(d) }
        switch statusLog.partition(of: id) {
        case let k? where k != partition:
            passOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType)
        case .some:
            pendingAcks.append(d)  // this partition's, not held: a late or repeated reply, ignored
        case nil:
            heldReplies[id] = (now, [d])
        }
    }

    /// Held replies whose partition is known now go there; those held for
    /// `replyPlacementWait` go to every other partition (and are ignored here).
    func placeHeldReplies(now: Date) {
        for (id, entry) in heldReplies {
            let known = statusLog.partition(of: id)
            guard known != nil || now.timeIntervalSince(entry.since) >= Self.replyPlacementWait else { continue }
            heldReplies[id] = nil
            for d in entry.deliveries {
                if let k = known, k == partition {
                    pendingAcks.append(d)
                } else if let k = known {
                    passOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType)
                } else {
                    for k in partitions.all where k != partition {
                        pendingMessages.append(passedOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType))
                    }
                    pendingAcks.append(d)
                }
            }
        }
    }

    /// Commands remembered in the last `recentCommandWindow`, decided again:
    /// a dispatch another partition rerouted here shows in the log a moment
    /// after that partition's move, and its cancel must not wait for its copy.
    static let recentCommandWindow: TimeInterval = 10
    static let maxRecentCommands = 1000

    func lookAgainAtRecentCommands(now: Date) async throws {
        let recent = recentCommands.filter { now.timeIntervalSince($0.at) < Self.recentCommandWindow }
        recentCommands = []
        for (command, at) in recent where held[command.id] == nil {
            let known = statusLog.knowledge(command.id, term: term)
            switch SenderDecisions.command(command, known: known, held: false, policy: policy, owns: owns) {
            case .remember: recentCommands.append((command, at))  // still nothing known here
            case .ignore: continue  // ended, or it waits in another partition
            case .actOnCopy, .applyToHeld: try await apply(command, now: now, lookingAgain: true)
            }
        }
    }
}
