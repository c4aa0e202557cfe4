/// The Live Activity as text, for a terminal: each presentation of the seed
/// screen. Pure; colour (the project's accent, 24-bit) is the caller's choice.
public enum ActivityRenderer {
    public enum Presentation: String, Sendable, CaseIterable {
        /// Glyph in its accent square and the 3 step bars.
        case compact
        /// Title, route, status with step, elapsed and ETA.
        case expanded
        /// Expanded plus the input echo, the rolling preview, Cancel and Open.
        case lockScreen
    }

    public static func render(_ v: LiveActivity, _ presentation: Presentation, colour: Bool = false) -> String {
        let compact = "\(glyph(v, colour: colour)) \(bars(v))"
        guard presentation != .compact else { return compact }
        var lines = ["\(compact)  \(v.title)"]
        if let route = v.routeLine { lines.append("    \(route)") }
        if presentation == .lockScreen { lines.append("    ┃ \(v.input)") }
        lines.append("    \(v.statusLine)")
        if let guess = v.bestGuess {
            lines.append("    \(guess)   Edit ›")
        }
        if presentation == .lockScreen {
            for line in v.preview { lines.append("    │ \(line)") }
        }
        var footer = "    \(v.elapsed)" + (v.eta.map { " \($0)" + (presentation == .lockScreen ? " left" : "") } ?? "")
        if let f = v.footer { footer += " · \(f)" }
        if presentation == .lockScreen { footer += v.canCancel ? "   [Cancel]  Open ›" : "   Open ›" }
        lines.append(footer)
        return lines.joined(separator: "\n")
    }

    static func bars(_ v: LiveActivity) -> String {
        v.bars.map { bar in
            switch bar {
            case .done: "■"
            case .current: "▣"
            case .pending: "□"
            }
        }.joined()
    }

    static func glyph(_ v: LiveActivity, colour: Bool) -> String {
        let text = "[\(v.glyph ?? "··")]"
        guard colour, !v.isQueued, let accent = v.accent, let rgb = hex(accent) else { return text }
        return "\u{1B}[1;38;2;\(rgb.0);\(rgb.1);\(rgb.2)m\(text)\u{1B}[0m"
    }

    static func hex(_ s: String) -> (Int, Int, Int)? {
        let digits = s.hasPrefix("#") ? String(s.dropFirst()) : s
        guard digits.count == 6, let n = Int(digits, radix: 16) else { return nil }
        return (n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF)
    }
}
