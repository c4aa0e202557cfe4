import Foundation

/// Whole-word, case- and diacritic-insensitive phrase matching.
struct NormalizedText: Sendable {
    let words: [String]

    init(_ text: String) {
        words = Self.words(of: text)
    }

    /// "Zoë's AGM-agenda" → ["zoe", "s", "agm", "agenda"].
    static func words(of text: String) -> [String] {
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
