import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

// frontdesk-gateway: HTTP, server-sent events and the web Live Activity for
// apps and browsers (CONTRACT.md, Gateway).

let (configuration, values) = ServiceBootstrap.configurationOrExit(
    service: "frontdesk-gateway",
    summary: "HTTP and server-sent events for Front Desk dispatches, and the web Live Activity",
    defaultHTTPPort: 9103,
    extra: [
        .init("FRONTDESK_GATEWAY_PORT", default: "8080", help: "port of the HTTP API and the page"),
        .init("FRONTDESK_GATEWAY_TOKENS", default: "none: every /v1 request answers 401", help: "JSON file: token SHA-256 (hex) → user id"),
        .init(
            "FRONTDESK_GATEWAY_STREAMS_PER_USER", default: "\(GatewayState.defaultMaxStreamsPerUser)",
            help: "open event streams one user may hold (more answer 429)"),
        .init(
            "FRONTDESK_GATEWAY_REPLAY_BYTES", default: "\(GatewayState.defaultMaxReplayBytes)",
            help: "bytes of history one event stream replays before it ends for the client to resume with Last-Event-ID"),
        .init(
            "FRONTDESK_GATEWAY_STREAM_BUFFER_BYTES", default: "\(GatewayState.defaultStreamBufferBytes)",
            help: "bytes all event streams together may queue for clients; over it, the one that waited longest is cut off"),
    ])
let table = ServiceBootstrap.routingTableOrExit(configuration)

func exitWithUsage(_ message: String) -> Never {
    FileHandle.standardError.write(Data("frontdesk-gateway: \(message)\n".utf8))
    exit(2)
}

let port: Int
let streamsPerUser: Int
let replayBytes: Int
let streamBufferBytes: Int
do {
    port = try values.int("FRONTDESK_GATEWAY_PORT", default: 8080, in: 0...65535)
    streamsPerUser = try values.int(
        "FRONTDESK_GATEWAY_STREAMS_PER_USER", default: GatewayState.defaultMaxStreamsPerUser, in: 1...65_536)
    replayBytes = try values.int("FRONTDESK_GATEWAY_REPLAY_BYTES", default: GatewayState.defaultMaxReplayBytes, in: 1024...(1 << 30))
    streamBufferBytes = try values.int(
        "FRONTDESK_GATEWAY_STREAM_BUFFER_BYTES", default: GatewayState.defaultStreamBufferBytes, in: (1 << 20)...(1 << 40))
} catch {
    exitWithUsage(error.message)
}
// One stream at its own limit, in a buffer grown by doubling, must fit.
let oneStream = 2 * GatewayState.streamLimit(replayBytes: replayBytes)
guard streamBufferBytes >= oneStream else {
    exitWithUsage("FRONTDESK_GATEWAY_STREAM_BUFFER_BYTES must be at least \(oneStream) (twice FRONTDESK_GATEWAY_REPLAY_BYTES + 4 MiB), not \(streamBufferBytes)")
}
var tokens = GatewayTokens(users: [:])
var tokensStamp: TokenSource.Stamp?
if let path = values["FRONTDESK_GATEWAY_TOKENS"] {
    tokensStamp = TokenSource.stamp(of: path)
    guard let data = FileManager.default.contents(atPath: path) else { exitWithUsage("cannot read FRONTDESK_GATEWAY_TOKENS '\(path)'") }
    do {
        tokens = try GatewayTokens(json: data)
    } catch {
        exitWithUsage("FRONTDESK_GATEWAY_TOKENS: \(error.message)")
    }
}

/// The page's files, shipped as the target's resources.
func loadPage() -> [String: Data] {
    var files: [String: Data] = [:]
    for name in GatewayEndpoint.pageFiles {
        let parts = name.split(separator: ".")
        if let url = Bundle.module.url(forResource: String(parts[0]), withExtension: String(parts[1]), subdirectory: "Page"),
            let data = try? Data(contentsOf: url)
        {
            files[name] = data
        }
    }
    return files
}

// Only what the gateway uses: it publishes commands, reads the status log,
// and tails the status exchange through a queue of its own (the log's
// readers get events later, in chunks; the queue is the live path).
let liveQueue = GatewayService.liveQueuePrefix + UUID().uuidString.lowercased()
let bootstrap = ServiceBootstrap(configuration: configuration) { channel in
    try await channel.exchangeDeclare(SharedTopology.commandsExchange, type: "topic")
    try await channel.exchangeDeclare(SharedTopology.statusExchange, type: "topic")
    try await SharedTopology.declareStatusLog(on: channel)
    try await GatewayService.declareLiveQueue(liveQueue, on: channel)
}
let page = loadPage()
if page.count != GatewayEndpoint.pageFiles.count {
    bootstrap.logger.warning("the page's files are missing; / answers 404", [("found", .int(page.count))])
}
let gateway = GatewayService(
    client: bootstrap.client,
    settings: .init(
        tokens: tokens, tokensPath: values["FRONTDESK_GATEWAY_TOKENS"], tokensStamp: tokensStamp, table: table, lifetimeSeconds: configuration.lifetimeSeconds, login: configuration.login, liveQueue: liveQueue,
        maxStreamsPerUser: streamsPerUser, maxReplayBytes: replayBytes),
    logger: bootstrap.logger, metrics: bootstrap.metrics, page: page)

let api: AsyncHTTPServer
do {
    api = try AsyncHTTPServer(
        // A request head must fit the pool: GET /v1/route?input= with the longest
        // input (4,000 code points) is up to 48 KB percent-encoded.
        port: port, maxBody: IntakeClassifier.maxBodyBytes, connectionMemory: 64 << 10, streamBudget: streamBufferBytes,
        headers: ["Authorization", "Last-Event-ID"], query: ["input"],
        headCheck: { request in gateway.refusal(forHead: request) }, requireHost: true
    ) { request, responder in
        Task { await gateway.handle(request, responder) }
    }
} catch {
    bootstrap.logger.error("cannot serve the API", [("port", .int(port)), ("error", .string("\(error)"))])
    exit(1)
}
let probes = bootstrap.startProbes(isReady: { gateway.isReady })
bootstrap.logger.info("starting", [
    ("broker", .string("\(configuration.amqp.url)")),
    ("port", .int(api.port)),
    ("users", .int(Set(tokens.users.values).count)),
    ("targets", .int(table.routes.count)),
])
let status = await ServiceLifecycle.run(bootstrap.lifecycleServices([AMQPClientService(client: bootstrap.client), gateway]), logger: bootstrap.logger)
api.stop()
probes?.stop()
bootstrap.logger.info("stopped", [("status", .int(Int(status)))])
exit(status)
