import FrontDeskActivity
import Foundation

/// An ActivityKit push for a status event (`FrontDeskActivity`'s
/// `ActivityPushPayload`): `aps` with `timestamp`, `event` (update, or end
/// for a terminal state), `content-state` (what the Live Activity shows),
/// `stale-date`, `dismissal-date` (end only) and `relevance-score`. At most
/// 4 KB, as APNs allows: the preview is trimmed first, then the input echo.
public enum ActivityPush {
    public static let maxBytes = 4096
    /// After an ETA runs out, this long until a frozen "~Ns left" counts as stale.
    public static let etaGraceSeconds = 10
    /// An ended activity stays on the lock screen this long.
    public static let dismissalSeconds = 15 * 60

    public static func contentState(for event: StatusEvent, view: LiveActivity) -> FrontDeskActivityAttributes.ContentState {
        FrontDeskActivityAttributes.ContentState(
            dispatchId: event.dispatchId, seq: event.seq, state: event.state.rawValue, step: event.step, steps: event.steps,
            title: view.title, routeLine: view.routeLine, glyph: view.glyph, accent: view.accent, statusLine: view.statusLine,
            input: view.input, bars: view.bars.map { .init(rawValue: $0.rawValue) ?? .pending }, preview: view.preview,
            elapsedFrom: event.startedAt, etaMs: view.isQueued ? nil : event.etaMs, isQueued: view.isQueued,
            bestGuess: view.bestGuess, footer: view.footer, canCancel: view.canCancel)
    }

    public static func payloadValue(for event: StatusEvent, view: LiveActivity) -> ActivityPushPayload {
        let at = RFC3339.parse(event.at) ?? Date()
        let timestamp = Int(at.timeIntervalSince1970)
        // Stale when its ETA has run out (a frozen "~2s left" must not look live), else at the dispatch's expiry.
        var stale = Int((RFC3339.parse(event.expiresAt) ?? at).timeIntervalSince1970)
        if let eta = event.etaMs, event.state == .sending, eta >= 0 {
            // Whole seconds, rounded up, without adding to an ETA that may be near Int.max
            // (an event anyone can publish); past the expiry the expiry is the bound anyway.
            let seconds = min(eta / 1000 + (eta % 1000 == 0 ? 0 : 1), 366 * 86_400)
            stale = min(stale, timestamp + seconds + etaGraceSeconds)
        }
        var aps = ActivityPushPayload.APS(
            timestamp: timestamp, event: event.state.isTerminal ? "end" : "update", contentState: contentState(for: event, view: view),
            staleDate: stale, dismissalDate: nil, relevanceScore: relevance(event.state))
        if event.state.isTerminal {
            aps.staleDate = timestamp + 60
            aps.dismissalDate = timestamp + dismissalSeconds
        }
        return ActivityPushPayload(aps: aps)
    }

    public static func payload(for event: StatusEvent, view: LiveActivity) -> Data {
        var value = payloadValue(for: event, view: view)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        func encode() -> Data { (try? encoder.encode(value)) ?? Data("{}".utf8) }
        var data = encode()
        // Too big: shorten the longest preview line or drop the oldest, then shorten the input echo.
        while data.count > maxBytes {
            var c = value.aps.contentState
            if c.input.utf8.count > 512 {
                // A long input first: the echo is a line or two on the lock screen, the preview is the news.
                c.input = Self.halved(c.input)
            } else if !c.preview.isEmpty {
                if let longest = c.preview.indices.max(by: { c.preview[$0].utf8.count < c.preview[$1].utf8.count }),
                    c.preview[longest].utf8.count > 200
                {
                    c.preview[longest] = Self.halved(c.preview[longest])
                } else {
                    c.preview.removeFirst()
                }
            } else if c.input.utf8.count > 120 {
                // By bytes, not characters: a character may carry many combining marks.
                c.input = Self.halved(c.input)
            } else if let route = c.routeLine, route.utf8.count > 120 {
                c.routeLine = Self.halved(route)
            } else if c.statusLine.utf8.count > 120 {
                c.statusLine = Self.halved(c.statusLine)
            } else if c.bestGuess != nil || c.footer != nil || !c.input.isEmpty {
                c.bestGuess = nil
                c.footer = nil
                c.input = ""
            } else {
                break  // what is left is a few hundred bytes of fixed fields
            }
            value.aps.contentState = c
            data = encode()
        }
        return data
    }

    /// The first half of `text` by UTF-8 bytes, on a scalar boundary, with an
    /// ellipsis: always shorter than a text of more than 6 bytes, whatever its characters.
    static func halved(_ text: String) -> String {
        var kept = String.UnicodeScalarView()
        var bytes = 0
        for scalar in text.unicodeScalars {
            bytes += String(scalar).utf8.count
            if bytes > text.utf8.count / 2 { break }
            kept.append(scalar)
        }
        return String(kept) + "…"
    }

    /// `apns-priority`: 10 when what the activity says changes (a new state,
    /// a new route, the end), 5 for preview-only updates in the same state. Priority 10
    /// draws on the device's update budget; 5 does not, but may be delivered
    /// late (Apple, "Determine the update frequency").
    /// A new route (a reroute while queued or sending) is a change too: the
    /// activity shows the route, and the user who edited it waits to see it.
    public static func priority(for event: StatusEvent, previousState: DispatchState?, previousRoute: String?) -> Int {
        event.state.isTerminal || event.state != previousState || route(of: event) != previousRoute ? 10 : 5
    }

    /// The route an event shows, `<project>/<target>` (nil before one is known).
    public static func route(of event: StatusEvent) -> String? {
        event.target.map { "\(event.project?.id ?? "_")/\($0.id)" }
    }

    /// Activities that need the user rank higher.
    static func relevance(_ state: DispatchState) -> Double {
        switch state {
        case .sending: 100
        case .queued: 75
        case .routing, .drafted: 50
        case .replied: 90
        case .failed, .cancelled: 25
        }
    }
}
