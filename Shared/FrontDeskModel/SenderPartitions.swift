import Foundation

/// The sender's work split by route into `count` partitions, each led by one
/// sender replica at a time (FRONTDESK_SENDER_PARTITIONS, the same for the
/// router and every sender). A route's partition is a fixed hash of its ids,
/// so every replica and the router agree on it without asking anyone, and a
/// target's dispatches, presence and park queue stay with one leader.
public struct SenderPartitions: Sendable, Equatable {
    /// The most partitions a deployment may have.
    public static let maxCount = 64

    public let count: Int

    /// `count` is clamped to 1…`maxCount`.
    public init(count: Int) {
        self.count = min(max(count, 1), Self.maxCount)
    }

    public static let one = SenderPartitions(count: 1)

    /// The partition of `route`: FNV-1a (64-bit) of "project/target", modulo the count.
    public func partition(of route: RoutingTable.Route) -> Int {
        guard count > 1 else { return 0 }
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in route.project.utf8 + [UInt8(ascii: "/")] + route.target.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01b3
        }
        return Int(hash % UInt64(count))
    }

    /// The routes of `table` that partition `k` leads, in the table's order.
    public func routes(_ k: Int, of table: RoutingTable) -> [RoutingTable.Route] {
        table.routes.filter { partition(of: $0) == k }
    }

    /// All partitions.
    public var all: Range<Int> { 0..<count }

    /// What a name of partition `k` ends with: nothing for partition 0 (so
    /// that one partition keeps the names of an unpartitioned sender), `.k` else.
    public static func suffix(_ k: Int) -> String { k == 0 ? "" : ".\(k)" }
}

/// How the sender replicas share the partitions, decided by each replica on
/// its own from what it sees: how many replicas there are and which
/// partitions the others lead (their heartbeats in the status log), which
/// partitions it leads, and when it last changed. A partition's lock (an
/// exclusive queue) is the truth; this only decides when to try for it. No
/// replica leads more than its share for long, and no partition stays
/// without a leader: a replica below its share tries a partition nobody
/// claims at once; one at its share only once it has stayed unclaimed a
/// moment, so that a replica below its share gets it first.
public struct PartitionBalance: Sendable, Equatable {
    /// How long a replica waits after its last change before it gives partitions up.
    public static let settle: TimeInterval = 3
    /// After taking a partition beyond its share (one nobody else took), a
    /// replica keeps its partitions this long: with a replica count that is
    /// off for a moment, giving it up again would only pass it round.
    public static let keepAfterOverTake: TimeInterval = 10
    /// How long a partition must stay unclaimed before a replica at or above its share tries it.
    public static let overShareWait: TimeInterval = 0.5

    public let partitions: SenderPartitions

    public init(partitions: SenderPartitions) {
        self.partitions = partitions
    }

    /// The most partitions one of `replicas` replicas should lead: ⌈P / N⌉.
    public func share(replicas: Int) -> Int {
        let n = max(1, replicas)
        return (partitions.count + n - 1) / n
    }

    /// Whether a replica leading (or trying for) `led` partitions may try
    /// for one that no other replica's heartbeat has claimed for
    /// `unclaimedFor` seconds (nil: one claims it now). Beyond its share only
    /// once that partition, and the replica itself (`sinceOwnChange`: since
    /// it last took or gave up one; 0 while another of its slots tries), have
    /// been still for `overShareWait`: replicas that start together each take
    /// their share first. The same wait holds one at or above ⌊P / N⌋ while
    /// another leads fewer (`fewestElsewhere`): a partition given up for that
    /// one goes to it, not back to a replica that has its floor.
    public func mayTry(
        led: Int, replicas: Int, unclaimedFor: TimeInterval?, sinceOwnChange: TimeInterval = .infinity, fewestElsewhere: Int? = nil
    ) -> Bool {
        guard let unclaimedFor else { return false }
        let floor = floorShare(replicas: replicas)
        let anotherIsShort = fewestElsewhere.map { $0 < floor } ?? false
        let atOnce = led < share(replicas: replicas) && !(anotherIsShort && led >= floor)
        return atOnce || min(unclaimedFor, sinceOwnChange) >= Self.overShareWait
    }

    /// The fewest partitions one of `replicas` replicas should lead: ⌊P / N⌋.
    public func floorShare(replicas: Int) -> Int {
        partitions.count / max(1, replicas)
    }

    /// The partitions a replica should give up now, once it has not changed
    /// for `settle` and has not taken one beyond its share lately: the
    /// highest it leads beyond its share; or, while another replica leads
    /// fewer than ⌊P / N⌋ (`fewestElsewhere`, from the heartbeats) and this
    /// one more, its highest one. (The share alone left 4 partitions on 3
    /// replicas as 2, 2 and 0 for good: nobody was above ⌈4 / 3⌉ = 2, and the
    /// third had nothing unclaimed to try.) A replica giving one up this way
    /// keeps at least ⌊P / N⌋, so none gives one back to it: no round trips.
    public func release(
        led: Set<Int>, replicas: Int, fewestElsewhere: Int? = nil, sinceLastChange: TimeInterval, sinceOverTake: TimeInterval
    ) -> [Int] {
        guard sinceLastChange >= Self.settle, sinceOverTake >= Self.keepAfterOverTake else { return [] }
        let share = share(replicas: replicas)
        if led.count > share { return Array(led.sorted().suffix(led.count - share)) }
        let floor = floorShare(replicas: replicas)
        if let fewest = fewestElsewhere, fewest < floor, led.count > floor { return Array(led.sorted().suffix(1)) }
        return []
    }
}
