/// A small command-line reader: positionals, `--flag value`, `--flag=value`
/// and boolean `--switch`es. Mistakes are `UsageError`s (exit 2).
struct Arguments {
    var positionals: [String] = []
    var options: [String: String] = [:]
    var switches: Set<String> = []

    init(_ args: [String], valued: Set<String>, switches known: Set<String>) throws(CLIUsageError) {
        var i = 0
        while i < args.count {
            let a = args[i]
            if a.hasPrefix("--") {
                var name = String(a.dropFirst(2))
                var value: String? = nil
                if let eq = name.firstIndex(of: "=") {
                    value = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                if known.contains(name) {
                    switches.insert(name)
                } else if valued.contains(name) {
                    if value == nil {
                        guard i + 1 < args.count else { throw CLIUsageError("option --\(name) needs a value") }
                        i += 1
                        value = args[i]
                    }
                    options[name] = value
                } else {
                    throw CLIUsageError("unknown option --\(name)")
                }
            } else {
                positionals.append(a)
            }
            i += 1
        }
    }

    func int(_ name: String, default d: Int) throws(CLIUsageError) -> Int {
        guard let v = options[name] else { return d }
        guard let n = Int(v), n >= 0 else { throw CLIUsageError("--\(name) must be a whole number, not '\(v)'") }
        return n
    }
}

/// A usage mistake: one sentence on stderr, exit 2.
struct CLIUsageError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// A failure at run time: one sentence on stderr, exit 1.
struct CLIRuntimeError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}
