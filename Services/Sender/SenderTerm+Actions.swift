import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

extension SenderTerm {
    // MARK: Actions

    /// Carries out a machine's actions: publishes (confirmed, in order), the
    /// timer, and the lease (acked once the dispatch is parked anew or finished).
    func execute(_ actions: [DispatchMachine.Action], id: String, window: LeaseWindow = .none) async throws {
        guard var h = held[id] else { return }
        if h.inFlight == nil, actions.contains(where: { if case .deliver = $0 { true } else { false } }) {
            h.inFlight = (h.machine.route, window)
            countInFlight(h.machine.route, window, +1)
        }
        var messages: [OutboundMessage] = []
        var release = false
        var timer: Date?? = nil
        for action in actions {
            switch action {
            case .deliver(let attempt):
                let task = AgentTask(h.machine, attempt: attempt)
                messages.append(OutboundMessage(
                    exchange: "", routingKey: SenderTopology.agentQueue(h.machine.route), body: task.jsonData(),
                    properties: .persistentJSON(messageID: task.messageID, correlationID: id, type: AgentTask.type)
                        .with(replyTo: SenderTopology.replies), mandatory: true))
                metrics.deliveries.increment()
            case .publish(let event):
                messages.append(OutboundMessage(
                    exchange: SharedTopology.statusExchange, routingKey: event.routingKey, body: event.jsonData(),
                    properties: .persistentJSON(messageID: event.messageID, correlationID: id, type: StatusEvent.type)))
                metrics.events.increment(event.state.rawValue)
                if event.state == .queued, event.queue?.reason == "retry_wait" { metrics.retries.increment("retry_wait") }
            case .park:
                var properties = AMQPProperties.persistentJSON(messageID: "\(id)/parked/\(h.machine.lastSeq)", correlationID: id, type: ParkedDispatch.type)
                properties.expiration = String(SenderTopology.ttlMs(until: h.machine.expiresAtDate, now: Date()))
                messages.append(OutboundMessage(
                    exchange: "", routingKey: SenderTopology.parkQueue(h.machine.route), body: h.machine.parked.jsonData(),
                    properties: properties, mandatory: true))
                messages.append(waitingRecord(h.machine.parked))
                release = true
            case .setTimer(let date):
                timer = .some(date)
            case .finish:
                release = true
            }
        }
        // A retry waits in the broker, not here: in a delay queue whose TTL
        // brings it back to frontdesk.sender.retry when it is due.
        if !release, let retryAt = h.machine.retryAtDate {
            // Back when the retry is due, or when the lifetime ends if that is sooner.
            let wakeAt = min(retryAt, h.machine.expiresAtDate)
            let (queue, ttl) = SenderTopology.delayQueue(ms: SenderTopology.ttlMs(until: wakeAt, now: Date()))
            if !delayQueues.contains(queue) {
                try await SenderTopology.declareDelayQueue(queue, ttlMs: ttl, on: publisher)
                delayQueues.insert(queue)
            }
            messages.append(OutboundMessage(
                exchange: "", routingKey: queue, body: h.machine.parked.jsonData(),
                properties: .persistentJSON(messageID: "\(id)/retry/\(h.machine.attempt)", correlationID: id, type: ParkedDispatch.type),
                mandatory: true))
            messages.append(waitingRecord(h.machine.parked))
            release = true
        }
        pendingMessages += messages
        if release {
            held[id] = nil
            if let f = h.inFlight { countInFlight(f.route, f.window, -1) }
            if case .finished(let state) = h.machine.phase {
                metrics.dispatches.increment(state.rawValue)
                statusLog.markFinished(id)
                if state == .replied, let started = RFC3339.parse(h.machine.record.startedAt) {
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
        let total = [LeaseWindow.inbox, .retry, .park, .none].reduce(0) { $0 + (inFlightCounts[InFlightKey(route: route, window: $1)] ?? 0) }
        metrics.inFlight.set(Double(total), route.description)
    }

    /// The dispatch now waits as `copy`: noted at once (a copy it supersedes
    /// may surface before the confirm), and recorded in the status log for
    /// later leaders, so that a cancel or reroute acts on it without the copy.
    func waitingRecord(_ copy: ParkedDispatch) -> OutboundMessage {
        statusLog.noteWaiting(copy)
        let id = copy.record.id
        return OutboundMessage(
            exchange: "", routingKey: SenderTopology.statusLog, body: copy.jsonData(),
            properties: .persistentJSON(messageID: "\(id)/waiting/\(copy.lastSeq)", correlationID: id, type: StatusLog.waitingType))
    }
}

extension AMQPProperties {
    func with(replyTo: String) -> AMQPProperties {
        var p = self
        p.replyTo = replyTo
        return p
    }
}
