import Foundation
@testable import FrontDeskModel
import Testing

let testTableJSON = """
{
  "projects": [
    {"id": "yemaya", "name": "Yemaya", "accent": "#6E56CF", "aliases": ["yem"],
     "targets": [
       {"id": "board-prep", "name": "Board Prep", "keywords": ["agm", "agenda", "board", "minutes"], "contacts": ["Lisa"]},
       {"id": "fundraising", "name": "Fundraising", "keywords": ["donor", "grant", "gala"], "contacts": ["Marcus"]}
     ]},
    {"id": "acme", "name": "Acme Corp", "aliases": ["acme co"],
     "targets": [
       {"id": "ops", "name": "Ops", "keywords": ["invoice", "on call", "agenda"], "contacts": ["Priya"]},
       {"id": "legal", "name": "Legal", "keywords": ["contract", "nda", "due diligence"], "contacts": ["Zoë", "José"]}
     ]},
    {"id": "home", "name": "Home", "glyph": "HM",
     "targets": [{"id": "family", "name": "Family", "keywords": ["dinner", "agm"], "contacts": ["Mum"]}]}
  ],
  "default": {"project": "yemaya", "target": "board-prep"}
}
"""

let resolver = RouteResolver(table: try! RoutingTable(json: Data(testTableJSON.utf8)))

struct ResolveCase: Sendable, CustomTestStringConvertible {
    var input: String
    var project: String? = nil
    var target: String? = nil
    /// "project/target", or "!code" for a failure.
    var expected: String
    var source: RouteResolution.Source? = nil
    var testDescription: String { "\(input) [\(project ?? "-")/\(target ?? "-")] → \(expected)" }
}

@Suite("Route resolution")
struct RouteResolverTests {
    static let cases: [ResolveCase] = [
        // 1. Hints: confidence 1.0, no guessing.
        .init(input: "anything", project: "acme", target: "legal", expected: "acme/legal", source: .hint),
        .init(input: "anything", project: "Acme Corp", target: "Legal", expected: "acme/legal", source: .hint),
        .init(input: "anything", target: "legal", expected: "acme/legal", source: .hint),
        .init(input: "sign the nda", project: "acme", expected: "acme/legal", source: .hint),
        .init(input: "nothing that scores", project: "acme", expected: "acme/ops", source: .hint),
        .init(input: "agm agenda", project: "nope", target: "legal", expected: "!unknown_target"),
        .init(input: "agm agenda", project: "acme", target: "board-prep", expected: "!unknown_target"),
        .init(input: "agm agenda", target: "nope", expected: "!unknown_target"),
        .init(input: "x", project: "acme#", target: "legal", expected: "!unknown_target"),
        .init(input: "x", project: "acme.*", expected: "!unknown_target"),
        .init(input: "x", project: "ac me", target: "legal", expected: "!unknown_target"),
        .init(input: "x", target: "le*gal", expected: "!unknown_target"),
        // 2. Mentions.
        .init(input: "please @acme/legal look at this agm agenda", expected: "acme/legal", source: .mention),
        .init(input: "@legal: the agm", expected: "acme/legal", source: .mention),
        .init(input: "ask @Legal about it", expected: "acme/legal", source: .mention),
        .init(input: "for @board prep: sort the minutes", expected: "yemaya/board-prep", source: .mention),
        .init(input: "@acme please, about the contract", expected: "acme/legal", source: .mention),
        .init(input: "@acme hello", expected: "acme/ops", source: .mention),
        .init(input: "@yem the donor list", expected: "yemaya/fundraising", source: .mention),
        // The project's best target is scored on the whole request, also the words before the "@".
        .init(input: "Thank the donor for the gala pledge @yemaya", expected: "yemaya/fundraising", source: .mention),
        .init(input: "the contract, please @acme", expected: "acme/legal", source: .mention),
        .init(input: "write to x@legal about the gala", expected: "yemaya/fundraising", source: .score),
        .init(input: "@nobody here, the gala", expected: "yemaya/fundraising", source: .score),
        // 3. Scores: whole words, case and diacritics, phrases, ties.
        .init(input: "Reply to Lisa about the AGM agenda — short, confirm 14:00", expected: "yemaya/board-prep", source: .score),
        .init(input: "ask zoe about the clause", expected: "acme/legal", source: .score),
        .init(input: "ask ZOË about it", expected: "acme/legal", source: .score),
        .init(input: "call Jose", expected: "acme/legal", source: .score),
        .init(input: "who is on call tonight", expected: "acme/ops", source: .score),
        .init(input: "who is on the call", expected: "yemaya/board-prep", source: .default),
        .init(input: "the agendas", expected: "yemaya/board-prep", source: .default),
        .init(input: "start due diligence", expected: "acme/legal", source: .score),
        .init(input: "agenda", expected: "yemaya/board-prep", source: .score),
        .init(input: "agm dinner with mum", expected: "home/family", source: .score),
        .init(input: "the acme co invoice", expected: "acme/ops", source: .score),
        .init(input: "yemaya gala", expected: "yemaya/fundraising", source: .score),
        // 4. Nothing scores: the default route.
        .init(input: "hello there", expected: "yemaya/board-prep", source: .default),
        .init(input: "😀 ✓ —", expected: "yemaya/board-prep", source: .default),
    ]

