import Foundation

/// The routing table (CONTRACT.md, Routing table), validated.
public struct RoutingTable: Sendable, Equatable {
    public struct Target: Sendable, Equatable {
        public var id: String
        public var name: String
        public var keywords: [String]
        public var contacts: [String]
    }

    public struct Project: Sendable, Equatable {
        public var id: String
        public var name: String
        public var accent: String?
        public var glyph: String
        public var aliases: [String]
        public var targets: [Target]
    }

    public struct Route: Sendable, Hashable {
        public var project: String
        public var target: String
        public init(project: String, target: String) {
            self.project = project
            self.target = target
        }
        public var description: String { "\(project)/\(target)" }
    }

    public var projects: [Project]
    public var defaultRoute: Route?

    public func project(_ id: String) -> Project? { projects.first { $0.id == id } }

    public func target(_ route: Route) -> (Project, Target)? {
        guard let p = project(route.project), let t = p.targets.first(where: { $0.id == route.target }) else { return nil }
        return (p, t)
    }

    /// The project and target of a route as status events show them.
    public func eventParts(_ route: Route) -> (project: StatusEvent.Project, target: StatusEvent.Target)? {
        guard let (p, t) = target(route) else { return nil }
        return (StatusEvent.Project(id: p.id, name: p.name, glyph: p.glyph, accent: p.accent), StatusEvent.Target(id: t.id, name: t.name))
    }

    /// Every route of the table, in table order.
    public var routes: [Route] {
        projects.flatMap { p in p.targets.map { Route(project: p.id, target: $0.id) } }
    }

    /// The project's initials: two letters of a one-word name ("Yemaya" →
    /// "YE"), else the first letters of the first two words ("Acme Corp" → "AC").
    public static func glyph(for name: String) -> String {
        let words = name.split(whereSeparator: { $0.isWhitespace || $0 == "-" || $0 == "_" })
        let letters: [Character]
        if words.count >= 2 {
            letters = [words[0].first!, words[1].first!]
        } else if let word = words.first {
            letters = Array(word.prefix(2))
        } else {
            letters = []
        }
        return String(letters).uppercased()
    }
}

/// Why a routing table was refused; the message names the problem.
public struct RoutingTableError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

extension RoutingTable {
    private struct FileTarget: Decodable {
        var id: String
        var name: String?
        var keywords: [String]?
        var contacts: [String]?
    }

    private struct FileProject: Decodable {
        var id: String
        var name: String?
        var accent: String?
        var glyph: String?
        var aliases: [String]?
        var targets: [FileTarget]?
    }

    private struct FileTable: Decodable {
        var projects: [FileProject]?
        var `default`: FileRoute?
    }

    private struct FileRoute: Decodable {
        var project: String
        var target: String
    }

    /// Parses and validates a table: ids, duplicates, projects without
    /// targets and the default route.
    public init(json: Data) throws(RoutingTableError) {
        let file: FileTable
        do {
            file = try JSONDecoder().decode(FileTable.self, from: json)
        } catch let DecodingError.keyNotFound(key, context) {
            throw RoutingTableError("the routing table lacks '\(key.stringValue)' at \(Self.path(context.codingPath))")
        } catch let DecodingError.typeMismatch(_, context) {
            throw RoutingTableError("the routing table has a wrong type at \(Self.path(context.codingPath))")
        } catch {
            throw RoutingTableError("the routing table is not valid JSON")
        }
        guard let fileProjects = file.projects, !fileProjects.isEmpty else {
            throw RoutingTableError("the routing table has no projects, so no target")
        }
        var projects: [Project] = []
        var seenProjects = Set<String>()
        for fp in fileProjects {
            guard Identifiers.isValidTableID(fp.id) else {
                throw RoutingTableError("project id '\(fp.id)' is not valid: ids are [a-z0-9][a-z0-9-]{0,62}")
            }
            guard seenProjects.insert(fp.id).inserted else {
                throw RoutingTableError("project id '\(fp.id)' appears twice")
            }
            guard let fileTargets = fp.targets, !fileTargets.isEmpty else {
                throw RoutingTableError("project '\(fp.id)' has no target")
            }
            var targets: [Target] = []
            var seenTargets = Set<String>()
            for ft in fileTargets {
                guard Identifiers.isValidTableID(ft.id) else {
                    throw RoutingTableError("target id '\(ft.id)' of project '\(fp.id)' is not valid: ids are [a-z0-9][a-z0-9-]{0,62}")
                }
                guard seenTargets.insert(ft.id).inserted else {
                    throw RoutingTableError("target id '\(ft.id)' appears twice in project '\(fp.id)'")
                }
                targets.append(Target(id: ft.id, name: ft.name ?? ft.id, keywords: ft.keywords ?? [], contacts: ft.contacts ?? []))
            }
            let name = fp.name ?? fp.id
            let glyph = fp.glyph.map { $0.trimmingCharacters(in: .whitespaces) }.flatMap { $0.isEmpty ? nil : $0 }
            projects.append(Project(
                id: fp.id, name: name, accent: fp.accent, glyph: glyph ?? Self.glyph(for: name),
                aliases: fp.aliases ?? [], targets: targets))
        }
        self.projects = projects
        if let d = file.default {
            let route = Route(project: d.project, target: d.target)
            guard target(route) != nil else {
                throw RoutingTableError("the default route \(d.project)/\(d.target) names no target of the table")
            }
            defaultRoute = route
        }
    }

    /// Loads a table from a file, or the shipped example for nil.
    public static func load(path: String?) throws(RoutingTableError) -> RoutingTable {
        guard let path else { return try example() }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw RoutingTableError("cannot read the routing table \(path)")
        }
        do {
            return try RoutingTable(json: data)
        } catch {
            throw RoutingTableError("\(path): \(error.message)")
        }
    }

    /// The example table shipped with the project (Resources/routes.example.json).
    public static func example() throws(RoutingTableError) -> RoutingTable {
        guard let url = Bundle.module.url(forResource: "routes.example", withExtension: "json"),
            let data = try? Data(contentsOf: url)
        else { throw RoutingTableError("the shipped example routing table is missing") }
        return try RoutingTable(json: data)
    }

    private static func path(_ keys: [any CodingKey]) -> String {
        keys.isEmpty ? "the top level" : keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
    }
}
