import Foundation

/// Whole-word, case- and diacritic-insensitive phrase matching.
struct NormalizedText: Sendable {
    let words: [String]

    init(_ text: String) {
        words = Self.words(of: text)
    }

    /// "Zoë's AGM-agenda" → ["zoe", "s", "agm", "agenda"]: lower case,
    /// without diacritics, compatibility forms folded ("ｆｕｌｌ" → "full"),
    /// split on anything that is not a letter or a digit. ASCII takes a fast
    /// path; other scalars are folded one by one.
    static func words(of text: String) -> [String] {
        var words: [String] = []
        scan(text) { word, _ in words.append(word) }
        return words
    }

    /// The words of `text` and where each begins (its first scalar).
    static func wordsWithStarts(of text: String) -> (words: [String], starts: [String.Index]) {
        var words: [String] = [], starts: [String.Index] = []
        scan(text) { word, start in
            words.append(word)
            starts.append(start)
        }
        return (words, starts)
    }

    /// Calls `found` with each word and the index of its first scalar, in order.
    @inline(__always)
    private static func scan(_ text: String, _ found: (String, String.Index) -> Void) {
        // The current word as UTF-8: appending bytes is far cheaper than
        // appending scalars to a string, and short words stay small strings.
        var current: [UInt8] = []
        current.reserveCapacity(32)
        let scalars = text.unicodeScalars
        var start = scalars.startIndex
        func flush() {
            if !current.isEmpty {
                found(String(decoding: current, as: UTF8.self), start)
                current.removeAll(keepingCapacity: true)
            }
        }
        var i = scalars.startIndex
        while i < scalars.endIndex {
            let scalar = scalars[i]
            defer { scalars.formIndex(after: &i) }
            if scalar.isASCII {
                switch scalar.value {
                case 0x61...0x7A, 0x30...0x39:
                    if current.isEmpty { start = i }
                    current.append(UInt8(scalar.value))
                case 0x41...0x5A:
                    if current.isEmpty { start = i }
                    current.append(UInt8(scalar.value + 32))
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
            if current.isEmpty { start = i }
            for folded in String(scalar).decomposedStringWithCompatibilityMapping.unicodeScalars
            where !isMark(folded.properties.generalCategory) {
                // Case folding, not just lower case: "ß" matches "ss".
                let lower = folded.value == 0xDF ? "ss" : folded.properties.lowercaseMapping
                current.append(contentsOf: lower.utf8)
            }
        }
        flush()
    }

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
