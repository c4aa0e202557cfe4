import Foundation

/// A resolved route: the best guess, how sure, why, and the runners-up.
public struct RouteResolution: Sendable, Equatable {
    public struct Alternative: Sendable, Equatable {
        public var route: RoutingTable.Route
        public var confidence: Double
    }

    public enum Source: String, Sendable {
        case hint, mention, score, `default`
    }

    public var route: RoutingTable.Route
    public var confidence: Double
    public var reason: String
    public var alternatives: [Alternative]
    public var source: Source
}

/// Why no route was resolved.
public enum RouteFailure: Error, Sendable, Equatable {
    /// The request's hints name no target of the table.
    case unknownTarget(String)
    /// Nothing matched and the table has no default route.
    case noRoute

    public var code: String {
        switch self {
        case .unknownTarget: "unknown_target"
        case .noRoute: "no_route"
        }
    }

    public var message: String {
        switch self {
        case .unknownTarget(let what): "the hint \(what) names no target of the routing table"
        case .noRoute: "nothing in the input matched a target and the routing table has no default route"
        }
    }
}

/// Resolves project and target as CONTRACT.md orders: hints, then a
/// mention, then keyword scores, then the default route. Pure: knows
/// nothing of messages or sockets. Build it once per table; it is immutable.
public struct RouteResolver: Sendable {
    public let table: RoutingTable

    /// One scorable entry of a target: its words, and how the reason names it.
    struct Entry: Sendable {
        let words: [String]
        let label: String
        let kind: Kind
        /// Position among its target's entries, so reasons list entries in table order.
        var order = 0
        enum Kind: Int, Sendable { case keyword, contact, targetName, projectName, alias }
    }

    struct IndexedTarget: Sendable {
        let route: RoutingTable.Route
        let entries: [Entry]
        let nameWords: [String]
    }

    let targets: [IndexedTarget]
    /// Normalised project names and aliases, per project in table order.
    let projectNames: [(id: String, names: [[String]])]
    /// Project positions in the table by id.
    let projectsByID: [String: Int]
    /// Target indices by target id, in table order.
    let targetsByID: [String: [Int]]
    /// The first project (in table order) by the words of its name or an alias.
    let projectByName: [[String]: Int]
    /// The first target (in table order) by the words of its name.
    let targetByName: [[String]: Int]
    /// Each project's targets, by position in the table: their indices in
    /// `targets`, and the first of them by id and by the words of its name.
    /// A hint is looked up, not compared with every name.
    let projectTargets: [ProjectTargets]

    struct ProjectTargets: Sendable {
        /// Its targets' indices in `targets`: one block, in table order.
        var indices: Range<Int> = 0..<0
        var byID: [String: Int] = [:]
        /// By the words of their names (a name of no words is no name to look up).
        var byName: [[String]: Int] = [:]
    }
    /// The most words a target's or project's name (or alias) has: all a
    /// mention needs to read after its "@".
    let mentionWords: Int
    /// Every target's entries by first word: scoring checks only entries
    /// whose first word is in the input.
    let phrases: PhraseIndex
    /// The bytes of the table's longest word (normalised): a longer word of
    /// an input or a hint matches nothing, and is not folded whole.
    let longestWord: Int

