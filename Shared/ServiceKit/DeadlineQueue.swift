import Foundation

/// Deadlines by key, earliest first: a binary min-heap. Rescheduling a key
/// does not remove its old entry; each entry carries a generation, and the
/// owner ignores entries whose generation is no longer the key's current
/// one (see `due(at:)`). `compact(keeping:)` drops such stale entries once
/// they pile up. One of these replaces a sleeping task per deadline.
public struct DeadlineQueue<Key: Hashable & Sendable>: Sendable {
    public struct Entry: Sendable, Equatable {
        public let deadline: Date
        public let key: Key
        public let generation: Int
    }

    private var heap: [Entry] = []

    public init() {}

    public var count: Int { heap.count }
    public var earliest: Date? { heap.first?.deadline }

    public mutating func schedule(_ deadline: Date, key: Key, generation: Int) {
        heap.append(Entry(deadline: deadline, key: key, generation: generation))
        var child = heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { break }
            heap.swapAt(child, parent)
            child = parent
        }
    }

    /// Removes and returns every entry due at `now`, earliest first.
    public mutating func due(at now: Date) -> [Entry] {
        var due: [Entry] = []
        while let first = heap.first, first.deadline <= now {
            due.append(first)
            removeFirst()
        }
        return due
    }

    /// Keeps only the entries `isCurrent` accepts (the others can never fire).
    public mutating func compact(keeping isCurrent: (Entry) -> Bool) {
        let kept = heap.filter(isCurrent)
        heap = []
        heap.reserveCapacity(kept.count)
        for e in kept { schedule(e.deadline, key: e.key, generation: e.generation) }
    }

    private mutating func removeFirst() {
        let last = heap.removeLast()
        guard !heap.isEmpty else { return }
        heap[0] = last
        var parent = 0
        while true {
            let left = 2 * parent + 1, right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count, heap[right].deadline < heap[smallest].deadline { smallest = right }
            if smallest == parent { return }
            heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}
