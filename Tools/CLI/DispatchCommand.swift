import AMQP
import Dispatch
import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

/// `frontdesk dispatch "text"`: publishes a request and follows it to its
/// end. Exit 0 when the agent replied, 1 when it failed or was cancelled.
/// On a terminal it is the Live Activity: redrawn in place, with keys.
func dispatchCommand(_ args: Arguments) async throws -> Int32 {
    guard args.positionals.count == 1, let input = args.positionals.first else {
        throw CLIUsageError("dispatch takes the request text as one argument (put -- before a text that starts with -)")
    }
    let id = try args.options["id"].map { try requireID($0, "dispatch id") } ?? UUID().uuidString.lowercased()
    let json = args.switches.contains("json") || !stdoutIsTerminal
    let connection = try await connect(args, name: "dispatch")
    defer { Task { await connection.close() } }
    var body: [String: Any] = ["id": id, "input": input, "createdAt": RFC3339.format(Date())]
    for (flag, field) in [("project", "project"), ("target", "target"), ("thread", "threadId"), ("user", "user")] {
        if let v = args.options[flag] { body[field] = v }
    }
    if args.switches.contains("detach") {
        // Publishing is all a producer's user may do: nothing is read.
        try await publishCommand(connection, routingKey: CommandKey.request, body: body)
        emit(json ? jsonText(["id": id, "detached": true]) : "dispatch \(id) sent; follow it with: frontdesk show \(id)")
        return 0
    }
    // A queue of our own on the status exchange, bound before the request goes out.
    let channel = try await connection.openChannel()
    let queue: QueueDeclareResult
    // The services declare the exchanges; a producer's user may not (least privilege).
    do {
        queue = try await channel.queueDeclare("", durable: false, exclusive: true, autoDelete: true)
        try await channel.queueBind(queue.name, exchange: SharedTopology.statusExchange, routingKey: "status.#")
    } catch let error as AMQPError where error.replyCode == 404 {
        throw CLIRuntimeError("the exchange frontdesk.status does not exist yet: start frontdesk-router or frontdesk-sender once")
    } catch let error as AMQPError where error.replyCode == 403 {
        throw CLIRuntimeError("this user may not read frontdesk.status (\(error.message)): follow dispatches as an operator, or use --detach")
    }
    try await publishCommand(connection, routingKey: CommandKey.request, body: body)
    let events = try await channel.consume(queue: queue.name, noAck: true)
    if !json && isatty(0) == 1 {
        return try await LiveTerminal(id: id, connection: connection, args: args).follow(events)
    }
    if !json { emit("dispatch \(id)") }
    var state = LiveActivityState()
    for try await d in events {
        guard d.properties.correlationID == id, let event = try? JSONDecoder().decode(StatusEvent.self, from: d.body) else { continue }
        guard state.apply(event) else { continue }
        if json {
            emit(String(decoding: d.body, as: UTF8.self))
        } else if let view = state.view(now: Date()) {
            emit(Render.line(view))
        }
        if event.state.isTerminal { return event.state == .replied ? 0 : 1 }
    }
    throw CLIRuntimeError("the connection to the broker ended before the dispatch did")
}

/// `frontdesk cancel ID [--reason R]` and `frontdesk reroute ID PROJECT/TARGET`.
func controlCommand(_ command: String, _ args: Arguments) async throws -> Int32 {
    let json = args.switches.contains("json")
    if command == "cancel" {
        guard args.positionals.count == 1 else { throw CLIUsageError("cancel takes a dispatch id") }
        let id = try requireID(args.positionals[0], "dispatch id")
        let connection = try await connect(args, name: "cancel")
        try await publishCommand(connection, routingKey: CommandKey.cancel, body: ["id": id, "reason": args.options["reason"] ?? "user"])
        await connection.close()
        emit(json ? jsonText(["id": id, "sent": CommandKey.cancel]) : "cancel of \(id) sent")
    } else {
        guard args.positionals.count == 2, case let parts = args.positionals[1].split(separator: "/"), parts.count == 2 else {
            throw CLIUsageError("reroute takes a dispatch id and PROJECT/TARGET")
        }
        let id = try requireID(args.positionals[0], "dispatch id")
        let connection = try await connect(args, name: "reroute")
        try await publishCommand(connection, routingKey: CommandKey.reroute, body: ["id": id, "project": String(parts[0]), "target": String(parts[1])])
        await connection.close()
        emit(json ? jsonText(["id": id, "sent": CommandKey.reroute, "route": args.positionals[1]]) : "reroute of \(id) to \(args.positionals[1]) sent")
    }
    return 0
}

/// The Live Activity on a terminal: redrawn in place as events come and as
/// the elapsed time ticks; `c` cancels, `e` edits the route while queued,
/// `q` leaves it running; Ctrl-C asks whether to cancel.
final class LiveTerminal: Sendable {
    enum Input: Sendable {
        case event(StatusEvent)
        case key(UInt8)
        case tick
        case interrupt
        case ended
    }

    let id: String
    let connection: AMQPConnection
    let args: Arguments

    init(id: String, connection: AMQPConnection, args: Arguments) {
        self.id = id
        self.connection = connection
        self.args = args
    }

