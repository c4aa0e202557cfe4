import AMQP
import Synchronization

/// Collects intake deliveries and hands the processor whatever has
/// gathered, up to `limit` at a time: under load batches grow by themselves,
/// and a lone request still goes at once.
final class IntakeBatcher: Sendable {
    private let buffer = Mutex<[AMQPDelivery]>([])
    private let signal = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    let limit: Int

    init(limit: Int) { self.limit = limit }

    func add(_ delivery: AMQPDelivery) {
        buffer.withLock { $0.append(delivery) }
        signal.continuation.yield()
    }

    func finish() { signal.continuation.finish() }

    /// Calls `body` with each batch until `finish()` and the buffer is empty.
    /// The caller pulls: what arrives while `body` runs gathers into the next batch.
    func forEachBatch(_ body: ([AMQPDelivery]) async -> Void) async {
        for await _ in signal.stream {
            while case let batch = take(), !batch.isEmpty {
                await body(batch)
            }
        }
        while case let batch = take(), !batch.isEmpty {
            await body(batch)
        }
    }

    private func take() -> [AMQPDelivery] {
        buffer.withLock { all in
            let n = min(limit, all.count)
            let batch = Array(all.prefix(n))
            all.removeFirst(n)
            return batch
        }
    }
}
