import Foundation

// frontdesk: dispatch, follow, cancel and reroute requests; explain routes;
// run a reference agent; watch every dispatch in flight.

let usage = """
    frontdesk — the Front Desk command line

      frontdesk dispatch "text" [--project P] [--target T] [--thread ID] [--user U] [--id ID] [--json]
      frontdesk watch [PATTERN] [--format json|lines|apns]   (default pattern status.#)
      frontdesk cancel ID [--reason R]
      frontdesk reroute ID PROJECT/TARGET
      frontdesk route "text" [--routes FILE] [--project P] [--target T]
      frontdesk routes check FILE
      frontdesk agent --target PROJECT/TARGET [--delay-ms N] [--fail-retryable N] [--fail] [--no-eta] [--instant]

    Every command takes --amqp-url URL (default: AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/%2f).
    Exit status: 0 done, 1 runtime failure (or a dispatch that did not end replied), 2 usage.
    """

let all = Array(CommandLine.arguments.dropFirst())
guard let command = all.first, command != "--help", command != "-h" else {
    print(usage)
    exit(all.isEmpty ? 2 : 0)
}
let rest = Array(all.dropFirst())
if rest.contains("--help") {
    print(usage)
    exit(0)
}
let valued: Set<String> = ["amqp-url", "project", "target", "thread", "user", "id", "reason", "routes", "delay-ms", "fail-retryable", "lifetime-s", "format"]
let switches: Set<String> = ["json", "fail", "no-eta", "instant"]
do {
    let args = try Arguments(rest, valued: valued, switches: switches)
    let status: Int32
    switch command {
    case "dispatch": status = try await dispatchCommand(args)
    case "cancel", "reroute": status = try await controlCommand(command, args)
    case "route": status = try routeCommand(args)
    case "routes": status = try routesCheckCommand(args)
    case "agent": status = try await agentCommand(args)
    case "watch": status = try await watchCommand(args)
    default: throw CLIUsageError("unknown command '\(command)'; frontdesk --help lists the commands")
    }
    exit(status)
} catch let error as CLIUsageError {
    FileHandle.standardError.write(Data("frontdesk: \(error.description)\n".utf8))
    exit(2)
} catch {
    FileHandle.standardError.write(Data("frontdesk: \(error)\n".utf8))
    exit(1)
}
