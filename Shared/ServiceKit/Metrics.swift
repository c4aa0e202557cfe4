import Foundation
import Synchronization

/// Metrics in the Prometheus text format. Each metric has fixed label names;
/// a sample is addressed by its label values, in the same order.
public final class MetricsRegistry: Sendable {
    private let metrics = Mutex<[any RenderableMetric]>([])

    public init() {}

    public func counter(_ name: String, _ help: String, labels: [String] = []) -> Counter {
        register(Counter(name: name, help: help, labelNames: labels))
    }

    public func gauge(_ name: String, _ help: String, labels: [String] = []) -> Gauge {
        register(Gauge(name: name, help: help, labelNames: labels))
    }

    public func histogram(_ name: String, _ help: String, buckets: [Double], labels: [String] = []) -> Histogram {
        register(Histogram(name: name, help: help, buckets: buckets, labelNames: labels))
    }

    private func register<M: RenderableMetric>(_ metric: M) -> M {
        metrics.withLock { $0.append(metric) }
        return metric
    }

    /// The whole exposition, for GET /metrics.
    public func render() -> String {
        let all = metrics.withLock { $0 }
        return all.map { $0.render() }.joined()
    }

    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"
}

protocol RenderableMetric: Sendable {
    func render() -> String
}

func formatLabels(_ names: [String], _ values: [String], extra: (String, String)? = nil) -> String {
    var pairs = zip(names, values).map { ($0, $1) }
    if let extra { pairs.append(extra) }
    guard !pairs.isEmpty else { return "" }
    return "{" + pairs.map { "\($0)=\"\(escapeLabel($1))\"" }.joined(separator: ",") + "}"
}

private func escapeLabel(_ v: String) -> String {
    v.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
        .replacingOccurrences(of: "\n", with: "\\n")
}

/// One line a label set, in a stable order.
func renderSamples(name: String, help: String, type: String, labelNames: [String], samples: [[String]: Double]) -> String {
    var out = "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    for (labels, v) in samples.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
        out += "\(name)\(formatLabels(labelNames, labels)) \(formatNumber(v))\n"
    }
    return out
}

/// An unlabelled counter or gauge is shown (as 0) from the start, so that a
/// scrape tells "zero" from "not exported"; a labelled one from its first label set.
private func initialSamples(_ labelNames: [String]) -> [[String]: Double] {
    labelNames.isEmpty ? [[]: 0] : [:]
}

func formatNumber(_ v: Double) -> String {
    if v.isNaN { return "NaN" }
    if v.isInfinite { return v > 0 ? "+Inf" : "-Inf" }
    if v == v.rounded(), abs(v) < 1e15 { return String(Int64(v)) }
    return String(v)
}

/// A value that only goes up.
public final class Counter: RenderableMetric {
    let name: String, help: String, labelNames: [String]
    private let samples: Mutex<[[String]: Double]>

    init(name: String, help: String, labelNames: [String]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
        samples = Mutex(initialSamples(labelNames))
    }

    public func increment(by amount: Double = 1, _ labelValues: String...) {
        precondition(labelValues.count == labelNames.count, "\(name) takes labels \(labelNames)")
        samples.withLock { $0[labelValues, default: 0] += max(0, amount) }
    }

    public func value(_ labelValues: String...) -> Double { samples.withLock { $0[labelValues] ?? 0 } }

    func render() -> String {
        renderSamples(name: name, help: help, type: "counter", labelNames: labelNames, samples: samples.withLock { $0 })
    }
}

/// A value that goes up and down.
public final class Gauge: RenderableMetric {
    let name: String, help: String, labelNames: [String]
    private let samples: Mutex<[[String]: Double]>

    init(name: String, help: String, labelNames: [String]) {
        self.name = name
        self.help = help
        self.labelNames = labelNames
        samples = Mutex(initialSamples(labelNames))
    }

    public func set(_ value: Double, _ labelValues: String...) {
        precondition(labelValues.count == labelNames.count, "\(name) takes labels \(labelNames)")
        samples.withLock { $0[labelValues] = value }
    }

    public func add(_ delta: Double, _ labelValues: String...) {
        precondition(labelValues.count == labelNames.count, "\(name) takes labels \(labelNames)")
        samples.withLock { $0[labelValues, default: 0] += delta }
    }

    public func value(_ labelValues: String...) -> Double { samples.withLock { $0[labelValues] ?? 0 } }

    func render() -> String {
        renderSamples(name: name, help: help, type: "gauge", labelNames: labelNames, samples: samples.withLock { $0 })
    }
}

/// Observations counted into cumulative buckets, with their sum and count.
public final class Histogram: RenderableMetric {
    let name: String, help: String, labelNames: [String]
    let buckets: [Double]
    struct Sample { var counts: [UInt64]; var sum: Double; var count: UInt64 }
    private let samples = Mutex<[[String]: Sample]>([:])

    init(name: String, help: String, buckets: [Double], labelNames: [String]) {
        self.name = name
        self.help = help
        self.buckets = buckets.sorted()
        self.labelNames = labelNames
    }

    public func observe(_ value: Double, _ labelValues: String...) {
        precondition(labelValues.count == labelNames.count, "\(name) takes labels \(labelNames)")
        let index = buckets.firstIndex(where: { value <= $0 }) ?? buckets.count
        samples.withLock { s in
            var sample = s[labelValues] ?? Sample(counts: Array(repeating: 0, count: buckets.count + 1), sum: 0, count: 0)
            sample.counts[index] += 1
            sample.sum += value
            sample.count += 1
            s[labelValues] = sample
        }
    }

    public func count(_ labelValues: String...) -> UInt64 { samples.withLock { $0[labelValues]?.count ?? 0 } }

    func render() -> String {
        var out = "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (labels, s) in samples.withLock({ $0 }).sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            var cumulative: UInt64 = 0
            for (i, bound) in (buckets + [.infinity]).enumerated() {
                cumulative += s.counts[i]
                out += "\(name)_bucket\(formatLabels(labelNames, labels, extra: ("le", formatNumber(bound)))) \(cumulative)\n"
            }
            out += "\(name)_sum\(formatLabels(labelNames, labels)) \(formatNumber(s.sum))\n"
            out += "\(name)_count\(formatLabels(labelNames, labels)) \(s.count)\n"
        }
        return out
    }

    /// Seconds, from 1 ms to 30 s.
    public static let latencyBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
}
