import Foundation

/// Whole-word, case- and diacritic-insensitive phrase matching.
struct NormalizedText: Sendable {
    let words: [String]

    init(_ text: String) {
        words = Self.words(of: text)
    }

    /// "Zoë's AGM-agenda" → ["zoe", "s", "agm", "agenda"].
    static func words(of text: String) -> [String] {
        // Most input is ASCII: lower-case and split bytes directly, without
        // Foundation's folding, which costs far more.
        if text.utf8.allSatisfy({ $0 < 0x80 }) { return asciiWords(text) }
        let folded = text.folding(options: [.caseInsensitive, .diacriticInsensitive, .widthInsensitive], locale: Locale(identifier: "en_US_POSIX"))
        var words: [String] = []
        var current = ""
        for scalar in folded.unicodeScalars {
            if CharacterSet.alphanumerics.contains(scalar) {
                current.unicodeScalars.append(scalar)
            } else if !current.isEmpty {
                words.append(current)
                current = ""
            }
        }
        if !current.isEmpty { words.append(current) }
        return words
    }

    private static func asciiWords(_ text: String) -> [String] {
        var words: [String] = []
        var current: [UInt8] = []
        current.reserveCapacity(16)
        for b in text.utf8 {
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                current.append(b)
            case UInt8(ascii: "A")...UInt8(ascii: "Z"):
                current.append(b + 32)
            default:
                if !current.isEmpty {
                    words.append(String(decoding: current, as: UTF8.self))
                    current.removeAll(keepingCapacity: true)
                }
            }
        }
        if !current.isEmpty { words.append(String(decoding: current, as: UTF8.self)) }
        return words
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
