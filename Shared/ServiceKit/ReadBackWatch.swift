/// Whether a reader of a stream this service also writes to hangs. On
/// RabbitMQ 3.10 a stream consumer reads from the member on its own node, and
/// one whose member restarted can stay attached without a cancel and without
/// a delivery, while publishes to the stream are still confirmed. A service
/// that waits to read back what it wrote (the router's decision log) then
/// waits for ever, and only a new connection, to a node whose member reads,
/// helps.
///
/// It counts the reader's deliveries, any at all. A write the broker has
/// confirmed (stored) that has waited `limit` since for its read-back, with
/// not one delivery in between, means the reader hangs (a reader that lags
/// behind a backlog still delivers; a publish slow to confirm is not the
/// reader's fault); the service then reconnects, at most once each `gap`.
/// Pure: the caller passes the time.
public struct ReadBackWatch: Sendable {
    /// A write unread this long after its confirm, with nothing read since: the reader hangs.
    public let limit: Duration
    /// At most one verdict this often (a new connection reads the stream from
    /// its start again, which must have the time to).
    public let gap: Duration
    /// Deliveries read so far.
    private var reads: UInt64 = 0
    private var lastVerdict: ContinuousClock.Instant?

    public init(limit: Duration, gap: Duration) {
        self.limit = limit
        self.gap = gap
    }

    /// One delivery read.
    public mutating func read() { reads &+= 1 }

    /// What a write confirmed now notes: the reads so far.
    public var mark: UInt64 { reads }

    /// A write confirmed at `writtenAt`, when `mark` was taken, has not been
    /// read back by `now`: whether the reader hangs and the service should
    /// reconnect now.
    public mutating func unread(writtenAt: ContinuousClock.Instant, mark: UInt64, now: ContinuousClock.Instant) -> Bool {
        guard now - writtenAt >= limit, reads == mark else { return false }
        if let lastVerdict, now - lastVerdict < gap { return false }
        lastVerdict = now
        return true
    }
}
