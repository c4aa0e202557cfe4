/// When each window still waiting for its publisher confirms was published,
/// oldest first (windows settle in publish order), and whether the oldest
/// was reported as overdue: for a warning when a window's confirms are
/// late, as everything published after it waits behind it.
public struct ConfirmWait: Sendable, Equatable {
    private var published: [ContinuousClock.Instant] = []
    private var head = 0
    private var reportedHead = false

    public init() {}

    /// Windows waiting.
    public var count: Int { published.count - head }

    public mutating func published(at instant: ContinuousClock.Instant) {
        published.append(instant)
    }

    /// The oldest window settled (confirmed, or failed).
    public mutating func settledOldest() {
        guard head < published.count else { return }
        head += 1
        reportedHead = false
        if head >= 64, head * 2 >= published.count {
            published.removeFirst(head)
            head = 0
        }
    }

    /// How long the oldest window has waited, once, when that is at least
    /// `after`: nil before, and for the same window again.
    public mutating func overdue(after: Duration, now: ContinuousClock.Instant) -> Duration? {
        guard head < published.count, !reportedHead else { return nil }
        let waited = now - published[head]
        guard waited >= after else { return nil }
        reportedHead = true
        return waited
    }
}
