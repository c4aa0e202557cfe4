import ServiceKit
import Testing

@Suite("BatchQueue", .timeLimit(.minutes(1)))
struct BatchQueueTests {
    @Test func whatGatheredComesAsOneBatchUpToTheLimit() async {
        let q = BatchQueue<Int>(limit: 3)
        for i in 1...7 { q.yield(i) }
        #expect(await q.next() == [1, 2, 3])
        #expect(await q.next() == [4, 5, 6])
        #expect(await q.next() == [7])
        q.yield(8)
        #expect(await q.next() == [8])
    }

    @Test func takingWhatIsThereNeverWaitsAndKeepsTheOrder() async {
        let q = BatchQueue<Int>(limit: 10)
        #expect(q.takeAvailable(upTo: 5) == [])
        for i in 1...4 { q.yield(i) }
        #expect(q.takeAvailable(upTo: 0) == [])
        #expect(q.takeAvailable(upTo: -1) == [])
        #expect(q.takeAvailable(upTo: 3) == [1, 2, 3])
        q.yield(5)
        #expect(q.takeAvailable(upTo: 3) == [4, 5])
        q.yield(6)
        #expect(await q.next() == [6])
    }

    @Test func aWaitingConsumerIsWokenByAnItem() async {
        let q = BatchQueue<String>()
        let consumer = Task { await q.next() }
        q.yield("a")
        #expect(await consumer.value == ["a"])
    }

    @Test func finishHandsOutWhatIsLeftThenNil() async {
        let q = BatchQueue<Int>(limit: 2)
        q.yield(1); q.yield(2); q.yield(3)
        q.finish()
        #expect(await q.next() == [1, 2])
        #expect(await q.next() == [3])
        #expect(await q.next() == nil)
        #expect(await q.next() == nil)
        // A consumer already waiting when the queue finishes hears it too.
        let empty = BatchQueue<Int>()
        let waiting = Task { await empty.next() }
        empty.finish()
        #expect(await waiting.value == nil)
    }

    /// Cancelled before or while it waits, `next()` returns nil; items
    /// already there still come first.
    @Test func aCancelledConsumerStopsWaiting() async {
        for _ in 0..<200 {
            let q = BatchQueue<Int>()
            let consumer = Task { await q.next() }
            consumer.cancel()
            #expect(await consumer.value == nil)
        }
        let q = BatchQueue<Int>()
        q.yield(1)
        let consumer = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return [await q.next(), await q.next()]
        }
        #expect(await consumer.value == [[1], nil])
    }

    /// Four producers at once: every item arrives once, each producer's in its order.
    @Test func concurrentProducersLoseNothing() async {
        let q = BatchQueue<(producer: Int, n: Int)>(limit: 100)
        let perProducer = 20_000
        let producers = (0..<4).map { p in
            Task.detached { for n in 0..<perProducer { q.yield((p, n)) } }
        }
        var next = [0, 0, 0, 0]
        var received = 0
        var inOrder = true
        while received < 4 * perProducer, let batch = await q.next() {
            #expect(batch.count <= 100)
            for item in batch {
                inOrder = inOrder && item.n == next[item.producer]
                next[item.producer] = item.n + 1
            }
            received += batch.count
        }
        for p in producers { await p.value }
        #expect(received == 4 * perProducer)
        #expect(inOrder)
        #expect(next == Array(repeating: perProducer, count: 4))
    }
}
