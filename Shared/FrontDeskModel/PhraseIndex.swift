/// Every scorable phrase of a routing table, indexed by its first word, with
/// words interned as small integers: scoring an input looks up each of its
/// words once and then compares integers, with no reference counting in the
/// inner loop. One-word phrases (most keywords) need no comparison at all:
/// their targets are copied as a run. Built once per table.
struct PhraseIndex: Sendable {
    /// A phrase of two or more words: the words after its first are in `rest`.
    struct Phrase: Sendable {
        var target: Int32
        var restStart: Int32
        var restCount: Int32
    }

    /// A list per first-word id, stored flat: list `w` is
    /// `items[offsets[w]..<offsets[w + 1]]`.
    struct Lists<Item: Sendable>: Sendable {
        let offsets: [Int32]
        let items: [Item]

        init(_ lists: [[Item]]) {
            var offsets: [Int32] = [0]
            for list in lists { offsets.append(offsets[offsets.count - 1] + Int32(list.count)) }
            self.offsets = offsets
            self.items = lists.flatMap { $0 }
        }

        subscript(word: Int) -> ArraySlice<Item> { items[Int(offsets[word])..<Int(offsets[word + 1])] }
    }

    private let wordIDs: [String: Int32]
    /// The target of every one-word phrase, by its word.
    private let singles: Lists<Int32>
    /// Longer phrases, by their first word.
    private let longer: Lists<Phrase>
    private let rest: [Int32]

    /// `phrases[t]` are target `t`'s phrases, each already split into words.
    init(phrases: [[[String]]]) {
        var wordIDs: [String: Int32] = [:]
        func id(_ word: String) -> Int32 {
            if let id = wordIDs[word] { return id }
            let id = Int32(wordIDs.count)
            wordIDs[word] = id
            return id
        }
        var singles: [[Int32]] = [], longer: [[Phrase]] = [], rest: [Int32] = []
        for (t, targetPhrases) in phrases.enumerated() {
            for words in targetPhrases where !words.isEmpty {
                let first = Int(id(words[0]))
                while singles.count <= first {
                    singles.append([])
                    longer.append([])
                }
                if words.count == 1 {
                    singles[first].append(Int32(t))
                    continue
                }
                let start = Int32(rest.count)
                rest += words.dropFirst().map(id)
                longer[first].append(Phrase(target: Int32(t), restStart: start, restCount: Int32(words.count - 1)))
            }
        }
        // Words that only ever follow another get empty lists.
        while singles.count < wordIDs.count {
            singles.append([])
            longer.append([])
        }
        self.wordIDs = wordIDs
        self.singles = Lists(singles)
        self.longer = Lists(longer)
        self.rest = rest
    }

    /// The target of every phrase found in `words` as consecutive whole
    /// words, once per phrase (a target with two matching phrases appears
    /// twice), in no particular order.
    func matches(in words: [String]) -> [Int32] {
        let ids = words.map { wordIDs[$0] ?? -1 }
        // Positions grouped by word, so that a phrase whose first word occurs
        // twice is still counted once.
        let starts = ids.indices.filter { ids[$0] >= 0 }.sorted { (ids[$0], $0) < (ids[$1], $1) }
        var hits: [Int32] = []
        var g = 0
        while g < starts.count {
            let word = Int(ids[starts[g]])
            var end = g + 1
            while end < starts.count, ids[starts[end]] == word { end += 1 }
            hits.append(contentsOf: singles[word])
            let positions = starts[g..<end]
            rest.withUnsafeBufferPointer { rest in
                ids.withUnsafeBufferPointer { ids in
                    for phrase in longer[word] where positions.contains(where: { Self.phrase(phrase, follows: $0, in: ids, rest: rest) }) {
                        hits.append(phrase.target)
                    }
                }
            }
            g = end
        }
        return hits
    }

    private static func phrase(
        _ p: Phrase, follows position: Int, in ids: UnsafeBufferPointer<Int32>, rest: UnsafeBufferPointer<Int32>
    ) -> Bool {
        let count = Int(p.restCount), start = Int(p.restStart)
        guard position + count < ids.count else { return false }
        for k in 0..<count where ids[position + 1 + k] != rest[start + k] { return false }
        return true
    }
}
