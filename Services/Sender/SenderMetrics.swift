import ServiceKit

/// The sender's figures on /metrics.
struct SenderMetrics: Sendable {
    let dispatches: Counter
    let events: Counter
    let deliveries: Counter
    let retries: Counter
    let commands: Counter
    let parked: Gauge
    let agents: Gauge
    let inFlight: Gauge
    let windowHeld: Gauge
    let rejected: Counter
    let leader: Gauge
    let partitionsLed: Gauge
    let replyTime: Histogram
    let deadLetters: Counter
    let terms: Counter

    init(_ registry: MetricsRegistry) {
        dispatches = registry.counter("frontdesk_sender_dispatches_total", "dispatches received and finished, by state", labels: ["state"])
        events = registry.counter("frontdesk_sender_events_total", "status events published, by state", labels: ["state"])
        deliveries = registry.counter("frontdesk_sender_deliveries_total", "tasks delivered to agents")
        retries = registry.counter("frontdesk_sender_retries_total", "retries, by reason", labels: ["reason"])
        commands = registry.counter("frontdesk_sender_commands_total", "cancels and reroutes applied", labels: ["kind"])
        parked = registry.gauge("frontdesk_sender_parked", "dispatches parked, per target", labels: ["target"])
        agents = registry.gauge("frontdesk_sender_agents", "agents consuming, per target, as the leader last saw them", labels: ["target"])
        inFlight = registry.gauge("frontdesk_sender_in_flight", "dispatches with agents, per target", labels: ["target"])
        windowHeld = registry.gauge(
            "frontdesk_sender_window_held", "slots of a shared consumer window (inbox, retry) held by dispatches with agents",
            labels: ["window"])
        rejected = registry.counter("frontdesk_sender_rejected_total", "messages in internal queues that no service wrote, dropped", labels: ["queue"])
        leader = registry.gauge("frontdesk_sender_leader", "1 while this replica leads (a partition, with several)")
        partitionsLed = registry.gauge("frontdesk_sender_partitions_led", "how many of the sender's partitions this replica leads")
        deadLetters = registry.counter("frontdesk_sender_dead_letters_total", "agent replies dead-lettered, by code", labels: ["code"])
        terms = registry.counter(
            "frontdesk_sender_terms_total", "terms of leadership begun (one ends on a failure it cannot handle: a new one starts)")
        replyTime = registry.histogram(
            "frontdesk_sender_reply_seconds", "from the dispatch's start to its agent's final reply",
            buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600])
    }
}
