@testable import AMQP
import Foundation
import Synchronization
import Testing

@Suite("Publishes waiting for confirms, and the C arena")
struct PendingWindowTests {
    /// A channel with `n` confirmed-mode publishes in one batch; returns the
    /// channel and the batch's results once it completes.
    private func channel(publishing n: Int) -> (ChannelState, PublishBatch, () -> [Result<Void, AMQPError>]?) {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        let batch = PublishBatch(count: n) { result in outcome = try? result.get() }
        batch.messages = (0..<n).map { OutboundMessage(exchange: "", routingKey: "q", body: Data("\($0)".utf8), mandatory: true) }
        let now = ContinuousClock.now
        for i in 0..<n { ch.pending.append(PendingPublish(batch: batch, index: i, publishedAt: now)) }
        return (ch, batch, { outcome })
    }

    private func succeeded(_ r: Result<Void, AMQPError>) -> Bool {
        if case .success = r { return true }
        return false
    }

    @Test("a batch completes once, with each message's first result in publish order, for one message or several")
    func batchResolvesOnceInOrder() {
        for n in [1, 3] {
            nonisolated(unsafe) var completions: [[Result<Void, AMQPError>]] = []
            let batch = PublishBatch(count: n) { result in if let r = try? result.get() { completions.append(r) } }
            let nack = AMQPError(.nacked, "nacked")
            // Out of order, with a repeat that must not count twice.
            for index in (0..<n).reversed() {
                batch.resolve(index, index == n - 1 ? .failure(nack) : .success(()))
                batch.resolve(index, .success(()))
                #expect(completions.isEmpty == (index > 0))
            }
            batch.resolve(0, .failure(nack))
            #expect(completions.count == 1)
            let failed = (completions.first ?? []).map { if case .failure = $0 { true } else { false } }
            #expect(failed == (0..<n).map { $0 == n - 1 })
        }
    }

    @Test func outOfOrderConfirmsLeaveHolesThatCloseFromTheFront() {
        let (ch, _, outcome) = channel(publishing: 40)  // past the ring's first 16 slots: it grows
        #expect(ch.pending.count == 40 && ch.pending.next == 41)
        ch.confirm(tag: 3, multiple: false, ack: true)
        ch.confirm(tag: 2, multiple: false, ack: false)
        #expect(ch.pending.lowest == 1 && ch.pending.count == 38)
        ch.confirm(tag: 1, multiple: false, ack: true)
        #expect(ch.pending.lowest == 4)
        ch.confirm(tag: 30, multiple: true, ack: true)
        #expect(ch.pending.lowest == 31 && ch.pending.count == 10)
        #expect(outcome() == nil)
        ch.confirm(tag: 40, multiple: true, ack: true)
        #expect(ch.pending.isEmpty && ch.pending.lowest == 41)
        let results = outcome() ?? []
        #expect(results.count == 40)
        #expect(results.enumerated().allSatisfy { i, r in succeeded(r) == (i != 1) })
    }

    @Test func theRingWrapsAroundAndGrowsWhileWrapped() {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var resolved = 0
        let batch = PublishBatch(count: 1000) { _ in }
        batch.messages = Array(repeating: OutboundMessage(exchange: "", routingKey: "q", body: Data()), count: 1000)
        let now = ContinuousClock.now
        var published = 0
        // Keep 10 waiting, confirm the oldest one by one: the head walks round the 16 slots.
        for _ in 0..<100 {
            ch.pending.append(PendingPublish(batch: batch, index: published, publishedAt: now))
            published += 1
            if ch.pending.count > 10 {
                ch.confirm(tag: ch.pending.lowest, multiple: false, ack: true)
                resolved += 1
            }
        }
        // Now grow past 16 while the head is mid-ring; order must survive.
        for _ in 0..<30 {
            ch.pending.append(PendingPublish(batch: batch, index: published, publishedAt: now))
            published += 1
        }
        #expect(ch.pending.count == 40)
        var seq = ch.pending.lowest
        var expectedIndex = published - 40
        while seq < ch.pending.next {
            #expect(ch.pending[seq]?.index == expectedIndex)
            seq += 1
            expectedIndex += 1
        }
        #expect(resolved == 90)
    }

