import Foundation
@testable import FrontDeskModel
import Testing

@Suite("Routing table loading")
struct RoutingTableTests {
    @Test func exampleTableLoadsAndHasTheSeedRoute() throws {
        let table = try RoutingTable.example()
        let (p, t) = try #require(table.target(.init(project: "yemaya", target: "board-prep")))
        #expect(p.name == "Yemaya" && p.glyph == "YE" && p.accent == "#6E56CF")
        #expect(t.name == "Board Prep")
        #expect(table.defaultRoute?.description == "yemaya/board-prep")
        #expect(table.project("home")?.glyph == "HM")
        #expect(table.project("acme")?.glyph == "AC")
    }

    @Test(arguments: [("Yemaya", "YE"), ("Acme Corp", "AC"), ("Zoë", "ZO"), ("board of trustees", "BO"), ("x", "X"), ("", "")])
    func glyphs(_ name: String, _ glyph: String) {
        #expect(RoutingTable.glyph(for: name) == glyph)
    }

    @Test(arguments: [
        (#"{"projects":[{"id":"Bad","targets":[{"id":"t"}]}]}"#, "project id 'Bad'"),
        (#"{"projects":[{"id":"a.b","targets":[{"id":"t"}]}]}"#, "project id 'a.b'"),
        (#"{"projects":[{"id":"-a","targets":[{"id":"t"}]}]}"#, "project id '-a'"),
        (#"{"projects":[{"id":"a","targets":[{"id":"t#"}]}]}"#, "target id 't#'"),
        (#"{"projects":[{"id":"a","targets":[{"id":"t"}]},{"id":"a","targets":[{"id":"u"}]}]}"#, "project id 'a' appears twice"),
        (#"{"projects":[{"id":"a","targets":[{"id":"t"},{"id":"t"}]}]}"#, "target id 't' appears twice in project 'a'"),
        (#"{"projects":[{"id":"a","targets":[]}]}"#, "project 'a' has no target"),
        (#"{"projects":[{"id":"a"}]}"#, "project 'a' has no target"),
        (#"{"projects":[]}"#, "no projects"),
        (#"{}"#, "no projects"),
        (#"{"projects":[{"id":"a","targets":[{"id":"t"}]}],"default":{"project":"a","target":"x"}}"#, "default route a/x"),
        (#"{"projects":[{"targets":[{"id":"t"}]}]}"#, "lacks 'id'"),
        (#"{"projects":"x"}"#, "wrong type"),
        ("not json", "not valid JSON"),
    ])
    func badTablesNameTheProblem(_ json: String, _ mentions: String) {
        #expect {
            _ = try RoutingTable(json: Data(json.utf8))
        } throws: { "\($0)".contains(mentions) }
    }

    @Test func idRules() {
        #expect(Identifiers.isValidTableID("board-prep"))
        #expect(Identifiers.isValidTableID(String(repeating: "a", count: 63)))
        #expect(!Identifiers.isValidTableID(String(repeating: "a", count: 64)))
        #expect(!Identifiers.isValidTableID(""))
        #expect(Identifiers.isValidDispatchID("0b7e6a1e-3f7a-4f7e-9a53-8d2d2a7e5c11"))
        #expect(Identifiers.isValidDispatchID("a.b_c:d-E"))
        #expect(!Identifiers.isValidDispatchID("a#b"))
        #expect(!Identifiers.isValidDispatchID("a*b"))
        #expect(!Identifiers.isValidDispatchID("a b"))
        #expect(!Identifiers.isValidDispatchID(""))
        #expect(!Identifiers.isValidDispatchID(String(repeating: "x", count: 129)))
    }
}