    @Test(arguments: cases)
    func resolves(_ c: ResolveCase) {
        switch resolver.resolve(input: c.input, projectHint: c.project, targetHint: c.target) {
        case .success(let r):
            #expect(r.route.description == c.expected)
            if let source = c.source { #expect(r.source == source) }
            #expect(r.confidence > 0 && r.confidence <= 1)
            #expect(!r.reason.isEmpty)
            #expect(r.alternatives.count <= 3)
            if r.source == .hint || r.source == .mention { #expect(r.confidence == 1.0) }
            if r.source == .score { #expect(r.confidence < 1.0) }
            if r.source == .default { #expect(r.confidence <= 0.2) }
        case .failure(let f):
            #expect("!\(f.code)" == c.expected)
        }
    }

    @Test func confidenceGrowsWithTheMarginAndAlternativesAreListed() throws {
        let weak = try resolver.resolve(input: "the agenda").get()  // board-prep and ops tie at 1
        let strong = try resolver.resolve(input: "Lisa: agm agenda and minutes").get()
        #expect(strong.confidence > weak.confidence)
        #expect(weak.route.description == "yemaya/board-prep")  // tie → earlier in the table
        #expect(weak.alternatives.map(\.route.description) == ["acme/ops"])
        #expect(strong.reason == "keywords: agm, agenda, minutes; contact: Lisa")
        #expect(strong.alternatives.map(\.route.description) == ["acme/ops", "home/family"])
        #expect(strong.alternatives.allSatisfy { $0.confidence < strong.confidence && $0.confidence > 0 })
    }

    @Test func seedRequestReadsLikeTheScreen() throws {
        let r = try resolver.resolve(input: "Reply to Lisa about the AGM agenda — short, confirm 14:00").get()
        #expect(r.reason == "keywords: agm, agenda; contact: Lisa")
        #expect(r.confidence > 0.5)
    }

    @Test func noDefaultMeansNoRoute() throws {
        let table = try RoutingTable(json: Data(#"{"projects":[{"id":"a","targets":[{"id":"b","keywords":["x"]}]}]}"#.utf8))
        #expect(RouteResolver(table: table).resolve(input: "nothing") == .failure(.noRoute))
        #expect((try? RouteResolver(table: table).resolve(input: "x").get())?.route.description == "a/b")
    }

    @Test func hugeTableResolvesByWord() throws {
        var projects: [String] = []
        for p in 0..<300 {
            let targets = (0..<10).map { #"{"id":"t\#($0)","keywords":["kw\#(p)x\#($0)"]}"# }.joined(separator: ",")
            projects.append(#"{"id":"p\#(p)","targets":[\#(targets)]}"#)
        }
        let table = try RoutingTable(json: Data(#"{"projects":[\#(projects.joined(separator: ","))]}"#.utf8))
        let r = RouteResolver(table: table)
        #expect((try? r.resolve(input: "about kw299x9 please").get())?.route.description == "p299/t9")
        #expect(r.resolve(input: "none") == .failure(.noRoute))
    }

    /// A target hint alone names the first project's (in table order) target
    /// of that id or name; within one project an id comes before a name.
    @Test func aTargetHintFindsTheFirstProjectWithThatIDOrName() throws {
        let r = RouteResolver(table: try RoutingTable(json: Data(#"""
            {"projects":[
              {"id":"p1","targets":[{"id":"one","name":"Alpha"},{"id":"two","name":"Beta"},{"id":"delta","name":"D"}]},
              {"id":"p2","targets":[{"id":"alpha","name":"Gamma"},{"id":"three","name":"Beta"},{"id":"four","name":"Delta"}]},
              {"id":"p3","targets":[{"id":"x1","name":"y1"},{"id":"y1","name":"Zed"}]}]}
            """#.utf8)))
        for (hint, expected) in [("alpha", "p1/one"), ("Alpha", "p1/one"), ("beta", "p1/two"), ("gamma", "p2/alpha"),
                                 ("delta", "p1/delta"), ("DELTA", "p2/four"), ("y1", "p3/y1"), ("Y1", "p3/x1"), ("zed", "p3/y1")] {
            #expect((try? r.resolve(input: "x", targetHint: hint).get())?.route.description == expected, "\(hint)")
        }
        #expect((try? r.resolve(input: "x", projectHint: "p2", targetHint: "alpha").get())?.route.description == "p2/alpha")
        #expect((try? r.resolve(input: "x", projectHint: "p2", targetHint: "Beta").get())?.route.description == "p2/three")
        #expect(r.resolve(input: "x", projectHint: "p3", targetHint: "beta") == .failure(.unknownTarget("'p3/beta'")))
    }

    /// A target hint is looked up, not compared with every name of the table:
    /// a batch of them (the router plans up to 256 at a time) is quick on a large table.
    @Test func targetHintsOnALargeTableAreLookedUp() throws {
        var projects: [String] = []
        for p in 0..<300 {
            let targets = (0..<10).map { #"{"id":"t\#($0)","name":"Target \#(p) \#($0)"}"# }.joined(separator: ",")
            projects.append(#"{"id":"p\#(p)","targets":[\#(targets)]}"#)
        }
        let r = RouteResolver(table: try RoutingTable(json: Data(#"{"projects":[\#(projects.joined(separator: ","))]}"#.utf8)))
        let started = ContinuousClock.now
        for _ in 0..<128 {
            #expect((try? r.resolve(input: "x", targetHint: "target 299 9").get())?.route.description == "p299/t9")
            #expect(r.resolve(input: "x", targetHint: "target 300 0") == .failure(.unknownTarget("'target 300 0'")))
        }
        #expect(ContinuousClock.now - started < .milliseconds(250))
    }

    /// A project hint (or `@project`) picks the project's best-scoring target
    /// as the table's scores would, ties to the earlier, else its first.
    @Test func aProjectHintPicksTheBestScoringTargetOfThatProject() throws {
        let words = ["agm", "agenda", "board", "minutes", "lisa", "donor", "grant", "gala", "marcus", "invoice", "on", "call",
                     "contract", "nda", "due", "diligence", "priya", "zoe", "jose", "dinner", "mum", "yemaya", "acme", "corp",
                     "co", "home", "prep", "ops", "legal", "family", "fundraising", "x"]
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            let input = (0..<Int.random(in: 1...8, using: &rng)).map { _ in words.randomElement(using: &rng)! }.joined(separator: " ")
            for (p, project) in resolver.table.projects.enumerated() {
                // Brute force: every target of the project scored alone.
                let block = resolver.projectTargets[p].indices
                let text = NormalizedText(input)
                var expected = resolver.targets[block.lowerBound].route
                var best = 0
                for t in block where resolver.score(resolver.targets[t], text).score > best {
                    best = resolver.score(resolver.targets[t], text).score
                    expected = resolver.targets[t].route
                }
                #expect((try? resolver.resolve(input: input, projectHint: project.id).get())?.route == expected, "\(input) / \(project.id)")
                #expect((try? resolver.resolve(input: "\(input) @\(project.id)").get())?.route == expected, "\(input) @\(project.id)")
            }
        }
    }

    /// A hint of no words (" ", "?") names no target by name, though a
    /// target's name may have none: only its id names that one.
    @Test func aHintOfNoWordsNamesNothing() throws {
        let r = RouteResolver(table: try RoutingTable(json: Data(#"{"projects":[{"id":"ops","targets":[{"id":"misc","name":"—"},{"id":"b","name":"B"}]}]}"#.utf8)))
        for hint in [" ", "?", "—", "\u{301}"] {
            #expect(r.resolve(input: "x", targetHint: hint) == .failure(.unknownTarget("'\(hint)'")), "\(hint)")
            #expect(r.resolve(input: "x", projectHint: "ops", targetHint: hint) == .failure(.unknownTarget("'ops/\(hint)'")), "\(hint)")
        }
        #expect((try? r.resolve(input: "x", targetHint: "misc").get())?.route.description == "ops/misc")
    }

    /// A project hint on a project of many targets is scored through the
    /// index: an input of many words costs about what it costs without a hint.
    @Test func aProjectHintOnALargeProjectIsQuick() throws {
        let targets = (0..<1000).map { #"{"id":"t\#($0)","keywords":["k\#($0)a","k\#($0)b","k\#($0)c","k\#($0)d","k\#($0)e"]}"# }
        let r = RouteResolver(table: try RoutingTable(json: Data(#"{"projects":[{"id":"big","targets":[\#(targets.joined(separator: ","))]}]}"#.utf8)))
        let input = String(repeating: "a ", count: 1999) + "k999e"
        let started = ContinuousClock.now
        for _ in 0..<32 {
            #expect((try? r.resolve(input: input, projectHint: "big").get())?.route.description == "big/t999")
            #expect((try? r.resolve(input: "@big " + input).get())?.route.description == "big/t999")
        }
        #expect(ContinuousClock.now - started < .milliseconds(300))
    }

    /// A word no table word is as long as costs only finding its end: the
    /// request is routed by the rest, and a phrase does not run across it.
    @Test func anOverlongWordMatchesNothingAndPartsAPhrase() throws {
        let r = RouteResolver(table: try RoutingTable(json: Data(#"{"projects":[{"id":"p","targets":[{"id":"a","keywords":["board minutes"]},{"id":"b","keywords":["agm"]}]}]}"#.utf8)))
        let giant = String(repeating: "\u{FDFA}", count: 3990)
        #expect((try? r.resolve(input: "\(giant) agm").get())?.route.description == "p/b")
        #expect((try? r.resolve(input: "board \(giant) minutes agm").get())?.route.description == "p/b")
        #expect((try? r.resolve(input: "board minutes \(giant)").get())?.route.description == "p/a")
        #expect((try? r.resolve(input: "@\(giant) board minutes").get())?.route.description == "p/a")
        #expect(r.resolve(input: "\(giant) nothing") == .failure(.noRoute))
        // A table word that folds to a space (U+037A) is no overlong word.
        let odd = RouteResolver(table: try RoutingTable(json: Data(#"{"projects":[{"id":"p","targets":[{"id":"a","keywords":["\u037a"]},{"id":"b","keywords":["agm"]}]}]}"#.utf8)))
        #expect((try? odd.resolve(input: "\(giant) agm").get())?.route.description == "p/b")
        // A hint as long as the body allows, of one word or of many, names nothing, quickly.
        for hint in [String(repeating: "\u{FDFA}", count: 20_000), String(repeating: "\u{FDFA} ", count: 10_000)] {
            let started = ContinuousClock.now
            let shown = RouteResolver.cut(hint, toBytes: RouteResolver.maxShownHintBytes)
            #expect(shown.utf8.count <= RouteResolver.maxShownHintBytes + 3 && shown.hasSuffix("…"))
            #expect(r.resolve(input: "agm", targetHint: hint) == .failure(.unknownTarget("'\(shown)'")))
            #expect(r.resolve(input: "agm", projectHint: hint) == .failure(.unknownTarget("'\(shown)'")))
            #expect(ContinuousClock.now - started < .milliseconds(300))
        }
    }

    /// A mention reads only the few words after its "@", not the rest of the
    /// input: 1,333 "@" each followed by the whole remaining input made the
    /// router's thread fold millions of characters for one request.
    @Test func manyMentionsCostLittle() throws {
        var projects: [String] = []
        for p in 0..<300 {
            let targets = (0..<10).map { #"{"id":"t\#($0)","name":"Team \#(p) \#($0)","keywords":["kw\#(p)x\#($0)"]}"# }.joined(separator: ",")
            projects.append(#"{"id":"p\#(p)","name":"Project \#(p)","aliases":["pa\#(p)"],"targets":[\#(targets)]}"#)
        }
        let table = try RoutingTable(json: Data(#"{"projects":[\#(projects.joined(separator: ","))]}"#.utf8))
        let r = RouteResolver(table: table)
        for unit in ["@é ", "@\u{FDFA} ", "@x ", "@", "@€", "@\u{3000}", "@a/b "] {
            let hostile = String(repeating: unit, count: 3999 / unit.unicodeScalars.count)
            let started = ContinuousClock.now
            _ = r.resolve(input: hostile)
            let took = ContinuousClock.now - started
            #expect(took < .milliseconds(150), "\(unit.unicodeScalars.map { String($0.value, radix: 16) }): \(took)")
            // The mention at the end still counts, by name and by project alias.
            #expect((try? r.resolve(input: hostile + "@team 12 3").get())?.route.description == "p12/t3")
            #expect((try? r.resolve(input: hostile + "@pa7 kw7x4").get())?.route.description == "p7/t4")
        }
        // Names of several words are still matched whole after the change.
        #expect((try? r.resolve(input: "ask @Project 42 about kw42x5").get())?.route.description == "p42/t5")
        #expect((try? r.resolve(input: "ask @Team 42 5 now").get())?.route.description == "p42/t5")
    }
}

@Suite("Text normalisation")
struct NormalizedTextTests {
    @Test(arguments: [
        ("Zoë's AGM-agenda", ["zoe", "s", "agm", "agenda"]),
        ("JOSÉ  e\u{301}te", ["jose", "ete"]),
        ("ｆｕｌｌ width ＡＧＭ", ["full", "width", "agm"]),
        ("Reply — short, confirm 14:00", ["reply", "short", "confirm", "14", "00"]),
        ("😀✓", []),
        ("Straße Ærø", ["strasse", "ærø"]),
        ("STRAẞE ΟΔΟΣ οδος", ["strasse", "οδοσ", "οδοσ"]),
    ])
    func words(_ text: String, _ expected: [String]) {
        #expect(NormalizedText.words(of: text) == expected)
    }

    /// A word longer than the longest that can match is read as `overlong`,
    /// whatever its letters: it matches nothing and still parts its neighbours.
    @Test func aWordPastTheLongestIsOverlong() {
        let o = NormalizedText.overlong
        #expect(NormalizedText.words(of: "abc defgh ij", longest: 4) == ["abc", o, "ij"])
        #expect(NormalizedText.words(of: "abcd ÉÉÉÉ ÉÉÉÉÉ ﬁﬁ ﬁﬁﬁ", longest: 4) == ["abcd", "eeee", o, "fifi", o])
        #expect(NormalizedText.words(of: String(repeating: "\u{FDFA}", count: 4000) + " agm", longest: 10) == [o, "agm"])
        // Its start is its first scalar, for a mention's words.
        let (words, starts) = NormalizedText.wordsWithStarts(of: "xy é" + String(repeating: "é", count: 100) + " z", longest: 8)
        #expect(words == ["xy", o, "z"])
        #expect(starts.map { "xy é\(String(repeating: "é", count: 100)) z".unicodeScalars.distance(from: "xy é\(String(repeating: "é", count: 100)) z".unicodeScalars.startIndex, to: $0) } == [0, 3, 105])
        // A letter that folds to nothing does not count towards the length.
        #expect(NormalizedText.words(of: "fundraising\u{FF9E}", longest: 11) == ["fundraising"])
        // A name is read to one word more than the longest name has, at most.
        #expect(NormalizedText.words(of: "a b c d e f", longest: 4, maxWords: 2) == ["a", "b", o])
        #expect(NormalizedText.words(of: "a b", longest: 4, maxWords: 2) == ["a", "b"])
    }

    /// The words as folding every scalar gives them (the definition;
    /// `NormalizedText` folds each letter once per text, and stops at the
    /// longest word).
    static func foldedOneByOne(_ text: String) -> [String] {
        var words: [String] = [], current = ""
        func flush() {
            if !current.isEmpty { words.append(current) }
            current = ""
        }
        func isMark(_ c: Unicode.GeneralCategory) -> Bool { c == .nonspacingMark || c == .spacingMark || c == .enclosingMark }
        for scalar in text.unicodeScalars {
            let p = scalar.properties
            if isMark(p.generalCategory) { continue }
            guard p.isAlphabetic || p.numericType != nil else {
                flush()
                continue
            }
            for folded in String(scalar).decomposedStringWithCompatibilityMapping.unicodeScalars where !isMark(folded.properties.generalCategory) {
                current += [0xDF, 0x1E9E].contains(folded.value) ? "ss" : folded.value == 0x3C2 ? "σ" : folded.properties.lowercaseMapping
            }
        }
        flush()
        return words
    }

    /// Folding each letter once per text (and stopping at the longest word)
    /// gives the words folding every scalar does, over blocks full of
    /// compatibility forms, precomposed letters, ligatures and marks, mixed
    /// with ASCII, in random words.
    @Test func foldingOnceAScalarEqualsFoldingEach() {
        let blocks: [ClosedRange<UInt32>] = [
            0x00C0...0x024F, 0x0370...0x03FF, 0x0400...0x04FF, 0x0300...0x036F, 0x1E00...0x1EFF, 0x2070...0x209F,
            0x2150...0x218B, 0x2460...0x24FF, 0x3131...0x318E, 0xAC00...0xAC80, 0xFB00...0xFB4F, 0xFDF0...0xFDFD,
            0xFE70...0xFEFC, 0xFF01...0xFFEE, 0x1D400...0x1D7FF, 0x1F100...0x1F1AD,
        ]
        let pool = blocks.flatMap { $0.compactMap(Unicode.Scalar.init) } + "aZ09 -é".unicodeScalars
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<300 {
            var text = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 1...40, using: &rng) { text.append(pool.randomElement(using: &rng)!) }
            let s = String(text)
            #expect(NormalizedText.words(of: s) == Self.foldedOneByOne(s), "\(s.unicodeScalars.map { String($0.value, radix: 16) })")
        }
        // Every scalar of the blocks alone, and after an ASCII letter.
        for scalar in pool {
            for s in [String(scalar), "a" + String(scalar) + "b"] {
                #expect(NormalizedText.words(of: s) == Self.foldedOneByOne(s), "\(String(scalar.value, radix: 16))")
            }
        }
    }
}
