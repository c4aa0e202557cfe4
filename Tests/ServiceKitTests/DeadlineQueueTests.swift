import Foundation
import ServiceKit
import Testing

@Suite("DeadlineQueue")
struct DeadlineQueueTests {
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    @Test func dueEntriesComeEarliestFirstAndOnlyOnce() {
        var generator = SystemRandomNumberGenerator()
        var queue = DeadlineQueue<String>()
        var reference: [(Date, String)] = []
        for i in 0..<2000 {
            let deadline = t0.addingTimeInterval(Double(Int.random(in: 0..<10_000, using: &generator)) / 10)
            queue.schedule(deadline, key: "k\(i)", generation: i)
            reference.append((deadline, "k\(i)"))
        }
        reference.sort { $0.0 < $1.0 }
        var popped: [DeadlineQueue<String>.Entry] = []
        for step in stride(from: 0.0, through: 1000, by: 37.5) {
            let due = queue.due(at: t0.addingTimeInterval(step))
            #expect(due.allSatisfy { $0.deadline <= t0.addingTimeInterval(step) })
            #expect(queue.earliest.map { $0 > t0.addingTimeInterval(step) } ?? true)
            popped += due
        }
        popped += queue.due(at: .distantFuture)
        #expect(queue.count == 0)
        #expect(popped.count == reference.count)
        #expect(popped.map(\.deadline) == reference.map(\.0), "not earliest first")
        #expect(Set(popped.map(\.key)) == Set(reference.map(\.1)))
    }

    @Test func compactKeepsOnlyCurrentGenerations() {
        var queue = DeadlineQueue<String>()
        // "a" rescheduled three times: only generation 3 is current.
        for (generation, offset) in [(1, 5.0), (2, 1.0), (3, 9.0)] {
            queue.schedule(t0.addingTimeInterval(offset), key: "a", generation: generation)
        }
        queue.schedule(t0.addingTimeInterval(3), key: "b", generation: 1)
        queue.compact { $0.key == "b" || $0.generation == 3 }
        #expect(queue.count == 2)
        let due = queue.due(at: t0.addingTimeInterval(100))
        #expect(due.map(\.key) == ["b", "a"])
        #expect(due.map(\.generation) == [1, 3])
    }

    @Test func nothingIsDueBeforeItsDeadline() {
        var queue = DeadlineQueue<Int>()
        queue.schedule(t0.addingTimeInterval(1), key: 1, generation: 0)
        #expect(queue.due(at: t0.addingTimeInterval(0.999)).isEmpty)
        #expect(queue.due(at: t0.addingTimeInterval(1)).map(\.key) == [1])
    }
}
