import ServiceKit

/// The router's figures on /metrics.
struct RouterMetrics: Sendable {
    let requests: Counter
    let deadLetters: Counter
    let commands: Counter
    let confidence: Histogram
    let handling: Histogram

    init(_ registry: MetricsRegistry) {
        requests = registry.counter(
            "frontdesk_router_requests_total", "dispatch requests by outcome: accepted, failed, duplicate", labels: ["outcome"])
        deadLetters = registry.counter("frontdesk_router_dead_letters_total", "messages dead-lettered, by code", labels: ["code"])
        commands = registry.counter("frontdesk_router_commands_total", "cancels and reroutes handed to the sender", labels: ["kind"])
        confidence = registry.histogram(
            "frontdesk_router_route_confidence", "confidence of resolved routes",
            buckets: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
        handling = registry.histogram(
            "frontdesk_router_handling_seconds", "from intake delivery to ack", buckets: Histogram.latencyBuckets)
    }
}
