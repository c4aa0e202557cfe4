/// A small command-line reader: positionals, `--flag value`, `--flag=value`
/// and boolean `--switch`es. Mistakes are `UsageError`s (exit 2).
struct Arguments {
    var positionals: [String] = []
    var options: [String: String] = [:]
    var switches: Set<String> = []
    /// `-h` or `--help` appeared anywhere before `--`.
    var wantsHelp = false

    /// Anything that starts with `-` before a lone `--` is an option: an
    /// unknown one is a usage error, never taken as a value (`cancel -h` asks
    /// for help, it does not cancel a dispatch called "-h").
    init(_ args: [String], valued: Set<String>, switches known: Set<String>) throws(CLIUsageError) {
        var i = 0
        var optionsEnded = false
        while i < args.count {
            let a = args[i]
            if optionsEnded || !a.hasPrefix("-") || a == "-" {
                positionals.append(a)
            } else if a == "--" {
                optionsEnded = true
            } else if a == "-h" || a == "--help" {
                wantsHelp = true
            } else if a.hasPrefix("--") {
                var name = String(a.dropFirst(2))
                var value: String? = nil
                if let eq = name.firstIndex(of: "=") {
                    value = String(name[name.index(after: eq)...])
                    name = String(name[..<eq])
                }
                if known.contains(name) {
                    guard value == nil else { throw CLIUsageError("--\(name) takes no value") }
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
                throw CLIUsageError("unknown option \(a) (options are spelt --name; -h is help)")
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
