import Synchronization

/// Items gathered from several tasks and taken by one consumer in batches:
/// whatever arrived while the consumer was busy comes as the next batch (up
/// to `limit`), so batches grow under load and a lone item goes at once.
///
/// Inlinable, so that each service's `BatchQueue<Input>` is specialised
/// where it is used: compiled generically, every lock and batch looked up
/// its tuple and array metadata at run time (6–7% of the services' CPU
/// samples at 166/s passed through the queue). A waiting consumer is one
/// continuation kept under the lock, not an `AsyncStream` used as a signal.
public final class BatchQueue<Element: Sendable>: Sendable {
    @usableFromInline
    struct State {
        @usableFromInline var items: [Element] = []
        @usableFromInline var finished = false
        /// The consumer waiting in `next()`, resumed by the next item, `finish()` or its cancellation.
        @usableFromInline var waiter: UnsafeContinuation<Void, Never>?
        /// The consumer's task was cancelled before its continuation was kept: it must not wait.
        @usableFromInline var cancelledBeforeWaiting = false

        @usableFromInline init() {}

        /// The oldest `count` items (all of them with no copy, the usual case).
        @inlinable
        mutating func take(upTo count: Int) -> [Element] {
            if items.count <= count {
                var all: [Element] = []
                swap(&all, &items)
                return all
            }
            let batch = Array(items[..<count])
            items.removeFirst(count)
            return batch
        }
    }

    @usableFromInline let state = Mutex(State())
    public let limit: Int

    public init(limit: Int = .max) { self.limit = max(1, limit) }

    @inlinable
    public func yield(_ element: Element) {
        let waiter = state.withLock { s -> UnsafeContinuation<Void, Never>? in
            s.items.append(element)
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }

    /// No more items: `next()` returns what is left, then nil.
    @inlinable
    public func finish() {
        let waiter = state.withLock { s -> UnsafeContinuation<Void, Never>? in
            s.finished = true
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }

    /// The next batch (waiting for at least one item), or nil once finished
    /// and empty, or once the calling task is cancelled. One consumer at a time.
    @inlinable
    public func next() async -> [Element]? {
        while true {
            let taken = state.withLock { s in (batch: s.take(upTo: limit), finished: s.finished) }
            if !taken.batch.isEmpty { return taken.batch }
            if taken.finished || Task.isCancelled { return nil }
            await waitForItems()
        }
    }

    /// What has gathered now, oldest first, up to `count` items, without
    /// waiting: for a consumer that let its batch wait for more (`BatchLinger`).
    @inlinable
    public func takeAvailable(upTo count: Int) -> [Element] {
        guard count > 0 else { return [] }
        return state.withLock { $0.take(upTo: count) }
    }

    /// Returns once an item or the end has come, or the task is cancelled.
    @inlinable
    func waitForItems() async {
        await withTaskCancellationHandler {
            await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
                let goOn = state.withLock { s -> Bool in
                    if !s.items.isEmpty || s.finished || s.cancelledBeforeWaiting {
                        s.cancelledBeforeWaiting = false
                        return true
                    }
                    s.waiter = c
                    return false
                }
                if goOn { c.resume() }
            }
        } onCancel: {
            let waiter = state.withLock { s -> UnsafeContinuation<Void, Never>? in
                guard let w = s.waiter else {
                    s.cancelledBeforeWaiting = true
                    return nil
                }
                s.waiter = nil
                return w
            }
            waiter?.resume()
        }
    }
}
