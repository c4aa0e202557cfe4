/// Every command of `frontdesk`: its synopsis, what it does, and its options.
/// `frontdesk COMMAND -h` prints the command's entry; `frontdesk -h` all.
struct CommandSpec {
    var name: String
    var synopsis: String
    var summary: String
    var details: [String] = []
    var valued: Set<String> = []
    var switches: Set<String> = []

    static let version = "frontdesk 1.1.0 (wire contract v1.1)"

    /// Options every command takes.
    static let commonValued: Set<String> = ["amqp-url"]
    static let commonSwitches: Set<String> = ["json"]

    static let all: [CommandSpec] = [
        CommandSpec(
            name: "dispatch", synopsis: #"dispatch "text" [--project P] [--target T] [--thread ID] [--user U] [--id ID] [--detach]"#,
            summary: "sends a request and follows it live to its end",
            details: [
                "On a terminal the activity redraws in place (the elapsed time ticks) under its id:",
                "  c cancels the dispatch, e edits its route while it is queued, q leaves it running.",
                "  Ctrl-C asks whether to cancel it. --detach prints the id and returns at once.",
                "Without a terminal, or with --json: one status event (JSON) a line.",
                "Exit 0 when the agent replied, 1 when it failed or was cancelled (or detached on failure to reach the broker).",
            ],
            valued: ["project", "target", "thread", "user", "id"], switches: ["detach"]),
        CommandSpec(
            name: "show", synopsis: "show ID", summary: "a dispatch's latest state and its event history, from the status log",
            details: ["Exit 1 when no event of ID is in the status log (within --lifetime-s, default 14400)."],
            valued: ["lifetime-s"]),
        CommandSpec(
            name: "list", synopsis: "list [--state S] [--target T]",
            summary: "dispatches of the lifetime window with their current state",
            details: ["--state: drafted, routing, sending, queued, replied, failed, cancelled, or open (not ended).",
                      "--target: a target id, or PROJECT/TARGET."],
            valued: ["state", "target", "lifetime-s"]),
        CommandSpec(
            name: "targets", synopsis: "targets [--routes FILE]",
            summary: "each target of the routing table with its presence (agents online) and parked count",
            valued: ["routes"]),
        CommandSpec(
            name: "cancel", synopsis: "cancel ID [--reason R]", summary: "cancels a dispatch (in any state before its end)",
            valued: ["reason"]),
        CommandSpec(
            name: "reroute", synopsis: "reroute ID PROJECT/TARGET", summary: "moves a dispatch not yet delivered to another target"),
        CommandSpec(
            name: "watch", synopsis: "watch [PATTERN] [--format json|lines|apns]",
            summary: "every dispatch in flight as it moves (default pattern status.#), from the status log",
            valued: ["format", "lifetime-s"]),
        CommandSpec(
            name: "dead", synopsis: "dead list [--limit N] | dead replay MESSAGE_ID",
            summary: "dead letters: list them (left in place), or redrive one to frontdesk.commands",
            details: ["replay publishes the dead letter's body again with its routing key, removes it from",
                      "frontdesk.dead, and prints an audit line (who, when, what) on stderr."],
            valued: ["limit"]),
        CommandSpec(
            name: "route", synopsis: #"route "text" [--routes FILE] [--project P] [--target T]"#,
            summary: "how the resolver routes a text, and why (no broker needed)",
            valued: ["routes", "project", "target"]),
        CommandSpec(name: "routes", synopsis: "routes check FILE", summary: "checks a routing table file (exit 2 names the problem)"),
        CommandSpec(
            name: "agent", synopsis: "agent --target PROJECT/TARGET [--sender-login L] [--delay-ms N] [--fail-retryable N] [--fail] [--no-eta] [--instant]",
            summary: "runs a reference agent for one target",
            details: [
                "--sender-login L (default: FRONTDESK_SENDER_LOGIN) takes only tasks the broker vouches L published",
                "  (their user_id); others — forged into the queue by the default exchange — are rejected and logged.",
            ],
            valued: ["target", "delay-ms", "fail-retryable", "sender-login"], switches: ["fail", "no-eta", "instant"]),
    ]

    static func named(_ name: String) -> CommandSpec? { all.first { $0.name == name } }

    var help: String {
        var lines = ["usage: frontdesk \(synopsis)", "", summary.prefix(1).uppercased() + summary.dropFirst() + "."]
        if !details.isEmpty { lines += [""] + details }
        lines += ["", "Every command takes --amqp-url URL (default: AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/%2f),",
                  "--json (machine-readable output) and -h/--help."]
        return lines.joined(separator: "\n")
    }

    static var usage: String {
        var lines = ["frontdesk — the Front Desk command line", ""]
        for c in all { lines.append("  frontdesk \(c.synopsis)") }
        lines += [
            "",
            "frontdesk COMMAND -h explains one command. Every command takes --amqp-url URL",
            "(default: AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/%2f), --json and -h/--help; --version.",
            "Exit status: 0 done, 1 runtime failure (or a dispatch that did not end replied), 2 usage.",
        ]
        return lines.joined(separator: "\n")
    }
}
