import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

extension SenderTerm {
    // MARK: Actions

    /// Carries out a machine's actions: publishes (confirmed, in order), the
    /// timer, and the lease (acked once the dispatch is parked anew or
    /// finished). The actions say everything: nothing is read back from the
    /// machine.
    func execute(_ actions: [DispatchMachine.Action], id: String, window: LeaseWindow = .none) async throws {
        guard var h = held[id] else { return }
        var messages: [OutboundMessage] = []
        var release = false
        var finished: DispatchState?
        var repliedStartedAt: String?
        var timer: Date?? = nil
        for action in actions {
            switch action {
            case .deliver(let task):
                let route = RoutingTable.Route(project: task.project.id, target: task.target.id)
                messages.append(OutboundMessage(
                    exchange: "", routingKey: SenderTopology.agentQueue(route), body: task.jsonData(),
                    properties: .persistentJSON(messageID: task.messageID, correlationID: id, type: AgentTask.type)
                        .with(replyTo: SenderTopology.replies).stamped(by: login), mandatory: true))
                metrics.deliveries.increment()
                if h.inFlight == nil {
                    h.inFlight = (route, window)
                    countInFlight(route, window, +1)
                }
            case .publish(let event):
                // Surfaces and the status log drop a repeated seq: lost by
                // the stream at a leader change, or refused by a surface's
                // queue, it must not stall the term (the next leader would
                // deliver again).
                messages.append(SharedTopology.statusEvent(
                    routingKey: event.routingKey, body: event.jsonData(),
                    properties: .persistentJSON(messageID: event.messageID, correlationID: id, type: StatusEvent.type)))
                metrics.events.increment(event.state.rawValue)
                if event.state == .queued, event.queue?.reason == "retry_wait" { metrics.retries.increment("retry_wait") }
                if event.state == .replied { repliedStartedAt = event.startedAt }
            case .park(let copy, let until):
                let route = RoutingTable.Route(project: copy.project.id, target: copy.target.id)
                let key = copy.parkKey
                var properties = AMQPProperties.persistentJSON(messageID: key, correlationID: id, type: ParkedDispatch.type)
                    .stamped(by: login)
                properties.expiration = String(SenderTopology.ttlMs(until: until, now: Date()))
                let body = copy.jsonData()
                messages.append(OutboundMessage(
                    exchange: "", routingKey: SenderTopology.parkQueue(route), body: body, properties: properties, mandatory: true))
                messages.append(waitingRecord(copy, body: body))
                recentParks.parked(key, at: route, now: .now)
                release = true
            case .delay(let copy, let until):
                // A retry waits in the broker, not here: in a delay queue whose TTL
                // brings it back to frontdesk.sender.retry when it is due.
                let (queue, ttl) = SenderTopology.delayQueue(ms: SenderTopology.ttlMs(until: until, now: Date()), partition: partition)
                if !delayQueues.contains(queue) {
                    try await SenderTopology.declareDelayQueue(queue, ttlMs: ttl, partition: partition, on: publisher)
                    delayQueues.insert(queue)
                }
                let body = copy.jsonData()
                messages.append(OutboundMessage(
                    exchange: "", routingKey: queue, body: body,
                    properties: .persistentJSON(messageID: "\(id)/retry/\(copy.attempt)", correlationID: id, type: ParkedDispatch.type)
                        .stamped(by: login),
                    mandatory: true))
                messages.append(waitingRecord(copy, body: body))
                release = true
            case .setTimer(let date):
                timer = .some(date)
            case .finish(let state):
                finished = state
                release = true
            }
        }
        pendingMessages += messages
        if release {
            held[id] = nil
            if let f = h.inFlight { countInFlight(f.route, f.window, -1) }
            if let state = finished {
                metrics.dispatches.increment(state.rawValue)
                statusLog.markFinished(id, term: term)
                if let started = repliedStartedAt.flatMap(RFC3339.parse) {
                    metrics.replyTime.observe(Date().timeIntervalSince(started))
                }
                finishedSincePrune += 1
                if finishedSincePrune >= 4096 {
                    finishedSincePrune = 0
                    // With a margin: a cancelled dispatch's copy may surface (its TTL
                    // at its expiry) a little after the lifetime, and must still be
                    // recognised as ended.
                    statusLog.prune(olderThan: policy.lifetimeSeconds + Self.pruneMarginSeconds)
                }
            }
            if let lease = h.lease { pendingAcks.append(lease) }
            return
        }
        // The timer changes only when the machine says so: an accepted or
        // progress reply leaves the reply timeout and expiry in place.
        if case .some(let deadline) = timer {
            h.timerGeneration += 1
            if let deadline { timers.schedule(deadline, key: id, generation: h.timerGeneration) }
        }
        held[id] = h
        // Entries of rescheduled or finished dispatches linger until due: drop them once they pile up.
        if timers.count > 2 * held.count + 1024 {
            let current = held
            timers.compact { e in current[e.key]?.timerGeneration == e.generation }
        }
    }
}

extension SenderTerm {
    static let pruneMarginSeconds = 3600

    func countInFlight(_ route: RoutingTable.Route, _ window: LeaseWindow, _ change: Int) {
        let key = InFlightKey(route: route, window: window)
        inFlightCounts[key, default: 0] += change
        windowTotals[window, default: 0] += change
        if shareRule(of: window) != nil { metrics.windowHeld.set(Double(windowTotals[window] ?? 0), window.rawValue) }
        let total = [LeaseWindow.inbox, .retry, .park, .none].reduce(0) { $0 + (inFlightCounts[InFlightKey(route: route, window: $1)] ?? 0) }
        metrics.inFlight.set(Double(total), route.description)
    }

    /// The dispatch now waits as `copy`: noted at once (a copy it supersedes
    /// may surface before the confirm), and recorded in the status log for
    /// later leaders, so that a cancel or reroute acts on it without the copy.
    func waitingRecord(_ copy: ParkedDispatch, body: Data) -> OutboundMessage {
        let id = copy.record.id
        let expiresAt = RFC3339.parse(copy.record.expiresAt).map(StatusLog.seconds)
        let route = RoutingTable.Route(project: copy.project.id, target: copy.target.id)
        statusLog.noteWaiting(id: id, copySeq: copy.lastSeq, body: body, expiresAt: expiresAt, route: route, writer: partition, term: term)
        var properties = AMQPProperties.persistentJSON(messageID: "\(id)/waiting/\(copy.lastSeq)", correlationID: id, type: StatusLog.waitingType)
        var headers: FieldTable = [StatusLog.routeHeader: .string("\(route.project).\(route.target)"), StatusLog.writerHeader: .int64(Int64(partition))]
        if let expiresAt { headers[StatusLog.expiresAtHeader] = .int64(Int64(expiresAt)) }
        properties.headers = headers
        // A repeated record (same copy seq) changes nothing.
        return OutboundMessage(exchange: "", routingKey: SenderTopology.statusLog, body: body, properties: properties.stamped(by: login), repeatable: true)
    }
}

extension AMQPProperties {
    func with(replyTo: String) -> AMQPProperties {
        var p = self
        p.replyTo = replyTo
        return p
    }

    func with(headers: FieldTable) -> AMQPProperties {
        var p = self
        p.headers = headers
        return p
    }
}
