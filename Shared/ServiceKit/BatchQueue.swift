import Synchronization

/// Items gathered from several tasks and taken by one consumer in batches:
/// whatever arrived while the consumer was busy comes as the next batch (up
/// to `limit`), so batches grow under load and a lone item goes at once.
public final class BatchQueue<Element: Sendable>: Sendable {
    private let buffer = Mutex<(items: [Element], finished: Bool)>(([], false))
    private let signal = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    public let limit: Int

    public init(limit: Int = .max) { self.limit = limit }

    public func yield(_ element: Element) {
        buffer.withLock { $0.items.append(element) }
        signal.continuation.yield()
    }

    /// No more items: `next()` returns what is left, then nil.
    public func finish() {
        buffer.withLock { $0.finished = true }
        signal.continuation.yield()
    }

    /// The next batch (waiting for at least one item), or nil once finished and empty.
    public func next() async -> [Element]? {
        var iterator = signal.stream.makeAsyncIterator()
        while true {
            let (batch, finished) = buffer.withLock { b -> ([Element], Bool) in
                let n = min(limit, b.items.count)
                let batch = Array(b.items.prefix(n))
                b.items.removeFirst(n)
                return (batch, b.finished)
            }
            if !batch.isEmpty { return batch }
            if finished { return nil }
            guard await iterator.next() != nil else { return nil }
        }
    }
}
