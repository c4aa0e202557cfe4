// resolver-bench: resolutions per second on a table of 1,000 projects × 10
// targets, on one core, against a baseline measured in the same run: the
// same scoring without the first-word index (every target scored).
// Prints figures; asserts nothing about speed.
import Foundation
import FrontDeskModel

var projects: [String] = []
for p in 0..<1000 {
    let targets = (0..<10).map { t in
        #"{"id":"t\#(t)","name":"Target \#(p) \#(t)","keywords":["kw\#(p)x\#(t)","topic\#(t) item\#(p)","shared\#(t)"],"contacts":["Person\#(p)x\#(t)"]}"#
    }.joined(separator: ",")
    projects.append(#"{"id":"p\#(p)","name":"Project \#(p)","aliases":["alias\#(p)"],"targets":[\#(targets)]}"#)
}
let table = try RoutingTable(json: Data(#"{"projects":[\#(projects.joined(separator: ","))],"default":{"project":"p0","target":"t0"}}"#.utf8))
let resolver = RouteResolver(table: table)
var generator = SystemRandomNumberGenerator()
let inputs: [String] = (0..<10_000).map { i in
    let p = Int.random(in: 0..<1000, using: &generator), t = Int.random(in: 0..<10, using: &generator)
    switch i % 4 {
    case 0: return "Reply to Person\(p)x\(t) about kw\(p)x\(t) — short, confirm 14:00"
    case 1: return "please look at topic\(t) item\(p) and shared\(t) before Thursday"
    case 2: return "@p\(p)/t\(t) the usual"
    default: return "nothing here matches anything at all, so the default route wins"
    }
}

func measure(_ label: String, seconds: Double, _ body: (String) -> Void) -> Double {
    var count = 0
    let start = Date()
    while Date().timeIntervalSince(start) < seconds {
        for input in inputs { body(input) }
        count += inputs.count
    }
    let rate = Double(count) / Date().timeIntervalSince(start)
    print("\(label.padding(toLength: 34, withPad: " ", startingAt: 0)) \(String(format: "%10.0f", rate)) resolutions/s")
    return rate
}

print("resolver-bench: 1,000 projects × 10 targets, 10,000 mixed inputs (keywords, phrases, mentions, no match), one core")
var sink = 0
let indexed = measure("RouteResolver (first-word index)", seconds: 3) { input in
    if case .success(let r) = resolver.resolve(input: input) { sink &+= r.route.target.count }
}
for (k, name) in ["keywords + contact", "phrases shared by 1,000 targets", "@project/target mention", "no match (default)"].enumerated() {
    let subset = inputs.enumerated().filter { $0.offset % 4 == k }.map(\.element)
    var n = 0
    let start = Date()
    while Date().timeIntervalSince(start) < 1 {
        for input in subset { if case .success(let r) = resolver.resolve(input: input) { sink &+= r.route.target.count } }
        n += subset.count
    }
    print("  of which \(name.padding(toLength: 32, withPad: " ", startingAt: 0)) \(String(format: "%10.0f", Double(n) / Date().timeIntervalSince(start))) resolutions/s")
}
let naive = measure("baseline: score every target", seconds: 3) { input in
    sink &+= resolver.scoreEveryTarget(input)
}
print(String(format: "speed-up over the baseline: %.1f×; target ≥ 200,000/s: %@", indexed / naive, indexed >= 200_000 ? "met" : "NOT met"))
if sink == 42 { print("") }

// Hostile inputs (4,000 code points, the most a request may have): the
// longest one resolve takes. The router plans a batch of up to 256 on its
// connection's thread, so what one costs, 256 of them hold up the intake.
let expensive = "\u{FDFA}"  // one scalar whose compatibility form is 18
// Distinct letters that fold (mathematical alphanumerics fold to ASCII) and distinct Hangul syllables (to jamo).
let distinctFolding = (0..<4000).compactMap { i in Unicode.Scalar(0x1D400 + UInt32(i % 1000)).map(Character.init) }
let distinctHangul = String((0..<4000).compactMap { i in Unicode.Scalar(0xAC00 + UInt32(i)).map(Character.init) })
let hostile: [(String, String)] = [
    ("'@ ' + 3,998 × U+FDFA", "@ " + String(repeating: expensive, count: 3998)),
    ("4,000 × U+FDFA", String(repeating: expensive, count: 4000)),
    ("2,000 × 'U+FDFA '", String(repeating: expensive + " ", count: 2000)),
    ("4,000 Hangul syllables", String(repeating: "한", count: 4000)),
    ("4,000 × 'é'", String(repeating: "é", count: 4000)),
    ("2,000 × math letter + ' '", String(distinctFolding.prefix(2000).flatMap { [$0, " "] })),
    ("4,000 math letters", String(distinctFolding)),
    ("4,000 distinct Hangul syllables", distinctHangul),
    ("333 × (10 × U+FDFA + CJK + ' ')", (0..<333).map { i in String(repeating: expensive, count: 10) + String(Character(Unicode.Scalar(0x4E00 + UInt32(i))!)) + " " }.joined()),
    ("4,000 × '@'", String(repeating: "@", count: 4000)),
    ("1,333 × '@p '", String(repeating: "@p ", count: 1333)),
]
// Hints: (input, project hint, target hint). A target-only hint is looked
// for in every project; a project hint picks among that project's targets.
let hostileHints: [(String, (String, String?, String?))] = [
    ("target hint, the last target's name", ("the usual", nil, "Target 999 9")),
    ("target hint naming nothing", ("the usual", nil, "no such target here")),
    ("target hint of 4,000 × U+FDFA", ("the usual", nil, String(repeating: expensive, count: 4000))),
    ("project hint, 4,000 × 'shared1 '", (String(repeating: "shared1 ", count: 500), "Project 999", nil)),
    ("project + target hint by names", ("the usual", "Project 999", "Target 999 9")),
]
// A second table: one project of 1,000 targets × 5 keywords (a project hint
// or "@big" picks among them), and hints as long as a body allows.
let bigProject = (0..<1000).map { #"{"id":"t\#($0)","keywords":["k\#($0)a","k\#($0)b","k\#($0)c","k\#($0)d","k\#($0)e"]}"# }
let big = RouteResolver(table: try RoutingTable(json: Data(#"{"projects":[{"id":"big","targets":[\#(bigProject.joined(separator: ","))]}]}"#.utf8)))
let manyWords = String(repeating: "a ", count: 1999) + "k999e"
let bigCases: [(String, (String, String?, String?))] = [
    ("1,000-target project hint, 2,000 words", (manyWords, "big", nil)),
    ("'@big' + 2,000 words", ("@big " + manyWords, nil, nil)),
    ("target hint of 32,000 × '§'", ("x", nil, String(repeating: "§", count: 32_000))),
]
let cases = hostile.map { ($0.0, ($0.1, String?.none, String?.none), resolver) } + hostileHints.map { ($0.0, $0.1, resolver) }
    + bigCases.map { ($0.0, $0.1, big) }
print("hostile inputs, the median and the longest of 21 resolves each:")
var worst = Duration.zero
for (name, (input, projectHint, targetHint), resolver) in cases {
    precondition(input.unicodeScalars.count <= 4010, name)
    var took: [Duration] = []
    for _ in 0..<21 {
        let started = ContinuousClock.now
        if case .success(let r) = resolver.resolve(input: input, projectHint: projectHint, targetHint: targetHint) { sink &+= r.route.target.count }
        took.append(ContinuousClock.now - started)
    }
    took.sort()
    worst = max(worst, took[10])
    print("  \(name.padding(toLength: 32, withPad: " ", startingAt: 0)) \(String(format: "%8.2f", took[10] / .milliseconds(1))) ms  (longest \(String(format: "%.2f", took[20] / .milliseconds(1))) ms)")
}
print(String(format: "a batch of 256 of the worst (by its median): %.2f s", worst / .seconds(1) * 256))
if sink == 43 { print("") }
