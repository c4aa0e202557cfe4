/// One setting a service reads: an environment variable that is also a
/// command-line option (`FRONTDESK_LIFETIME_S` ↔ `--lifetime-s`).
public struct OptionSpecification: Sendable {
    public var variable: String
    public var flag: String
    public var defaultDescription: String
    public var help: String

    /// `flag` defaults to the variable in kebab case without the `FRONTDESK_` prefix.
    public init(_ variable: String, flag: String? = nil, default defaultDescription: String, help: String) {
        self.variable = variable
        self.flag = flag ?? OptionSpecification.flagName(for: variable)
        self.defaultDescription = defaultDescription
        self.help = help
    }

    /// The variable itself in kebab case (`--frontdesk-lifetime-s`): taken as
    /// well, as CONTRACT.md's "`AMQP_URL` … `--amqp-url`" reads for every variable.
    var fullFlag: String { Self.kebabFlag(variable) }

    static func flagName(for variable: String) -> String {
        var name = variable
        if name.hasPrefix("FRONTDESK_") { name.removeFirst("FRONTDESK_".count) }
        return kebabFlag(name)
    }

    /// `FRONTDESK_LIFETIME_S` → `--frontdesk-lifetime-s`.
    private static func kebabFlag(_ name: String) -> String { "--" + name.lowercased().replacingOccurrences(of: "_", with: "-") }
}

/// A usage mistake: the message says what is wrong in one sentence; exit 2.
public struct UsageError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The values given for a set of options: command-line flags win over the
/// environment; unset ones are nil and take their defaults where they are read.
public struct OptionValues: Sendable {
    public private(set) var values: [String: String]

    public init(values: [String: String] = [:]) { self.values = values }

    public subscript(variable: String) -> String? {
        guard let v = values[variable], !v.isEmpty else { return nil }
        return v
    }

    public func string(_ variable: String, default value: String) -> String {
        self[variable] ?? value
    }

    public func int(_ variable: String, default value: Int, in range: ClosedRange<Int>) throws(UsageError) -> Int {
        guard let text = self[variable] else { return value }
        guard let n = Int(text.trimmingCharacters(in: .whitespaces)), range.contains(n) else {
            throw UsageError("\(variable) must be a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text)'")
        }
        return n
    }
}

/// Reads options from the environment and the command line.
public enum OptionReader {
    public enum Outcome: Sendable {
        case values(OptionValues)
        /// `--help` was asked for: print this and exit 0.
        case help(String)
    }

    public static func read(
        _ specifications: [OptionSpecification], arguments: [String], environment: [String: String],
        program: String, summary: String
    ) throws(UsageError) -> Outcome {
        var values: [String: String] = [:]
        for spec in specifications {
            if let v = environment[spec.variable] { values[spec.variable] = v }
        }
        var i = 0
        while i < arguments.count {
            let argument = arguments[i]
            if argument == "--help" || argument == "-h" {
                return .help(usage(specifications, program: program, summary: summary))
            }
            var flag = argument
            var inline: String? = nil
            if let eq = argument.firstIndex(of: "="), argument.hasPrefix("--") {
                flag = String(argument[..<eq])
                inline = String(argument[argument.index(after: eq)...])
            }
            guard let spec = specifications.first(where: { $0.flag == flag }) ?? specifications.first(where: { $0.fullFlag == flag }) else {
                throw UsageError("unknown option '\(flag)'; \(program) --help lists the options")
            }
            if let inline {
                values[spec.variable] = inline
            } else {
                guard i + 1 < arguments.count else { throw UsageError("option \(flag) needs a value") }
                i += 1
                values[spec.variable] = arguments[i]
            }
            i += 1
        }
        return .values(OptionValues(values: values))
    }

    public static func usage(_ specifications: [OptionSpecification], program: String, summary: String) -> String {
        var lines = ["\(program) — \(summary)", "", "Usage: \(program) [options]", "",
                     "Each option is also an environment variable; a flag wins over the variable.", ""]
        let width = specifications.map { $0.flag.count + $0.variable.count + 9 }.max() ?? 0
        for s in specifications {
            let left = "  \(s.flag) VALUE (\(s.variable))"
            lines.append(left.padding(toLength: max(width, left.count) + 2, withPad: " ", startingAt: 0) + s.help
                + (s.defaultDescription.isEmpty ? "" : " [default: \(s.defaultDescription)]"))
        }
        lines.append("  --help".padding(toLength: width + 2, withPad: " ", startingAt: 0) + "show this help")
        return lines.joined(separator: "\n")
    }
}

import Foundation
