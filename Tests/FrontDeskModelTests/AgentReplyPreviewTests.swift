import Foundation
import FrontDeskModel
import Testing

@Suite("Reply preview")
struct AgentReplyPreviewTests {
    /// The first, plainly right implementation: the fast one must agree with it.
    func reference(_ text: String) -> [String] {
        Array(text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }.suffix(3))
    }

    static let texts = [
        "", "\n", "\n\n\r\n", "one line", "  padded \t ", "a\nb\nc\nd\ne",
        "Hi Lisa,\r\nConfirmed for 14:00.\r\n\r\nThe agenda is attached.\r\n",
        "tail without newline\n\n   \n  last  ", "\u{00A0}nbsp\u{00A0}\nideographic\u{3000}space\u{3000}",
        "line\u{2028}separator\u{2029}paragraph\u{0085}next\u{000B}vt\u{000C}ff",
        "Zoë — ✓ 👩🏽‍💻\ncafe\u{301}\n  \u{1F600}  ", "\t\t\n\t x \t\n",
        String(repeating: "a long line of text ", count: 400) + "\nend",
    ]

    @Test(arguments: texts)
    func matchesTheReference(_ text: String) {
        #expect(AgentReply.preview(of: text) == reference(text))
    }
}
