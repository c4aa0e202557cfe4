import Foundation

// frontdesk: dispatch, follow, cancel and reroute requests; inspect
// dispatches, targets and dead letters; explain routes; run a reference
// agent; watch every dispatch in flight.

let all = Array(CommandLine.arguments.dropFirst())
if all.contains("--version") {
    print(CommandSpec.version)
    exit(0)
}
guard let command = all.first, !command.hasPrefix("-") else {
    let askedForHelp = all.first == "-h" || all.first == "--help"
    (askedForHelp ? FileHandle.standardOutput : FileHandle.standardError).write(Data((CommandSpec.usage + "\n").utf8))
    exit(askedForHelp ? 0 : 2)
}
do {
    guard let spec = CommandSpec.named(command) else {
        throw CLIUsageError("unknown command '\(command)'; frontdesk --help lists the commands")
    }
    let args = try Arguments(
        Array(all.dropFirst()), valued: spec.valued.union(CommandSpec.commonValued), switches: spec.switches.union(CommandSpec.commonSwitches))
    if args.wantsHelp {
        print(spec.help)
        exit(0)
    }
    let status: Int32
    switch command {
    case "dispatch": status = try await dispatchCommand(args)
    case "cancel", "reroute": status = try await controlCommand(command, args)
    case "show": status = try await showCommand(args)
    case "list": status = try await listCommand(args)
    case "targets": status = try await targetsCommand(args)
    case "dead": status = try await deadCommand(args)
    case "route": status = try routeCommand(args)
    case "routes": status = try routesCheckCommand(args)
    case "agent": status = try await agentCommand(args)
    default: status = try await watchCommand(args)
    }
    exit(status)
} catch let error as CLIUsageError {
    FileHandle.standardError.write(Data("frontdesk: \(error.description)\n".utf8))
    exit(2)
} catch {
    FileHandle.standardError.write(Data("frontdesk: \(error)\n".utf8))
    exit(1)
}
