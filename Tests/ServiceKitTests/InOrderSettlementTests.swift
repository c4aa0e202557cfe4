import Foundation
import ServiceKit
import Synchronization
import Testing

@Suite("InOrderSettlement")
struct InOrderSettlementTests {
    /// What ran, in order.
    final class Journal: Sendable {
        private let entries = Mutex<[String]>([])
        func note(_ s: String) { entries.withLock { $0.append(s) } }
        var all: [String] { entries.withLock { $0 } }
    }

    @Test(arguments: [
        [0, 1, 2, 3],
        [3, 2, 1, 0],
        [1, 3, 0, 2],
        [2, 0, 3, 1],
    ])
    func workRunsInIssueOrderWhateverTheCompletionOrder(_ completionOrder: [Int]) async {
        let settlement = InOrderSettlement()
        let journal = Journal()
        let numbers = (0..<4).map { _ in settlement.issue() }
        #expect(numbers == [0, 1, 2, 3])
        for i in completionOrder {
            settlement.complete(UInt64(i), .now { journal.note("\(i)") })
        }
        await settlement.idle()
        #expect(journal.all == ["0", "1", "2", "3"])
    }

    @Test func headWorkRunsOnTheCompletingCallAndLaterWorkWaitsForTheHead() {
        let settlement = InOrderSettlement()
        let journal = Journal()
        let first = settlement.issue(), second = settlement.issue()
        settlement.complete(second, .now { journal.note("second") })
        #expect(journal.all.isEmpty, "the second item settled before the first")
        settlement.complete(first, .now { journal.note("first") })
        // Both ran inside `complete`: no task in between.
        #expect(journal.all == ["first", "second"])
    }

    @Test func workThatWaitsHoldsBackLaterItems() async {
        let settlement = InOrderSettlement()
        let journal = Journal()
        let (gate, open) = AsyncStream<Void>.makeStream()
        let slow = settlement.issue(), quick = settlement.issue()
        settlement.complete(slow, .later {
            for await _ in gate {}
            journal.note("slow")
        })
        settlement.complete(quick, .now { journal.note("quick") })
        try? await Task.sleep(for: .milliseconds(50))
        #expect(journal.all.isEmpty, "the quick item overtook the one that waits")
        open.finish()
        await settlement.idle()
        #expect(journal.all == ["slow", "quick"])
    }

    @Test func idleWaitsForEveryIssuedItem() async {
        let settlement = InOrderSettlement()
        let journal = Journal()
        let pending = settlement.issue()
        let waiter = Task {
            await settlement.idle()
            journal.note("idle")
        }
        try? await Task.sleep(for: .milliseconds(50))
        #expect(journal.all.isEmpty, "idle returned with an item outstanding")
        settlement.complete(pending, .now { journal.note("settled") })
        await waiter.value
        #expect(journal.all == ["settled", "idle"])
        // Nothing issued: idle at once.
        await InOrderSettlement().idle()
    }

    @Test func manyThreadsCompletingAtOnceStillSettleInOrder() async {
        let settlement = InOrderSettlement()
        let journal = Journal()
        let numbers = (0..<2000).map { _ in settlement.issue() }
        await withTaskGroup(of: Void.self) { group in
            for n in numbers.shuffled() {
                group.addTask { settlement.complete(n, .now { journal.note("\(n)") }) }
            }
        }
        await settlement.idle()
        let settled = journal.all
        #expect(settled.count == numbers.count)
        let inOrder = settled == numbers.map { "\($0)" }
        #expect(inOrder, "items settled out of issue order")
    }
}
