import Foundation

#if canImport(ActivityKit)
import ActivityKit
#endif

/// The Live Activity of one dispatch, as ActivityKit shapes it: the fixed
/// attributes (which dispatch, what was asked) and the `ContentState` that
/// every push replaces. Foundation only and no platform-specific API, so the
/// iOS app's widget target and the Linux services share one definition; on
/// iOS it is an `ActivityAttributes` as it stands.
public struct FrontDeskActivityAttributes: Codable, Hashable, Sendable {
    public var dispatchId: String
    /// The request, echoed on the accent rail.
    public var input: String

    public init(dispatchId: String, input: String) {
        self.dispatchId = dispatchId
        self.input = input
    }

    /// What the activity shows now: the fields of `content-state` in each push.
    public struct ContentState: Codable, Hashable, Sendable {
        public enum Bar: String, Codable, Hashable, Sendable { case done, current, pending }

        public var dispatchId: String
        /// The status event's seq: a state older than the one shown is ignored.
        public var seq: Int
        /// drafted, routing, sending, queued, replied, failed or cancelled.
        public var state: String
        public var step: Int
        public var steps: Int
        /// "Front Desk · live" or "Front Desk · queued".
        public var title: String
        /// "Yemaya · Board Prep" once the route is known.
        public var routeLine: String?
        /// The project's initials for the accent square, and the accent.
        public var glyph: String?
        public var accent: String?
        /// "Drafting reply · step 2 / 3".
        public var statusLine: String
        public var input: String
        /// routing / sending / replied.
        public var bars: [Bar]
        /// The last ≤ 3 lines of the reply so far.
        public var preview: [String]
        /// RFC 3339: when the dispatch started; the elapsed time counts from it.
        public var elapsedFrom: String
        /// Only while the agent's latest progress gave an ETA.
        public var etaMs: Int?
        public var isQueued: Bool
        /// "Best guess: Yemaya / Board Prep" while queued.
        public var bestGuess: String?
        /// "will dispatch on reconnect" while queued.
        public var footer: String?
        public var canCancel: Bool

        public init(
            dispatchId: String, seq: Int, state: String, step: Int, steps: Int, title: String, routeLine: String?, glyph: String?,
            accent: String?, statusLine: String, input: String, bars: [Bar], preview: [String], elapsedFrom: String, etaMs: Int?,
            isQueued: Bool, bestGuess: String?, footer: String?, canCancel: Bool
        ) {
            self.dispatchId = dispatchId
            self.seq = seq
            self.state = state
            self.step = step
            self.steps = steps
            self.title = title
            self.routeLine = routeLine
            self.glyph = glyph
            self.accent = accent
            self.statusLine = statusLine
            self.input = input
            self.bars = bars
            self.preview = preview
            self.elapsedFrom = elapsedFrom
            self.etaMs = etaMs
            self.isQueued = isQueued
            self.bestGuess = bestGuess
            self.footer = footer
            self.canCancel = canCancel
        }
    }
}

#if canImport(ActivityKit)
@available(iOS 16.1, *)
extension FrontDeskActivityAttributes: ActivityAttributes {}
#endif

/// The body of an ActivityKit push (`aps`), as the pusher sends it.
public struct ActivityPushPayload: Codable, Hashable, Sendable {
    public struct APS: Codable, Hashable, Sendable {
        /// Seconds since 1970: ActivityKit ignores a push older than the state shown.
        public var timestamp: Int
        /// "update", or "end" for a terminal state.
        public var event: String
        public var contentState: FrontDeskActivityAttributes.ContentState
        /// Seconds since 1970: when the state shown is out of date.
        public var staleDate: Int?
        /// Seconds since 1970 (end only): when the ended activity leaves the lock screen.
        public var dismissalDate: Int?
        public var relevanceScore: Double?

        enum CodingKeys: String, CodingKey {
            case timestamp, event
            case contentState = "content-state"
            case staleDate = "stale-date"
            case dismissalDate = "dismissal-date"
            case relevanceScore = "relevance-score"
        }

        public init(
            timestamp: Int, event: String, contentState: FrontDeskActivityAttributes.ContentState, staleDate: Int?,
            dismissalDate: Int?, relevanceScore: Double?
        ) {
            self.timestamp = timestamp
            self.event = event
            self.contentState = contentState
            self.staleDate = staleDate
            self.dismissalDate = dismissalDate
            self.relevanceScore = relevanceScore
        }
    }

    public var aps: APS

    public init(aps: APS) { self.aps = aps }
}
