import Foundation

/// What the Live Activity shows for one dispatch, in every presentation of
/// the seed screen (compact, expanded, lock screen, offline queued, and the
/// ends). Built from status events only; plain values, so an iOS app can
/// reuse it as they are.
public struct LiveActivity: Sendable, Equatable {
    public enum Bar: String, Sendable { case done, current, pending }

    /// "Front Desk · live", or "Front Desk · queued" while waiting.
    public var title: String
    /// "Yemaya · Board Prep" once the route is known.
    public var routeLine: String?
    /// The project's initials in its accent square.
    public var glyph: String?
    public var accent: String?
    /// The request, echoed: the user sees what they asked for.
    public var input: String
    /// "Drafting reply · step 2 / 3".
    public var statusLine: String
    /// routing / sending / replied: done, the current one pulsing, pending.
    public var bars: [Bar]
    /// The last ≤ 3 lines of the reply so far.
    public var preview: [String]
    /// "0:04 elapsed".
    public var elapsed: String
    /// "~2s", only while the agent's ETA is known.
    public var eta: String?
    /// The offline queued state: muted, no progress, the best guess shown.
    public var isQueued: Bool
    public var bestGuess: String?
    public var footer: String?
    public var canCancel: Bool
    public var isFinished: Bool
}

/// The events of one dispatch folded into what to show.
public struct LiveActivityState: Sendable, Equatable {
    public private(set) var latest: StatusEvent?

    public init() {}

    /// Takes an event; false when it is not newer than what is shown
    /// (a repeated or late event), as CONTRACT.md tells surfaces to do.
    @discardableResult
    public mutating func apply(_ event: StatusEvent) -> Bool {
        if let latest, event.seq <= latest.seq { return false }
        latest = event
        return true
    }

    public func view(now: Date) -> LiveActivity? {
        guard let e = latest else { return nil }
        let route = e.project.flatMap { p in e.target.map { "\(p.name) · \($0.name)" } }
        let queued = e.state == .queued
        let started = RFC3339.parse(e.startedAt) ?? now
        let reference = e.state.isTerminal ? (RFC3339.parse(e.at) ?? now) : now
        return LiveActivity(
            title: queued ? "Front Desk · queued" : "Front Desk · live",
            routeLine: route, glyph: e.project?.glyph, accent: e.project?.accent, input: e.input ?? "",
            statusLine: Self.statusLine(e), bars: Self.bars(e), preview: e.preview ?? [],
            elapsed: Self.clock(reference.timeIntervalSince(started)) + " elapsed",
            eta: queued ? nil : e.etaMs.map { "~\(max(1, Int((Double($0) / 1000).rounded(.up))))s" },
            isQueued: queued,
            bestGuess: queued ? e.project.flatMap { p in e.target.map { "Best guess: \(p.name) / \($0.name)" } } : nil,
            footer: queued ? (e.queue?.reason == "retry_wait" ? "will retry by itself" : "will dispatch on reconnect") : nil,
            canCancel: !e.state.isTerminal, isFinished: e.state.isTerminal)
    }

    static func statusLine(_ e: StatusEvent) -> String {
        switch e.state {
        case .drafted, .routing, .sending: "\(e.activity) · step \(max(e.step, 1)) / \(e.steps)"
        case .queued: e.activity
        case .replied: "Agent replied"
        case .failed: "Failed — \(e.error?.message ?? e.error?.code ?? "error")"
        case .cancelled: "Cancelled"
        }
    }

    /// Lit up to the step reached; while something happens the next one
    /// pulses ("2/3 lit, third pulsing" while sending). Queued, failed and
    /// cancelled pulse nothing: no fake progress.
    static func bars(_ e: StatusEvent) -> [LiveActivity.Bar] {
        (1...3).map { i in
            if i <= e.step || e.state == .replied { return .done }
            if i == e.step + 1, [.drafted, .routing, .sending].contains(e.state) { return .current }
            return .pending
        }
    }

    /// "0:04", "12:30", "1:02:03".
    static func clock(_ seconds: TimeInterval) -> String {
        let s = max(0, Int(seconds))
        func two(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return s >= 3600 ? "\(s / 3600):\(two(s / 60 % 60)):\(two(s % 60))" : "\(s / 60):\(two(s % 60))"
    }
}