    public init(table: RoutingTable) {
        self.table = table
        var targets: [IndexedTarget] = []
        var projectTargets: [ProjectTargets] = []
        for p in table.projects {
            var own = ProjectTargets(indices: targets.count..<targets.count)
            let projectEntries = [Entry(words: NormalizedText.words(of: p.name), label: p.name, kind: .projectName)]
                + p.aliases.map { Entry(words: NormalizedText.words(of: $0), label: $0, kind: .alias) }
            for t in p.targets {
                let entries = t.keywords.map { Entry(words: NormalizedText.words(of: $0), label: $0, kind: .keyword) }
                    + t.contacts.map { Entry(words: NormalizedText.words(of: $0), label: $0, kind: .contact) }
                    + [Entry(words: NormalizedText.words(of: t.name), label: t.name, kind: .targetName)]
                    + projectEntries
                var kept = entries.filter { !$0.words.isEmpty }
                for i in kept.indices { kept[i].order = i }
                let nameWords = NormalizedText.words(of: t.name)
                if own.byID[t.id] == nil { own.byID[t.id] = targets.count }
                if !nameWords.isEmpty, own.byName[nameWords] == nil { own.byName[nameWords] = targets.count }
                targets.append(IndexedTarget(route: .init(project: p.id, target: t.id), entries: kept, nameWords: nameWords))
            }
            own.indices = own.indices.lowerBound..<targets.count
            projectTargets.append(own)
        }
        self.targets = targets
        self.projectTargets = projectTargets
        self.phrases = PhraseIndex(phrases: targets.map { $0.entries.map(\.words) })
        projectNames = table.projects.map { p in
            (p.id, ([p.name] + p.aliases).map { NormalizedText.words(of: $0) }.filter { !$0.isEmpty })
        }
        projectsByID = Dictionary(table.projects.enumerated().map { ($1.id, $0) }, uniquingKeysWith: { first, _ in first })
        var projectByName: [[String]: Int] = [:]
        for (index, p) in projectNames.enumerated() {
            for name in p.names where projectByName[name] == nil { projectByName[name] = index }
        }
        self.projectByName = projectByName
        var targetByName: [[String]: Int] = [:]
        for (index, t) in targets.enumerated() where !t.nameWords.isEmpty && targetByName[t.nameWords] == nil {
            targetByName[t.nameWords] = index
        }
        self.targetByName = targetByName
        mentionWords = max(
            targets.map(\.nameWords.count).max() ?? 0,
            projectNames.flatMap { $0.names.map(\.count) }.max() ?? 0, 1)
        var byID: [String: [Int]] = [:]
        for (i, t) in targets.enumerated() { byID[t.route.target, default: []].append(i) }
        targetsByID = byID
        let tableWords = targets.flatMap { $0.entries.flatMap(\.words) + $0.nameWords } + projectNames.flatMap { $0.names.joined() }
        longestWord = max(1, tableWords.map(\.utf8.count).max() ?? 0)
    }

    public func resolve(input: String, projectHint: String? = nil, targetHint: String? = nil) -> Result<RouteResolution, RouteFailure> {
        if projectHint != nil || targetHint != nil {
            return resolveHints(project: projectHint, target: targetHint, input: input)
        }
        // The input's words are read at most once: by a mention that needs
        // them, then by the scores.
        var words: (words: [String], starts: [String.Index])?
        if let mention = resolveMention(input, words: &words) { return .success(mention) }
        let text = words.map { NormalizedText(words: $0.words) } ?? NormalizedText(input, longest: longestWord)
        if let scored = resolveScores(text) { return .success(scored) }
        guard let d = table.defaultRoute else { return .failure(.noRoute) }
        return .success(RouteResolution(
            route: d, confidence: 0.1, reason: "default route: nothing in the input matched a target",
            alternatives: [], source: .default))
    }

    // MARK: Hints

    private func resolveHints(project: String?, target: String?, input: String) -> Result<RouteResolution, RouteFailure> {
        let shown = Self.cut([project, target].compactMap { $0 }.joined(separator: "/"), toBytes: Self.maxShownHintBytes)
        // No name is that long: not read (a hint may fill the body, where an input has 4,000).
        guard [project, target].allSatisfy({ $0.map(Self.isShortEnoughForAHint) ?? true }) else {
            return .failure(.unknownTarget("'\(shown)'"))
        }
        if let project {
            guard let p = findProject(project) else { return .failure(.unknownTarget("'\(shown)'")) }
            if let target {
                guard let t = findTarget(target, in: p) else { return .failure(.unknownTarget("'\(shown)'")) }
                let route = targets[t].route
                return .success(exact(route, reason: "hint: \(route.project)/\(route.target)", .hint))
            }
            let route = bestTarget(of: p, input: input)
            return .success(exact(route, reason: "hint: project \(table.projects[p].id)", .hint))
        }
        guard let target else { return .failure(.unknownTarget("''")) }
        // The first project (in table order) with a target of that id or
        // name; in it, the one by id. The first target of an id and the
        // first of a name tell which project that is.
        let byID = Identifiers.isValidTableID(target) ? targetsByID[target]?.first : nil
        let byName = targetByName[nameWords(of: target)]  // none for no words
        let found: Int? = switch (byID, byName) {
        case let (i?, n?): projectPosition(of: n) < projectPosition(of: i) ? n : i
        case let (i, n): i ?? n
        }
        guard let found else { return .failure(.unknownTarget("'\(shown)'")) }
        return .success(exact(targets[found].route, reason: "hint: target \(targets[found].route.target)", .hint))
    }

