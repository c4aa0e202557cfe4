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
            guard d.exchange == SharedTopology.handOffExchange || handOffWriters.wrote(d) else { return try rejectForged(d, SenderTopology.inbox(partition), handOffWriters) }
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
            // Another partition's (delayed before the partition count changed): passed on.
            if partitions.count > 1, let copy = try? ParkedDispatch(jsonData: d.body), !owns(copy.route) {
                return passOn(d, to: SenderTopology.retry(partitions.partition(of: copy.route)), id: copy.record.id, type: ParkedDispatch.type)
            }
            try await surfaced(d, .retryDue, window: .retry, now: now)
        case .reply(let d):
            // Another partition's replies were passed on by partition 0's leader.
            if partition != 0, !copyWriters.wrote(d) { return try rejectForged(d, SenderTopology.replies(partition), copyWriters) }
            switch AgentReply.classify(type: d.properties.type, body: d.body) {
            case .success(let reply)
            where passesOn && held[reply.dispatchId] == nil && !(copyWriters.wrote(d) && d.properties.headers?[Self.hopsHeader] != nil):
                // (One passed back here by another partition is not passed on again: ignored below.)
                return placeReply(d, reply.dispatchId, now: now)
            case .success(let reply)
            where partition != 0 && held[reply.dispatchId] == nil && d.properties.headers?[Self.hopsHeader] == nil:
                // Passed on by partition 0 from a log a moment behind (the
                // dispatch moved on, here or from here): once more, to the
                // partition this replica's log names.
                if let k = statusLog.partition(of: reply.dispatchId), k != partition {
                    pendingMessages.append(passedOn(
                        d, to: SenderTopology.replies(k), id: reply.dispatchId, type: Self.passedOnReplyType, headers: [Self.hopsHeader: .int64(1)]))
                }
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
                if rejection.code == .tooLarge { try await replyOverLimit(d, now: now) }
            }
            pendingAcks.append(d)  // after the events (or the dead letter) it caused are confirmed
        case .tick:
            recentParks.forgetOld(now: .now)
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
        case .markerRead(let marker, let read):
            placeHeldReplies(now: now, markerRead: (marker, read))
        case .sendingSeen(let id):
            if heldReplies[id] != nil { placeHeldReplies(now: now) }
        case .taskRefused(let id, let attempt, let reason):
            guard var h = held[id] else { return }
            logger.warning("an agent queue refused a task", [("dispatch_id", .string(id)), ("attempt", .int(attempt)), ("reason", .string(reason))])
            let actions = h.machine.taskRefused(attempt: attempt, reason: reason, now: now, jitter: Double.random(in: 0..<1))
            held[id] = h
            try await execute(actions, id: id)
        }
    }

    /// A message in an internal queue that neither service wrote (no
    /// `user_id`, or another login's, and for an inbox not through
    /// `frontdesk.sender.handoff`): someone published it there through the
    /// default exchange. Nothing acts on it; it is dead-lettered with the reason (so a
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
        { [self] route in
            TargetView(
                online: online(route), parked: Int(presence[route]?.parked ?? 0) + recentParks.count(route),
                hasRoom: hasRoom(route, in: window))
        }
    }

    private func handOff(_ d: AMQPDelivery, now: Date) async throws {
        guard let record = try? DispatchRecord(jsonData: d.body) else {
            logger.warning("unreadable hand-off dropped", [("message_id", .string(d.properties.messageID ?? ""))])
            return try d.ack()
        }
        // Another partition's (sent by a router with another partition count,
        // or before the count changed): passed on to its inbox.
        if partitions.count > 1, let project = record.project?.id, let target = record.target?.id {
            let route = RoutingTable.Route(project: project, target: target)
            if !owns(route) {
                return passOn(d, to: SenderTopology.inbox(partitions.partition(of: route)), id: record.id, type: DispatchRecord.handoffType)
            }
        }
        let outcome = SenderDecisions.handOff(
            record, redelivered: d.redelivered, deliveryCount: deliveryCount(d), known: statusLog.knowledge(record.id, term: term),
            held: held[record.id] != nil, pending: &pendingCommands, target: targets(.inbox), parts: table.eventParts,
            policy: policy, now: now, sameRouteIsNoOp: partitions.count > 1, owns: { [self] in owns($0) })
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
        // Out of its queue (surfaced, or expired and perhaps passed on by partition 0).
        recentParks.surfaced(copy.parkKey)
        // With several partitions: events published since this copy, by another
        // partition, mean that partition took the dispatch up (a copy whose
        // waiting record was cut off with its leader's connection): dropped.
        if partitions.count > 1, held[id] == nil, let known = statusLog.knowledge(id, term: term),
            let k = known.partition, k != partition, known.lastSeq > copy.lastSeq
        {
            logger.info("a copy of a dispatch another partition took up dropped", [("dispatch_id", .string(id)), ("partition", .int(k))])
            return try d.ack()
        }
        let outcome = SenderDecisions.surfaced(
            copy, wait, queueRoute: queueRoute, deliveryCount: deliveryCount(d), known: statusLog.knowledge(id, term: term), held: held[id] != nil,
            pending: &pendingCommands, target: targets(window), parts: table.eventParts, policy: policy, now: now,
            sameRouteIsNoOp: partitions.count > 1)
        try await carryOut(outcome, d, id: id, window: window)
    }

    private func carryOut(_ outcome: SenderDecisions.Outcome, _ d: AMQPDelivery, id: String, window: LeaseWindow) async throws {
        switch outcome {
        case .drop(let why):
            if why == .duplicateHandOff {
                logger.info("duplicate hand-off dropped", [("dispatch_id", .string(id))])
                metrics.dispatches.increment("duplicate")
            } else if why == .superseded, window == .inbox {
                // A hand-off spent by a copy at another target (`SenderDecisions.handOff`).
                logger.info("hand-off dropped: a copy at another target holds its dispatch", [("dispatch_id", .string(id))])
                metrics.dispatches.increment("handoff_superseded")
            }
            if why == .duplicateHandOff || why == .ended, let end = statusLog.recentEnd(id) {
                // Its end is in the log, but perhaps not in the surfaces'
                // queues (see `StatusLog.RecentEnd`): published again, the
                // lease acked once that is confirmed. Surfaces drop a repeated seq.
                metrics.dispatches.increment("end_again")
                pendingMessages.append(SharedTopology.statusEvent(
                    routingKey: end.routingKey, body: end.body,
                    properties: .persistentJSON(messageID: "\(id)/\(end.seq)", correlationID: id, type: StatusEvent.type)))
                return pendingAcks.append(d)
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
        // Passed on by another partition (the one that moved the dispatch): see `apply`.
        var passedOn: PassedOn?
        if copyWriters.wrote(d), case .int64(let hops)? = d.properties.headers?[Self.hopsHeader] {
            let seen = d.properties.headers?[Self.seenCopyHeader]?.intValue ?? 0
            passedOn = PassedOn(hops: Int(clamping: hops), seenCopySeq: Int(clamping: seen))
        }
        let settled = try await apply(command, now: now, passedOn: passedOn)
        // Not settled here yet: looked at again each tick for a while (a
        // dispatch moved here by another partition shows in the log a moment
        // after the move). At most `maxRecentCommands`: a flood of commands
        // for unknown ids costs no more each tick.
        if !settled, partitions.count > 1, recentCommands.count < Self.maxRecentCommands {
            recentCommands.append((command, now, passedOn))
        }
    }

    /// The headers on a command one partition passed on to another: how many
    /// times it was passed on, and the seq of the waiting copy the passing
    /// partition saw (a reroute acts only on that copy).
    static let hopsHeader = "x-frontdesk-hops"
    static let seenCopyHeader = "x-frontdesk-seen-copy"
    /// A cancel may follow its dispatch through this many moves; a reroute is passed on once.
    static let maxCancelHops = 4

    struct PassedOn: Sendable {
        var hops: Int
        var seenCopySeq: Int
    }

    /// Carries out a command where the decisions say it acts, and says whether
    /// it is settled here (acted on, passed on, or nothing to do); one not
    /// settled is looked at again (`lookingAgain`). With several partitions,
    /// of those that know the dispatch waits elsewhere only the one that moved
    /// it there (the writer of its current copy) passes the command on: the
    /// new partition may have taken the command before the move.
    @discardableResult
    func apply(_ command: SenderCommand, now: Date, passedOn: PassedOn? = nil, lookingAgain: Bool = false) async throws -> Bool {
        let id = command.id
        let known = statusLog.knowledge(id, term: term)
        if case .reroute = command, let passedOn, held[id] == nil {
            let copySeq = known?.copySeq ?? 0
            if copySeq > passedOn.seenCopySeq { return true }  // moved on since: the reroute was for an older copy
            if copySeq < passedOn.seenCopySeq { return false }  // this log is behind: look again
        }
        let outcome = SenderDecisions.command(
            command, known: known, held: held[id] != nil, policy: policy,
            partition: partition, partitionOf: partitions.partition(of:), sameRouteIsNoOp: partitions.count > 1)
        switch outcome {
        case .ignore: return true
        case .elsewhere(let k):
            let hops = passedOn?.hops ?? 0
            let isCancel = if case .cancel = command { true } else { false }
            if let known, known.copyWriter == partition, isCancel ? hops < Self.maxCancelHops : hops == 0 {
                metrics.commands.increment("passed_on")
                pendingMessages.append(OutboundMessage(
                    exchange: "", routingKey: SenderTopology.inbox(k), body: command.jsonData(),
                    properties: .persistentJSON(messageID: "\(id)/\(command.type)", correlationID: id, type: command.type)
                        .with(headers: [Self.hopsHeader: .int64(Int64(hops + 1)), Self.seenCopyHeader: .int64(Int64(known.copySeq))])
                        .stamped(by: login),
                    mandatory: true))
                return true
            }
            // A cancel passed on here, with this log behind: look again.
            return !(isCancel && passedOn != nil)
        case .remember:
            if lookingAgain { return false }
            // A passed-on reroute is not kept beyond the look-again: applied
            // later, it could undo a newer reroute.
            if case .reroute = command, passedOn != nil { return false }
            remember(command, persist: true)
            return false
        case .actOnCopy(let machine):
            // Held from here on without a lease of its own.
            held[id] = Held(machine: machine, lease: nil)
        case .applyToHeld: break
        }
        guard var h = held[id] else { return true }
        var actions: [DispatchMachine.Action] = []
        switch command {
        case .cancel(_, let reason):
            actions = h.machine.cancelRequested(reason: reason, now: now)
            metrics.commands.increment("cancel")
        case .reroute(_, let route):
            // Parked at the new target even when it is online: its park
            // consumer takes it at once, and no task leaves before the new
            // copy is in the broker. (A reroute to where it is changes nothing.)
            if !(partitions.count > 1 && route == h.machine.route), let parts = table.eventParts(route),
                case .moved(let moved) = h.machine.rerouteRequested(project: parts.project, target: parts.target, now: now, targetOnline: false)
            {
                actions = moved
                metrics.commands.increment("reroute")
            }
        }
        held[id] = h
        if actions.isEmpty, h.lease == nil {
            held[id] = nil
            return true
        }
        try await execute(actions, id: id)
        return true
    }

    /// Keeps a command for a dispatch not seen yet; `persist` also appends
    /// it to the commands stream (confirmed with the batch), for later leaders.
    func remember(_ command: SenderCommand, at: Date = Date(), persist: Bool) {
        // At the cap, old commands are pruned at most once a minute: a flood
        // of commands for unknown ids must not make each one cost a full pass.
        if pendingCommands.count >= Self.maxPendingCommands, Date().timeIntervalSince(lastCommandsPrune) > 60 {
            lastCommandsPrune = Date()
            // One window here (a flood must not hold the cap longer); a takeover's replay keeps two.
            pendingCommands.prune(olderThan: policy.lifetimeSeconds, now: lastCommandsPrune)
        }
        guard pendingCommands.count < Self.maxPendingCommands else {
            metrics.commands.increment("dropped")
            return logger.warning("too many commands for unknown dispatches; one dropped", [("dispatch_id", .string(command.id))])
        }
        pendingCommands.add(command, at: at, window: policy.lifetimeSeconds)
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
    /// The type of a reply passed on to another partition.
    static let passedOnReplyType = "frontdesk.sender.reply.v1"

    func passOn(_ d: AMQPDelivery, to queue: String, id: String, type: String) {
        pendingMessages.append(passedOn(d, to: queue, id: id, type: type))
        pendingAcks.append(d)
    }

    /// A reply over the size limit (dead-lettered already): for a dispatch held
    /// here its attempt fails now (the reason in the failed event), not at the
    /// reply timeout; held by another partition, that error goes there as a
    /// reply. Read only for a dispatch its correlation_id names and the term or
    /// the log knows: a flood of others costs no parse. Not known yet: it waits
    /// for the timeout.
    private func replyOverLimit(_ d: AMQPDelivery, now: Date) async throws {
        guard let id = d.properties.correlationID else { return }
        let elsewhere = held[id] == nil && passesOn ? statusLog.partition(of: id).flatMap { $0 == partition ? nil : $0 } : nil
        guard held[id] != nil || elsewhere != nil, let error = AgentReply.overLimit(d.body), error.dispatchId == id else { return }
        if let k = elsewhere {
            pendingMessages.append(passedOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType, body: error.jsonData()))
        } else if var h = held[id] {
            let actions = h.machine.replyReceived(error, now: now, jitter: error.retryable ? Double.random(in: 0..<1) : 0)
            held[id] = h
            try await execute(actions, id: id)
        }
    }

    /// A copy of `d` for `queue`: its body (or `body`), with properties of our own.
    func passedOn(_ d: AMQPDelivery, to queue: String, id: String, type: String, headers: FieldTable? = nil, body: Data? = nil) -> OutboundMessage {
        var properties = AMQPProperties.persistentJSON(messageID: "\(id)/passed-on", correlationID: id, type: type)
        properties.headers = headers
        return OutboundMessage(exchange: "", routingKey: queue, body: body ?? d.body, properties: properties.stamped(by: login), mandatory: true)
    }

    /// A reply for a dispatch this term does not hold: to its partition as
    /// the log knows it, else held back (behind any held before it: one
    /// dispatch's replies keep their order) until the log has been read past
    /// a marker published after it came (see `placeHeldReplies`).
    func placeReply(_ d: AMQPDelivery, _ id: String, now: Date) {
        if heldReplies[id] != nil { return heldReplies[id]!.deliveries.append(d) }
        switch statusLog.partition(of: id) {
        case let k? where k != partition:
            passOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType)
        case .some:
            pendingAcks.append(d)  // this partition's, not held: a late or repeated reply, ignored
        case nil where heldReplies.count < Self.maxHeldReplies:
            heldReplies[id] = (now, [d])
        case nil:
            pendingAcks.append(d)  // past the cap: a flood of replies for unknown dispatches is dropped, not held
        }
    }

    /// Held replies whose partition the log knows now go there. The others
    /// wait for a marker: once the log has been read past one published after
    /// a reply came, its dispatch's events (published before its task left,
    /// so before the reply) have been read too, and a dispatch still unknown
    /// is none of the sender's (a late reply past the window, or an agent's
    /// invention): acked and ignored, as with one partition. If the marker
    /// does not come back (the reader stopped or lags by `replyMarkerTimeout`),
    /// they go to every partition instead: the one that holds it acts.
    func placeHeldReplies(now: Date, markerRead: (marker: String, read: Bool)? = nil) {
        var resolvedBefore: Date?
        if let markerRead, let pending = replyMarker, pending.marker == markerRead.marker {
            resolvedBefore = pending.publishedAt
            replyMarker = nil
        }
        for (id, entry) in heldReplies {
            let known = statusLog.partition(of: id)
            let settled = resolvedBefore.map { entry.since < $0 } ?? false
            guard known != nil || settled else { continue }
            heldReplies[id] = nil
            for d in entry.deliveries {
                if let k = known, k != partition {
                    passOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType)
                } else if known != nil || markerRead?.read == true {
                    pendingAcks.append(d)  // this partition's and not held, or no dispatch of ours
                } else {
                    for k in partitions.all where k != partition {
                        pendingMessages.append(passedOn(d, to: SenderTopology.replies(k), id: id, type: Self.passedOnReplyType))
                    }
                    pendingAcks.append(d)
                }
            }
        }
        guard !heldReplies.isEmpty else { return }
        if let pending = replyMarker {
            if now.timeIntervalSince(pending.publishedAt) > Self.replyMarkerTimeout { statusLog.giveUp(marker: pending.marker) }
            return
        }
        // A marker for the replies held so far, published with this batch.
        let marker = "marker-\(UUID().uuidString)"
        statusLog.expect(marker: marker)
        replyMarker = (marker, now)
        pendingMessages.append(OutboundMessage(
            exchange: "", routingKey: SenderTopology.statusLog, body: Data(),
            properties: AMQPProperties(messageID: marker, type: StatusLog.markerType).stamped(by: login),
            repeatable: true))  // a marker read twice is ignored the second time
        // (Not kept: the term's end gives the marker up, which ends the wait.)
        Task { [feed, statusLog] in
            let read = await statusLog.waitFor(marker: marker)
            feed.yield(.markerRead(marker, read))
        }
    }

    /// How long held replies wait for their marker before going to every partition.
    static let replyMarkerTimeout: TimeInterval = 5
    /// At most this many dispatches' replies are held at once.
    static let maxHeldReplies = 500

    /// Commands remembered in the last `recentCommandWindow` (a minute for
    /// one passed on by another partition), decided again: a dispatch another
    /// partition rerouted here shows in the log a moment after that
    /// partition's move, and its cancel must not wait for its copy.
    static let recentCommandWindow: TimeInterval = 10
    static let passedOnCommandWindow: TimeInterval = 60
    static let maxRecentCommands = 1000

    func lookAgainAtRecentCommands(now: Date) async throws {
        let recent = recentCommands.filter {
            now.timeIntervalSince($0.at) < ($0.passedOn != nil ? Self.passedOnCommandWindow : Self.recentCommandWindow)
        }
        recentCommands = []
        for entry in recent where held[entry.command.id] == nil {
            if try await !apply(entry.command, now: now, passedOn: entry.passedOn, lookingAgain: true) {
                recentCommands.append(entry)
            }
        }
    }
}