    func follow(_ events: AMQPConsumer) async throws -> Int32 {
        let (inputs, feed) = AsyncStream<Input>.makeStream()
        let id = id
        let eventTask = Task {
            for try await d in events {
                guard d.properties.correlationID == id, let e = try? JSONDecoder().decode(StatusEvent.self, from: d.body) else { continue }
                feed.yield(.event(e))
            }
            feed.yield(.ended)
        }
        let ticker = Task {
            while !Task.isCancelled {
                try await Task.sleep(for: .milliseconds(250))
                feed.yield(.tick)
            }
        }
        let terminal = RawTerminal()
        terminal.enter()
        defer { terminal.leave() }
        Thread.detachNewThread {
            var byte: UInt8 = 0
            while read(0, &byte, 1) == 1 { feed.yield(.key(byte)) }
        }
        signal(SIGINT, SIG_IGN)
        let interrupts = DispatchSource.makeSignalSource(signal: SIGINT, queue: .global())
        interrupts.setEventHandler { feed.yield(.interrupt) }
        interrupts.resume()
        defer {
            interrupts.cancel()
            ticker.cancel()
            eventTask.cancel()
        }

        var state = LiveActivityState()
        var drawn = 0
        var prompt: String? = nil
        var editing: String? = nil  // the route typed so far, while editing
        var asking = false  // Ctrl-C asked whether to cancel
        var notice = "dispatch \(id)"
        func draw() {
            var text = notice + "\n"
            if let view = state.view(now: Date()) { text += ActivityRenderer.render(view, .lockScreen, colour: Render.colour) + "\n" }
            text += (prompt ?? keysLine(state)) + "\n"
            var out = drawn > 0 ? "\u{1B}[\(drawn)F\u{1B}[J" : ""
            out += text  // output processing (OPOST) stays on in raw mode: \n is still a new line
            drawn = text.filter { $0 == "\n" }.count
            FileHandle.standardOutput.write(Data(out.utf8))
        }
        draw()
        for await input in inputs {
            switch input {
            case .event(let e):
                guard state.apply(e) else { continue }
                draw()
                if e.state.isTerminal { return e.state == .replied ? 0 : 1 }
            case .tick:
                draw()
            case .ended:
                throw CLIRuntimeError("the connection to the broker ended before the dispatch did")
            case .interrupt:
                asking = true
                prompt = "Cancel dispatch \(id)? [y/N] "
                draw()
            case .key(let k):
                if asking {
                    asking = false
                    prompt = nil
                    if k == UInt8(ascii: "y") || k == UInt8(ascii: "Y") {
                        try await cancel(&notice)
                    } else {
                        notice = "left running: frontdesk show \(id)"
                        draw()
                        return 0
                    }
                    draw()
                } else if var typed = editing {
                    if k == 13 || k == 10 {
                        editing = nil
                        prompt = nil
                        if !typed.isEmpty { try await reroute(typed, &notice) }
                    } else if k == 27 {
                        editing = nil
                        prompt = nil
                    } else if k == 127 || k == 8 {
                        if !typed.isEmpty { typed.removeLast() }
                        editing = typed
                        prompt = "New route (PROJECT/TARGET, Enter to send, Esc to keep): \(typed)"
                    } else if k >= 32, k < 127 {
                        typed.append(Character(UnicodeScalar(k)))
                        editing = typed
                        prompt = "New route (PROJECT/TARGET, Enter to send, Esc to keep): \(typed)"
                    }
                    draw()
                } else if k == UInt8(ascii: "c") {
                    try await cancel(&notice)
                    draw()
                } else if k == UInt8(ascii: "e"), state.latest?.state == .queued {
                    editing = ""
                    prompt = "New route (PROJECT/TARGET, Enter to send, Esc to keep): "
                    draw()
                } else if k == UInt8(ascii: "q") {
                    notice = "left running: frontdesk show \(id)"
                    draw()
                    return 0
                }
            }
        }
        return 1
    }

    private func keysLine(_ state: LiveActivityState) -> String {
        guard let e = state.latest, !e.state.isTerminal else { return "" }
        return e.state == .queued ? "c cancel · e edit route · q leave it running" : "c cancel · q leave it running"
    }

    private func cancel(_ notice: inout String) async throws {
        try await publishCommand(connection, routingKey: CommandKey.cancel, body: ["id": id, "reason": "user"])
        notice = "dispatch \(id) · cancel sent"
    }

    private func reroute(_ route: String, _ notice: inout String) async throws {
        let parts = route.split(separator: "/")
        guard parts.count == 2 else {
            notice = "dispatch \(id) · '\(route)' is not PROJECT/TARGET"
            return
        }
        try await publishCommand(connection, routingKey: CommandKey.reroute, body: ["id": id, "project": String(parts[0]), "target": String(parts[1])])
        notice = "dispatch \(id) · reroute to \(route) sent"
    }
}

/// The terminal in raw mode (no echo, no line buffering; Ctrl-C still
/// signals) while the activity is shown; restored on leave.
final class RawTerminal: @unchecked Sendable {
    // @unchecked: touched only by the task that follows the dispatch.
    private var saved = termios()
    private var active = false

    func enter() {
        guard isatty(0) == 1, tcgetattr(0, &saved) == 0 else { return }
        var raw = saved
        raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
        raw.c_cc.6 = 1  // VMIN
        raw.c_cc.5 = 0  // VTIME
        if tcsetattr(0, TCSANOW, &raw) == 0 { active = true }
        FileHandle.standardOutput.write(Data("\u{1B}[?25l".utf8))  // hide the cursor
    }

    func leave() {
        FileHandle.standardOutput.write(Data("\u{1B}[?25h".utf8))
        if active { tcsetattr(0, TCSANOW, &saved) }
        active = false
    }
}