    @Test func confirmsTheBrokerMadeUpChangeNothing() {
        let (ch, _, outcome) = channel(publishing: 3)
        ch.confirm(tag: 0, multiple: false, ack: true)
        ch.confirm(tag: 9, multiple: false, ack: true)
        ch.confirm(tag: 2, multiple: false, ack: true)
        ch.confirm(tag: 2, multiple: false, ack: true)  // twice
        #expect(ch.pending.count == 2)
        // A huge multiple tag covers only what waits, without walking to it.
        ch.confirm(tag: .max, multiple: true, ack: true)
        #expect(ch.pending.isEmpty)
        #expect(outcome()?.count == 3)
    }

    @Test("a window's confirms complete once: a later failure (its channel closing) neither calls `then` again nor changes the result")
    func confirmsCompleteOnce() async throws {
        let calls = Mutex<[Bool]>([])
        let confirms = PublishConfirms { result in calls.withLock { $0.append((try? result.get()) != nil) } }
        confirms.complete(.success([.success(())]))
        confirms.complete(.failure(AMQPError(.channelClosed, "closed after the confirm")))
        #expect(calls.withLock { $0 } == [true])
        let results = try await confirms.results()
        #expect(results.count == 1)
    }

    @Test func aReturnMarksTheEarliestMatchingMandatoryPublish() {
        let (ch, _, outcome) = channel(publishing: 3)
        let returned = ReturnedMessage(
            replyCode: 312, replyText: "NO_ROUTE", exchange: "", routingKey: "q", body: Data("1".utf8), properties: AMQPProperties())
        ch.markReturned(returned)
        ch.confirm(tag: 3, multiple: true, ack: true)
        let results = outcome() ?? []
        #expect(results.count == 3)
        #expect(succeeded(results[0]) && succeeded(results[2]))
        if case .failure(let e) = results[1] { #expect(e.code == .returned) } else { Issue.record("not returned") }
    }

    @Test func aMultipleConfirmOfTagZeroCoversEveryOutstandingPublish() {
        let (ch, _, outcome) = channel(publishing: 5)
        ch.confirm(tag: 0, multiple: false, ack: true)
        #expect(ch.pending.count == 5)
        ch.confirm(tag: 2, multiple: false, ack: true)
        ch.confirm(tag: 0, multiple: true, ack: false)
        #expect(ch.pending.isEmpty)
        let results = outcome() ?? []
        #expect(results.count == 5 && results.enumerated().allSatisfy { i, r in succeeded(r) == (i == 1) })
    }

    @Test func aReturnForABatchThatKeptNoMessagesChangesNothing() {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        let batch = PublishBatch(count: 2) { result in outcome = try? result.get() }
        for i in 0..<2 { ch.pending.append(PendingPublish(batch: batch, index: i, publishedAt: .now)) }
        ch.markReturned(ReturnedMessage(
            replyCode: 312, replyText: "NO_ROUTE", exchange: "", routingKey: "q", body: Data(), properties: AMQPProperties()))
        ch.confirm(tag: 2, multiple: true, ack: true)
        #expect(outcome?.allSatisfy(succeeded) == true)
    }

    @Test func theRingShrinksBackOnceABurstIsConfirmed() {
        let (ch, _, outcome) = channel(publishing: 10_000)
        #expect(ch.pending.capacity >= 10_000)
        ch.confirm(tag: 10_000, multiple: true, ack: true)
        #expect(outcome()?.count == 10_000)
        #expect(ch.pending.capacity == PendingWindow.initialSlots && ch.pending.next == 10_001)
        // It goes on numbering where it was.
        let (_, batch, _) = channel(publishing: 1)
        ch.pending.append(PendingPublish(batch: batch, index: 0, publishedAt: .now))
        #expect(ch.pending.lowest == 10_001 && ch.pending.count == 1)
    }

    /// Random appends, single and multiple acks (tags real and made up) and
    /// channel failures, checked against a dictionary after every step.
    @Test func theRingAgreesWithADictionaryUnderRandomConfirms() {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func random(_ n: UInt64) -> UInt64 {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17
            return state % n
        }
        var window = PendingWindow()
        var model: [UInt64: Int] = [:]
        var next: UInt64 = 1
        let batch = PublishBatch(count: 1_000_000) { _ in }
        for step in 0..<20_000 {
            switch random(10) {
            case 0..<5:
                window.append(PendingPublish(batch: batch, index: Int(next % 1_000_000), publishedAt: .now))
                model[next] = Int(next % 1_000_000)
                next += 1
            case 5..<8:
                let seq = next - min(next - 1, random(40))
                let removed = window.remove(seq)
                #expect(removed?.index == model.removeValue(forKey: seq), "step \(step): remove \(seq)")
            case 8:
                // A multiple confirm up to a tag, sometimes past what was published.
                let tag = random(4) == 0 ? next + random(1000) : next - min(next - 1, random(30))
                var seq = window.lowest
                while seq <= min(tag, window.next - 1) {
                    #expect(window.remove(seq)?.index == model.removeValue(forKey: seq), "step \(step): multiple \(tag)")
                    seq += 1
                }
            default:
                if random(50) == 0 {
                    let all = window.removeAll().map(\.index)
                    #expect(all == model.keys.sorted().map { model[$0]! }, "step \(step): removeAll")
                    model.removeAll()
                }
            }
            #expect(window.count == model.count && window.next == next, "step \(step)")
            #expect(window.isEmpty || model[window.lowest] != nil, "step \(step): the lowest waits")
        }
    }

    @Test func failingTheChannelFailsEveryWaitingPublishOnce() {
        let (ch, _, outcome) = channel(publishing: 20)
        ch.confirm(tag: 5, multiple: false, ack: true)
        ch.fail(AMQPError(.channelClosed, "gone"))
        #expect(ch.pending.isEmpty && ch.pending.next == 21)
        let results = outcome() ?? []
        #expect(results.count == 20)
        #expect(results.enumerated().allSatisfy { i, r in succeeded(r) == (i == 4) })
    }

    @Test func overdueConfirmsExpireOldestFirstAndStopAtAFreshOne() {
        let ch = ChannelState(id: 1, epoch: 1)
        nonisolated(unsafe) var outcome: [Result<Void, AMQPError>]?
        let batch = PublishBatch(count: 3) { outcome = try? $0.get() }
        batch.messages = Array(repeating: OutboundMessage(exchange: "", routingKey: "q", body: Data()), count: 3)
        let start = ContinuousClock.now
        ch.pending.append(PendingPublish(batch: batch, index: 0, publishedAt: start))
        ch.pending.append(PendingPublish(batch: batch, index: 1, publishedAt: start))
        ch.pending.append(PendingPublish(batch: batch, index: 2, publishedAt: start + .seconds(10)))
        ch.expireConfirms(olderThan: .seconds(5), now: start + .seconds(6))
        #expect(ch.pending.count == 1 && ch.pending.lowest == 3)
        ch.confirm(tag: 3, multiple: false, ack: true)
        let results = outcome ?? []
        #expect(results.count == 3 && !succeeded(results[0]) && !succeeded(results[1]) && succeeded(results[2]))
    }

    @Test func theArenaKeepsPiecesApartAlignedAndIntactAcrossChunksAndResets() {
        let arena = CArena()
        for round in 0..<3 {
            var pieces: [(amqp: (Int, UnsafeMutableRawPointer), byte: UInt8)] = []
            // Small pieces over several 8 KiB chunks, and a few large ones.
            for i in 0..<600 {
                let size = i % 50 == 0 ? 5000 : 1 + i % 97
                let p = arena.allocate(size)
                #expect(Int(bitPattern: p) % 16 == 0)
                let byte = UInt8(truncatingIfNeeded: i &+ round)
                p.initializeMemory(as: UInt8.self, repeating: byte, count: size)
                pieces.append(((size, p), byte))
            }
            for ((size, p), byte) in pieces {
                let bytes = UnsafeRawBufferPointer(start: p, count: size)
                #expect(bytes.allSatisfy { $0 == byte })
            }
            let text = arena.bytes("routing.key.\(round)")
            #expect(text.string == "routing.key.\(round)")
            arena.reset()
        }
    }
}
