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
    /// it (folding never makes a NUL), so it matches nothing and still
    /// stands between its neighbours. ASCII, so that looking it up is cheap.
    static let overlong = "\u{0}"

    /// "Zoë's AGM-agenda" → ["zoe", "s", "agm", "agenda"]: lower case,
    /// without diacritics, compatibility forms folded ("ｆｕｌｌ" → "full"),
    /// split on anything that is not a letter or a digit. ASCII takes a fast
    /// path; other scalars are folded one by one, each once per text.
    /// `maxWords`: reading stops after that many words, and one more
    /// `overlong` stands for the rest (for a name, which has no more).
    static func words(of text: String, longest: Int = .max, maxWords: Int = .max) -> [String] {
        var words: [String] = []
        scan(text, longest: longest) { word, _ in
            guard words.count < maxWords else {
                words.append(overlong)
                return false
            }
            words.append(word)
            return true
        }
        return words
    }

    /// The words of `text` and where each begins (its first scalar).
    static func wordsWithStarts(of text: String, longest: Int = .max) -> (words: [String], starts: [String.Index]) {
        var words: [String] = [], starts: [String.Index] = []
        scan(text, longest: longest) { word, start in
            words.append(word)
            starts.append(start)
            return true
        }
        return (words, starts)
    }

    /// Calls `found` with each word and the index of its first scalar, in
    /// order, until it returns false.
    @inline(__always)
    private static func scan(_ text: String, longest: Int, _ found: (String, String.Index) -> Bool) {
        // The current word as UTF-8: appending bytes is far cheaper than
        // appending scalars to a string, and short words stay small strings.
        var current: [UInt8] = []
        current.reserveCapacity(32)
        // Each letter beyond ASCII is folded once per text and its bytes kept
        // by its value: folding costs 1–7 µs a scalar, and a request of 4,000
        // took 10 ms or more to route when each was folded again (the router
        // plans a batch of 256 at a time).
        var folds: [UInt32: [UInt8]] = [:]
        // Past `longest` bytes a word can match nothing: the rest of it is
        // only read for where it ends.
        var overlong = false
        var inWord = false
        var going = true
        let scalars = text.unicodeScalars
        var start = scalars.startIndex
        func flush() {
            if overlong {
                going = found(Self.overlong, start)
            } else if !current.isEmpty {
                going = found(String(decoding: current, as: UTF8.self), start)
            }
            current.removeAll(keepingCapacity: true)
            overlong = false
            inWord = false
        }
        var i = scalars.startIndex
        while going, i < scalars.endIndex {
            let scalar = scalars[i]
            defer { scalars.formIndex(after: &i) }
            if scalar.isASCII {
                switch scalar.value {
                case 0x61...0x7A, 0x30...0x39, 0x41...0x5A:
                    if !inWord {
                        start = i
                        inWord = true
                    }
                    guard !overlong else { continue }
                    current.append(UInt8(scalar.value) | (scalar.value <= 0x5A && scalar.value >= 0x41 ? 0x20 : 0))
                default:
                    flush()
                    continue
                }
            } else {
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
                guard !overlong else { continue }
                if let bytes = folds[scalar.value] {
                    current.append(contentsOf: bytes)
                } else {
                    let bytes = fold(scalar)
                    if folds.count < Self.maxFolds { folds[scalar.value] = bytes }
                    current.append(contentsOf: bytes)
                }
            }
            if current.count > longest {
                overlong = true
                current.removeAll(keepingCapacity: true)
            }
        }
        if going { flush() }
    }

    /// A letter or digit beyond ASCII, folded: its compatibility
    /// decomposition without marks, in lower case ("ß" as "ss").
    private static func fold(_ scalar: Unicode.Scalar) -> [UInt8] {
        var bytes: [UInt8] = []
        for folded in String(scalar).decomposedStringWithCompatibilityMapping.unicodeScalars {
            if folded.isASCII {
                let v = UInt8(folded.value)
                bytes.append(v >= 0x41 && v <= 0x5A ? v + 32 : v)
                continue
            }
            let properties = folded.properties
            if isMark(properties.generalCategory) { continue }
            // Case folding, not just lower case: "ß" and "ẞ" match "ss", a
            // final sigma "σ" (lower case alone leaves "ΟΔΟΣ" and "οδος" apart).
            if folded.value == 0xDF || folded.value == 0x1E9E {
                bytes.append(contentsOf: "ss".utf8)
            } else if folded.value == 0x3C2 {
                bytes.append(contentsOf: "σ".utf8)
            } else if properties.changesWhenLowercased {
                bytes.append(contentsOf: properties.lowercaseMapping.utf8)
            } else {
                // Most letters are their own lower case: no string made for them.
                UTF8.encode(folded) { bytes.append($0) }
            }
        }
        return bytes
    }

    /// The most distinct letters one text keeps the folds of (an input has
    /// at most 4,000 code points).
    static let maxFolds = 8192

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
