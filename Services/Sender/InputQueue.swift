import AMQP
import Synchronization

/// Inputs gathered from several tasks, taken by the term's loop in batches.
final class InputQueue<Element: Sendable>: Sendable {
    private let buffer = Mutex<(items: [Element], finished: Bool)>(([], false))
    private let signal = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))

    func yield(_ element: Element) {
        buffer.withLock { $0.items.append(element) }
        signal.continuation.yield()
    }

    func finish() {
        buffer.withLock { $0.finished = true }
        signal.continuation.yield()
    }

    /// Everything gathered so far (waiting for at least one), or nil once finished.
    func next() async -> [Element]? {
        var iterator = signal.stream.makeAsyncIterator()
        while true {
            let (items, finished) = buffer.withLock { b -> ([Element], Bool) in
                let items = b.items
                b.items = []
                return (items, b.finished)
            }
            if finished { return nil }
            if !items.isEmpty { return items }
            guard await iterator.next() != nil else { return nil }
        }
    }
}

/// Deliveries gathered by a reader task.
actor DeliveryBox {
    private(set) var all: [AMQPDelivery] = []
    var count: Int { all.count }
    func append(_ d: AMQPDelivery) { all.append(d) }
}
