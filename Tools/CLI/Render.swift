import Foundation
import FrontDeskModel

/// Plain lines from the Live Activity view model: one line an event, with
/// the project's accent colour on a terminal that takes colour (NO_COLOR
/// turns it off).
enum Render {
    static var colour: Bool { stdoutIsTerminal && ProcessInfo.processInfo.environment["NO_COLOR"] == nil }

    static func line(_ v: LiveActivity) -> String {
        let bars = v.bars.map { bar -> String in
            switch bar {
            case .done: "■"
            case .current: "▣"
            case .pending: "□"
            }
        }.joined()
        var glyph = v.glyph.map { "[\($0)]" } ?? "[··]"
        if colour, let rgb = v.accent.flatMap(parseHex) {
            glyph = "\u{1B}[38;2;\(rgb.0);\(rgb.1);\(rgb.2)m\(glyph)\u{1B}[0m"
        }
        var parts = ["\(glyph) \(bars)", v.title]
        if let route = v.routeLine { parts.append(route) }
        parts.append(v.statusLine)
        parts.append(v.elapsed + (v.eta.map { " \($0) left" } ?? ""))
        var out = parts.joined(separator: " · ")
        if let guess = v.bestGuess { out += "\n    \(guess)  Edit ›  — \(v.footer ?? "")" }
        for line in v.preview { out += "\n    │ \(line)" }
        return out
    }

    static func parseHex(_ s: String) -> (Int, Int, Int)? {
        let hex = s.hasPrefix("#") ? String(s.dropFirst()) : s
        guard hex.count == 6, let n = Int(hex, radix: 16) else { return nil }
        return (n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF)
    }
}