    /// A project's position in the table, by id, else by name or alias.
    private func findProject(_ key: String) -> Int? {
        (Identifiers.isValidTableID(key) ? projectsByID[key] : nil) ?? projectByName[nameWords(of: key)]
    }

    /// A target of the project at `p`, by id, else by name: its index in `targets`.
    private func findTarget(_ key: String, in p: Int) -> Int? {
        (Identifiers.isValidTableID(key) ? projectTargets[p].byID[key] : nil) ?? projectTargets[p].byName[nameWords(of: key)]
    }

    /// A hint of more code points than an input may have names nothing.
    static func isShortEnoughForAHint(_ key: String) -> Bool {
        if key.utf8.count <= IntakeClassifier.maxInputScalars { return true }
        var count = 0
        for _ in key.unicodeScalars {
            count += 1
            if count > IntakeClassifier.maxInputScalars { return false }
        }
        return true
    }

    /// How much of the hints a failure's message repeats.
    static let maxShownHintBytes = 200

    /// `text` cut to at most `limit` bytes of UTF-8 at a character's end, with "…" when cut.
    static func cut(_ text: String, toBytes limit: Int) -> String {
        guard text.utf8.count > limit else { return text }
        var bytes = 0
        var end = text.startIndex
        for c in text {
            bytes += c.utf8.count
            if bytes > limit { break }
            end = text.index(after: end)
        }
        return String(text[..<end]) + "…"
    }

    /// The position in the table of the project of the target at `t`.
    private func projectPosition(of t: Int) -> Int { projectsByID[targets[t].route.project] ?? 0 }

    /// A hint's or a mention's words as a name's are compared: no more than a
    /// name of the table has (a longer hint names nothing), none longer.
    private func nameWords(of key: String) -> [String] {
        NormalizedText.words(of: key, longest: longestWord, maxWords: mentionWords)
    }

    private func exact(_ route: RoutingTable.Route, reason: String, _ source: RouteResolution.Source) -> RouteResolution {
        RouteResolution(route: route, confidence: 1.0, reason: reason, alternatives: [], source: source)
    }

    /// A project's best-scoring target for the input, else its first.
    private func bestTarget(of p: Int, input: String) -> RoutingTable.Route {
        bestTarget(of: p, text: NormalizedText(input, longest: longestWord))
    }

    /// The project at `p`'s best-scoring target for the text (ties to the
    /// earlier), else its first. Scored through the phrase index, as the
    /// whole table is: the same scores, with no target compared word by word.
    private func bestTarget(of p: Int, text: NormalizedText) -> RoutingTable.Route {
        let block = projectTargets[p].indices
        let hits = phrases.matches(in: text.words).filter { block.contains(Int($0)) }
        let (touched, counts) = Self.tally(hits, targetCount: targets.count)
        var best: (index: Int, score: Int)? = nil
        for (index, score) in zip(touched, counts) where best.map({ Self.ranks((index, score), above: $0) }) ?? true {
            best = (index, score)
        }
        return targets[best?.index ?? block.lowerBound].route
    }

    // MARK: Mentions

