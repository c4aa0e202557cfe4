import Foundation

/// Whole-word, case- and diacritic-insensitive phrase matching.
struct NormalizedText: Sendable {
    let words: [String]

    /// `longest`: the most bytes a word that can match anything has (the
    /// longest word of the routing table); a longer word is read as `overlong`.
    init(_ text: String, longest: Int = .max) {
        words = Self.words(of: text, longest: longest)
    }

    /// Words already read (`words(of:)` or `wordsWithStarts(of:)`).
    init(words: [String]) {
        self.words = words
    }

    /// What a word longer than `longest` bytes reads as: no folded word is
    /// it (a space is no letter), so it matches nothing and still stands
    /// between its neighbours. ASCII, so that looking it up is cheap.
    static let overlong = " "

    /// "Zoë's AGM-agenda" → ["zoe", "s", "agm", "agenda"]: lower case,
    /// without diacritics, compatibility forms folded ("ｆｕｌｌ" → "full"),
    /// split on anything that is not a letter or a digit. ASCII takes a fast
    /// path; other scalars are folded a word's run at a time.
    static func words(of text: String, longest: Int = .max) -> [String] {
        var words: [String] = []
        scan(text, longest: longest) { word, _ in words.append(word) }
        return words
    }

    /// The words of `text` and where each begins (its first scalar).
    static func wordsWithStarts(of text: String, longest: Int = .max) -> (words: [String], starts: [String.Index]) {
        var words: [String] = [], starts: [String.Index] = []
        scan(text, longest: longest) { word, start in
            words.append(word)
            starts.append(start)
        }
        return (words, starts)
    }

    /// Calls `found` with each word and the index of its first scalar, in order.
    @inline(__always)
    private static func scan(_ text: String, longest: Int, _ found: (String, String.Index) -> Void) {
        // The current word as UTF-8: appending bytes is far cheaper than
        // appending scalars to a string, and short words stay small strings.
        var current: [UInt8] = []
        current.reserveCapacity(32)
        // A word's letters from its first one beyond ASCII on, folded a run
        // at a time (up to `chunk` scalars): folding scalar by scalar cost up
        // to 7 µs each (a request of 4,000 of them took 10 ms or more to
        // route, and the router plans a batch of 256 at a time). Folding a
        // run gives the letters folding each would: decompositions map scalar
        // by scalar, and only marks, which are dropped, are reordered. A run
        // seen before in this text is not folded again.
        var pending = String.UnicodeScalarView()
        var pendingCount = 0
        var folds: [String: [UInt8]] = [:]
        var foldsOfLetters: [UInt32: [UInt8]] = [:]
        // Past `longest` bytes a word can match nothing: the rest of it is
        // only read for where it ends (a long word of letters that fold to
        // many, such as U+FDFA's 18, cost more than folding them all).
        var overlong = false
        var inWord = false
        let scalars = text.unicodeScalars
        var start = scalars.startIndex
        func checkLength() {
            if current.count > longest {
                overlong = true
                current.removeAll(keepingCapacity: true)
            }
        }
        func foldPending() {
            guard !pending.isEmpty else { return }
            defer {
                pending.removeAll(keepingCapacity: true)
                pendingCount = 0
            }
            // Every letter folds to at least one byte.
            if overlong || current.count + pendingCount > longest {
                overlong = true
                current.removeAll(keepingCapacity: true)
                return
            }
            // A lone letter is looked up by its value (hashing a string
            // beyond ASCII normalises it first: nearly a fold's cost).
            let lone = pendingCount == 1 ? pending.first?.value : nil
            let run = lone == nil ? String(pending) : ""
            if let bytes = lone.map({ foldsOfLetters[$0] }) ?? folds[run] {
                current.append(contentsOf: bytes)
            } else {
                let run = lone == nil ? run : String(pending)
                let before = current.count
                for folded in run.decomposedStringWithCompatibilityMapping.unicodeScalars {
                    if folded.isASCII {
                        let v = UInt8(folded.value)
                        current.append(v >= 0x41 && v <= 0x5A ? v + 32 : v)
                        continue
                    }
                    let properties = folded.properties
                    if isMark(properties.generalCategory) { continue }
                    // Case folding, not just lower case: "ß" matches "ss".
                    if folded.value == 0xDF {
                        current.append(contentsOf: "ss".utf8)
                    } else if properties.changesWhenLowercased {
                        current.append(contentsOf: properties.lowercaseMapping.utf8)
                    } else {
                        // Most letters are their own lower case: no string made for them.
                        UTF8.encode(folded) { current.append($0) }
                    }
                }
                if let lone, foldsOfLetters.count < Self.maxFolds {
                    foldsOfLetters[lone] = Array(current[before...])
                } else if lone == nil, folds.count < Self.maxFolds {
                    folds[run] = Array(current[before...])
                }
            }
            checkLength()
        }
        func flush() {
            foldPending()
            if overlong {
                found(Self.overlong, start)
            } else if !current.isEmpty {
                found(String(decoding: current, as: UTF8.self), start)
            }
            current.removeAll(keepingCapacity: true)
            overlong = false
            inWord = false
        }
        var i = scalars.startIndex
        while i < scalars.endIndex {
            let scalar = scalars[i]
            defer { scalars.formIndex(after: &i) }
            if scalar.isASCII {
                switch scalar.value {
                case 0x61...0x7A, 0x30...0x39, 0x41...0x5A:
                    if !inWord {
                        start = i
                        inWord = true
                    }
                    if overlong { continue }
                    if !pending.isEmpty {
                        pending.append(scalar)  // within a run: folded with it, in order
                        pendingCount += 1
                        if pendingCount >= Self.chunk { foldPending() }
                    } else {
                        current.append(UInt8(scalar.value) | (scalar.value <= 0x5A && scalar.value >= 0x41 ? 0x20 : 0))
                        checkLength()
                    }
                default: flush()
                }
                continue
            }
            let properties = scalar.properties
            if isMark(properties.generalCategory) {
                continue  // a combining accent: part of the word, dropped
            }
            guard properties.isAlphabetic || properties.numericType != nil else {
                flush()
                continue
            }
            if !inWord {
                start = i
                inWord = true
            }
            if overlong { continue }
            pending.append(scalar)
            pendingCount += 1
            if pendingCount >= Self.chunk { foldPending() }
        }
        flush()
    }

    /// The most scalars folded in one call.
    static let chunk = 64
    /// The most distinct runs one text keeps the folds of.
    static let maxFolds = 512

    private static func isMark(_ category: Unicode.GeneralCategory) -> Bool {
        category == .nonspacingMark || category == .spacingMark || category == .enclosingMark
    }

    /// True when `phrase` occurs at one of `starts` (where its first word stands).
    func matches(_ phrase: [String], startingAtAnyOf starts: [Int]) -> Bool {
        starts.contains { start in
            start + phrase.count <= words.count && phrase.indices.dropFirst().allSatisfy { words[start + $0] == phrase[$0] }
        }
    }

    /// True when `phrase` (already split into words) occurs as consecutive whole words.
    func contains(_ phrase: [String]) -> Bool {
        guard !phrase.isEmpty, phrase.count <= words.count else { return false }
        outer: for start in 0...(words.count - phrase.count) {
            for (i, w) in phrase.enumerated() where words[start + i] != w { continue outer }
            return true
        }
        return false
    }
}
