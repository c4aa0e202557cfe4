import Foundation
import FrontDeskModel

/// `frontdesk route "text" [--routes FILE]`: how the resolver decides, and why.
func routeCommand(_ args: Arguments) throws -> Int32 {
    guard args.positionals.count == 1 else { throw CLIUsageError("route takes the request text as one argument") }
    let table = try loadTable(args.options["routes"])
    let resolver = RouteResolver(table: table)
    let input = args.positionals[0]
    let result = resolver.resolve(input: input, projectHint: args.options["project"], targetHint: args.options["target"])
    if args.switches.contains("json") {
        switch result {
        case .success(let r):
            emit(jsonText([
                "route": r.route.description, "confidence": r.confidence, "reason": r.reason, "source": r.source.rawValue,
                "alternatives": r.alternatives.map { ["route": $0.route.description, "confidence": $0.confidence] },
            ]))
            return 0
        case .failure(let f):
            emit(jsonText(["error": ["code": f.code, "message": f.message]]))
            return 1
        }
    }
    for s in resolver.explain(input) {
        print("  \(s.route.description.padding(toLength: 28, withPad: " ", startingAt: 0)) score \(s.score)  \(s.matched.joined(separator: ", "))")
    }
    switch result {
    case .success(let r):
        print("→ \(r.route.description)  confidence \(r.confidence)  (\(r.source.rawValue): \(r.reason))")
        for a in r.alternatives { print("  alternative \(a.route.description)  confidence \(a.confidence)") }
        return 0
    case .failure(let f):
        print("→ no route: \(f.code): \(f.message)")
        return 1
    }
}

/// `frontdesk routes check FILE`.
func routesCheckCommand(_ args: Arguments) throws -> Int32 {
    guard args.positionals.count == 2, args.positionals[0] == "check" else { throw CLIUsageError("usage: frontdesk routes check FILE") }
    let table = try loadTable(args.positionals[1])
    if args.switches.contains("json") {
        emit(jsonText(["ok": true, "projects": table.projects.count, "targets": table.routes.count, "default": (table.defaultRoute?.description as Any?) ?? NSNull()]))
        return 0
    }
    print("ok: \(table.projects.count) projects, \(table.routes.count) targets, default \(table.defaultRoute?.description ?? "none")")
    return 0
}

func loadTable(_ path: String?) throws -> RoutingTable {
    do { return try RoutingTable.load(path: path) } catch { throw CLIRuntimeError(error.message) }
}