    /// The first `@…` in the input that names a route: `@project/target`,
    /// `@target` (id or name) or `@project` (id, name or alias).
    private func resolveMention(_ input: String, words read: inout (words: [String], starts: [String.Index])?) -> RouteResolution? {
        guard input.utf8.contains(UInt8(ascii: "@")) else { return nil }
        var all = read
        defer { read = all }
        // The input's words once, with where each begins: a mention takes the
        // first few after its "@" (never the rest of the input again for each
        // "@": 1,333 of them made millions of folds for one request).
        var searchStart = input.startIndex
        while let at = input[searchStart...].firstIndex(of: "@") {
            let after = input[input.index(after: at)...]
            searchStart = input.index(after: at)
            // "lisa@example.com" is an address, not a mention.
            if at > input.startIndex, input[input.index(before: at)].isLetter || input[input.index(before: at)].isNumber { continue }
            // "@" is no letter: the words after it are those that begin after
            // it (read only when the token alone names nothing).
            let everyWord = { () -> (words: [String], starts: [String.Index]) in
                let read = all ?? NormalizedText.wordsWithStarts(of: input, longest: self.longestWord)
                all = read
                return read
            }
            let words = { () -> [String] in
                let (words, starts) = everyWord()
                var low = 0, high = starts.count
                while low < high {
                    let mid = (low + high) / 2
                    if starts[mid] > at { high = mid } else { low = mid + 1 }
                }
                return Array(words[low..<min(words.count, low + self.mentionWords)])
            }
            if let r = mention(in: after, words: words, whole: { NormalizedText(words: everyWord().words) }) { return r }
        }
        return nil
    }

    /// `text` is what follows the `@`, `words` its first words (as many as
    /// a name can have); `whole` the whole request's words, which a
    /// project's best target is scored on.
    private func mention(in text: Substring, words wordsAfter: () -> [String], whole: () -> NormalizedText) -> RouteResolution? {
        let token = text.prefix { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "/" || $0 == "_" }
        if let slash = token.firstIndex(of: "/") {
            let pKey = String(token[..<slash]).lowercased(), tKey = String(token[token.index(after: slash)...]).lowercased()
            if let p = findProject(pKey), let t = findTarget(tKey, in: p) {
                let route = targets[t].route
                return exact(route, reason: "mention: @\(route.project)/\(route.target)", .mention)
            }
        }
        let id = String(token).lowercased()
        // Targets: by id, then by name as a phrase at the start of the text after "@".
        if let first = targetsByID[id]?.first {
            return exact(targets[first].route, reason: "mention: @\(id)", .mention)
        }
        // The first target in table order whose name begins the text, then
        // the first project whose id is the token or whose name or alias
        // begins it: one look-up a prefix of the words (a mention costs the
        // same however many targets share a first word).
        let words = wordsAfter()
        func firstNamed(_ index: [[String]: Int]) -> Int? {
            (0..<words.count).compactMap { index[Array(words[...$0])] }.min()
        }
        if let i = firstNamed(targetByName) {
            return exact(targets[i].route, reason: "mention: @\(targets[i].route.target)", .mention)
        }
        if let index = [projectsByID[id], firstNamed(projectByName)].compactMap({ $0 }).min() {
            let route = bestTarget(of: index, text: whole())
            return exact(route, reason: "mention: @\(projectNames[index].id)", .mention)
        }
        return nil
    }

    // MARK: Scores

    struct Score {
        var score = 0
        var matched: [Entry] = []
    }

    func score(_ t: IndexedTarget, _ text: NormalizedText) -> Score {
        var s = Score()
        for e in t.entries where text.contains(e.words) {
            s.score += 1
            s.matched.append(e)
        }
        return s
    }

