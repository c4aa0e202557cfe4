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
    /// another is short (`isShort`): a partition given up for that one goes
    /// to it, not back to a replica that has its floor.
    public func mayTry(
        led: Int, replicas: Int, unclaimedFor: TimeInterval?, sinceOwnChange: TimeInterval = .infinity, peers: [Peer] = []
    ) -> Bool {
        guard let unclaimedFor else { return false }
        let floor = floorShare(replicas: replicas)
        let atOnce = led < share(replicas: replicas) && !(led >= floor && isShort(peers, replicas: replicas))
        return atOnce || min(unclaimedFor, sinceOwnChange) >= Self.overShareWait
    }

    /// Another replica, as its latest heartbeat shows it.
    public struct Peer: Sendable, Equatable {
        public var id: String
        /// How many partitions it leads.
        public var led: Int
        /// Whether it has a partition slot standing by, ready to try for one
        /// (a replica that cannot connect its slots is not waiting for one).
        public var standingBy: Bool

        public init(id: String, led: Int, standingBy: Bool) {
            self.id = id
            self.led = led
            self.standingBy = standingBy
        }
    }

    /// Whether one of `peers` stands by leading fewer than ⌊P / N⌋.
    public func isShort(_ peers: [Peer], replicas: Int) -> Bool {
        let floor = floorShare(replicas: replicas)
        return peers.contains { $0.standingBy && $0.led < floor }
    }

    /// After giving a partition up for a short replica, a replica waits this
    /// long before it does so again: should the short one not take it (it
    /// fails to, or its heartbeat misleads), partitions do not pass round
    /// every few seconds.
    public static let shortReleaseWait: TimeInterval = 30

    /// The fewest partitions one of `replicas` replicas should lead: ⌊P / N⌋.
    public func floorShare(replicas: Int) -> Int {
        partitions.count / max(1, replicas)
    }

    /// The partitions a replica (`me`) should give up now, once it has not
    /// changed for `settle` and has not taken one beyond its share lately:
    /// the highest it leads beyond its share; or, while a replica standing by
    /// leads fewer than ⌊P / N⌋ (`isShort`), its highest one, if it leads
    /// more than ⌊P / N⌋ and the most of all (ties: the lowest id, so one
    /// replica gives one, not each), and has not done so for
    /// `shortReleaseWait`, and only while every partition is led (`allLed`:
    /// one given up a moment ago is the short replica's to take; another
    /// leader that gave one too would make two hand-offs of one). (The share alone left 4 partitions on 3 replicas
    /// as 2, 2 and 0 for good: nobody was above ⌈4 / 3⌉ = 2, and the third
    /// had nothing unclaimed to try.) It keeps at least ⌊P / N⌋, so none
    /// gives one back to it.
    public func release(
        led: Set<Int>, me: String = "", replicas: Int, peers: [Peer] = [], allLed: Bool = true,
        sinceLastChange: TimeInterval, sinceOverTake: TimeInterval, sinceShortRelease: TimeInterval = .infinity
    ) -> [Int] {
        guard sinceLastChange >= Self.settle, sinceOverTake >= Self.keepAfterOverTake else { return [] }
        let share = share(replicas: replicas)
        if led.count > share { return Array(led.sorted().suffix(led.count - share)) }
        guard allLed, led.count > floorShare(replicas: replicas), isShort(peers, replicas: replicas),
            sinceShortRelease >= Self.shortReleaseWait,
            !peers.contains(where: { $0.led > led.count || ($0.led == led.count && $0.id < me) })
        else { return [] }
        return Array(led.sorted().suffix(1))
    }
}
