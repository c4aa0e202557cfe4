import Foundation

/// An ActivityKit push for a status event: `aps` with `timestamp`, `event`
/// (update, or end for a terminal state), `content-state` (what the Live
/// Activity shows), `stale-date`, `dismissal-date` (end only) and
/// `relevance-score`. At most 4 KB, as APNs allows: the preview is trimmed
/// first, then the input echo.
public enum ActivityPush {
    public static let maxBytes = 4096

    public static func payload(for event: StatusEvent, view: LiveActivity) -> Data {
        let at = RFC3339.parse(event.at) ?? Date()
        let timestamp = Int(at.timeIntervalSince1970)
        var content: [String: Any] = [
            "dispatchId": event.dispatchId, "seq": event.seq, "state": event.state.rawValue, "step": event.step,
            "steps": event.steps, "title": view.title, "statusLine": view.statusLine, "input": view.input,
            "bars": view.bars.map(\.rawValue), "preview": view.preview, "elapsedFrom": event.startedAt,
            "isQueued": view.isQueued, "canCancel": view.canCancel,
        ]
        if let v = view.routeLine { content["routeLine"] = v }
        if let v = view.glyph { content["glyph"] = v }
        if let v = view.accent { content["accent"] = v }
        if let v = event.etaMs, !view.isQueued { content["etaMs"] = v }
        if let v = view.bestGuess { content["bestGuess"] = v }
        if let v = view.footer { content["footer"] = v }
        var aps: [String: Any] = [
            "timestamp": timestamp, "event": event.state.isTerminal ? "end" : "update", "content-state": content,
            // Past its expiry (or a minute after it ended) the activity is stale.
            "stale-date": Int((RFC3339.parse(event.expiresAt) ?? at).timeIntervalSince1970),
            "relevance-score": relevance(event.state),
        ]
        if event.state.isTerminal {
            aps["stale-date"] = timestamp + 60
            aps["dismissal-date"] = timestamp + 15 * 60
        }
        func encode() -> Data { try! JSONSerialization.data(withJSONObject: ["aps": aps], options: [.sortedKeys]) }
        var data = encode()
        // Too big: drop preview lines from the oldest, then shorten the input echo.
        while data.count > maxBytes, var c = aps["content-state"] as? [String: Any] {
            if var preview = c["preview"] as? [String], !preview.isEmpty {
                if let longest = preview.indices.max(by: { preview[$0].utf8.count < preview[$1].utf8.count }),
                    preview[longest].utf8.count > 200
                {
                    preview[longest] = String(preview[longest].prefix(preview[longest].count / 2)) + "…"
                } else {
                    preview.removeFirst()
                }
                c["preview"] = preview
            } else if let input = c["input"] as? String, input.count > 40 {
                c["input"] = String(input.prefix(input.count / 2)) + "…"
            } else {
                break
            }
            aps["content-state"] = c
            data = encode()
        }
        return data
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