    private func resolveScores(_ text: NormalizedText) -> RouteResolution? {
        let hits = phrases.matches(in: text.words)
        guard !hits.isEmpty else { return nil }
        let (touched, counts) = Self.tally(hits, targetCount: targets.count)
        // The best 4 (winner and up to 3 runners-up): higher score first, ties to the earlier target.
        var top: [(index: Int, score: Int)] = []
        top.reserveCapacity(5)
        for (index, score) in zip(touched, counts) {
            guard top.count < 4 || Self.ranks((index, score), above: top[top.count - 1]) else { continue }
            let slot = top.firstIndex { !Self.ranks($0, above: (index, score)) } ?? top.count
            top.insert((index, score), at: slot)
            if top.count > 4 { top.removeLast() }
        }
        let best = top[0]
        let s1 = Double(best.score)
        let s2 = Double(top.count > 1 ? top[1].score : 0)
        let confidence = min(0.99, max(0.01, (s1 - s2 + 1) / (s1 + 2)))
        let alternatives = top.dropFirst().map { alt in
            RouteResolution.Alternative(
                route: targets[alt.index].route,
                confidence: (Double(alt.score) / (s1 + Double(alt.score) + 2) * 100).rounded() / 100)
        }
        return RouteResolution(
            route: targets[best.index].route, confidence: (confidence * 100).rounded() / 100,
            reason: Self.reason(score(targets[best.index], text).matched), alternatives: alternatives, source: .score)
    }

    /// Each hit target once, with its number of hits. Few hits are sorted;
    /// many (a phrase shared by a crowd of targets) go through a flat array.
    static func tally(_ hits: [Int32], targetCount: Int) -> (targets: [Int], counts: [Int]) {
        var targets: [Int] = [], counts: [Int] = []
        if hits.count <= 64 {
            for t in hits.sorted() {
                if targets.last == Int(t) { counts[counts.count - 1] += 1 } else { targets.append(Int(t)); counts.append(1) }
            }
            return (targets, counts)
        }
        var perTarget = [Int32](repeating: 0, count: targetCount)
        for t in hits {
            if perTarget[Int(t)] == 0 { targets.append(Int(t)) }
            perTarget[Int(t)] += 1
        }
        return (targets, targets.map { Int(perTarget[$0]) })
    }

    private static func ranks(_ a: (index: Int, score: Int), above b: (index: Int, score: Int)) -> Bool {
        a.score != b.score ? a.score > b.score : a.index < b.index
    }

    /// "keywords: agm, agenda; contact: Lisa".
    static func reason(_ matched: [Entry]) -> String {
        let groups: [(Entry.Kind, String, String)] = [
            (.keyword, "keyword", "keywords"), (.contact, "contact", "contacts"), (.targetName, "name", "names"),
            (.projectName, "project", "projects"), (.alias, "alias", "aliases"),
        ]
        var reason = ""
        for (kind, one, many) in groups {
            var labels = "", count = 0
            for entry in matched where entry.kind == kind {
                labels += count == 0 ? entry.label : ", " + entry.label
                count += 1
            }
            guard count > 0 else { continue }
            reason += (reason.isEmpty ? "" : "; ") + (count == 1 ? one : many) + ": " + labels
        }
        return reason
    }
}

extension RouteResolver {
    /// The baseline that resolver-bench compares against: the scoring pass
    /// over every target of the table, without the first-word index.
    public func scoreEveryTarget(_ input: String) -> Int {
        let text = NormalizedText(input, longest: longestWord)
        var best = 0
        for t in targets { best = max(best, score(t, text).score) }
        return best
    }
}

extension RouteResolver {
    /// One target's score for an input, and the entries that matched: what
    /// `frontdesk route` prints to explain a resolution.
    public struct TargetScore: Sendable, Equatable {
        public var route: RoutingTable.Route
        public var score: Int
        public var matched: [String]
    }

    /// Every target with a non-zero score, best first (ties in table order).
    public func explain(_ input: String) -> [TargetScore] {
        let text = NormalizedText(input, longest: longestWord)
        return targets.enumerated().compactMap { index, t -> (Int, TargetScore)? in
            let s = score(t, text)
            return s.score > 0 ? (index, TargetScore(route: t.route, score: s.score, matched: s.matched.map(\.label))) : nil
        }
        .sorted { $0.1.score != $1.1.score ? $0.1.score > $1.1.score : $0.0 < $1.0 }
        .map(\.1)
    }
}
