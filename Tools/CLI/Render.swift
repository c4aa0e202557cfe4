import Foundation
import FrontDeskModel

/// The CLI's choice of presentation and colour for `ActivityRenderer`.
enum Render {
    /// The project's accent on a terminal, unless NO_COLOR is set.
    static var colour: Bool { stdoutIsTerminal && ProcessInfo.processInfo.environment["NO_COLOR"] == nil }

    /// One event of `dispatch`: the lock-screen presentation.
    static func line(_ v: LiveActivity) -> String {
        ActivityRenderer.render(v, .lockScreen, colour: colour) + "\n"
    }

    /// One event of `watch`: the expanded presentation on one line.
    static func watchLine(_ v: LiveActivity) -> String {
        ActivityRenderer.render(v, .expanded, colour: colour)
            .split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " · ")
    }
}
