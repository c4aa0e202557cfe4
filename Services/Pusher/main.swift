import AMQP
import Foundation
import FrontDeskModel
import ServiceKit

// frontdesk-pusher: Live Activity updates through APNs for every dispatch
// with a registered push token (CONTRACT.md, Live Activity pushes).

let (configuration, values) = ServiceBootstrap.configurationOrExit(
    service: "frontdesk-pusher",
    summary: "pushes each dispatch's status to its iOS Live Activity through APNs",
    defaultHTTPPort: 9104,
    extra: [
        .init("FRONTDESK_APNS_URL", default: "Apple's production or sandbox host, by the registration", help: "APNs base URL"),
        .init("FRONTDESK_APNS_BUNDLE_ID", default: "none (required)", help: "the app's bundle id; the topic adds .push-type.liveactivity"),
        .init("FRONTDESK_APNS_KEY_FILE", default: "none (required)", help: "the APNs signing key (.p8, EC P-256, PEM)"),
        .init("FRONTDESK_APNS_KEY_ID", default: "none (required)", help: "the key's id (the JWT's kid)"),
        .init("FRONTDESK_APNS_TEAM_ID", default: "none (required)", help: "the team id (the JWT's iss)"),
        .init("FRONTDESK_APNS_CA_FILE", default: "the system's trust store", help: "CA that signs the APNs host (a private stand-in)"),
        .init(
            "FRONTDESK_APNS_GIVE_UP_S", default: "\(PushScheduler.defaultGiveUpSeconds)",
            help: "seconds of failed pushes (429, 5xx, no answer) in a row after which a dispatch's pending update is dropped"),
    ])

func exitWithUsage(_ message: String) -> Never {
    FileHandle.standardError.write(Data("frontdesk-pusher: \(message)\n".utf8))
    exit(2)
}

func required(_ variable: String) -> String {
    guard let value = values[variable], !value.isEmpty else { exitWithUsage("\(variable) is required") }
    return value
}

let bundleID = required("FRONTDESK_APNS_BUNDLE_ID")
let keyFile = required("FRONTDESK_APNS_KEY_FILE")
let keyID = required("FRONTDESK_APNS_KEY_ID")
let teamID = required("FRONTDESK_APNS_TEAM_ID")
let giveUpSeconds: Int
do {
    giveUpSeconds = try values.int("FRONTDESK_APNS_GIVE_UP_S", default: PushScheduler.defaultGiveUpSeconds, in: 1...31_536_000)
} catch {
    exitWithUsage(error.message)
}
let key: SigningKey
do {
    key = try SigningKey(path: keyFile)
} catch {
    exitWithUsage("FRONTDESK_APNS_KEY_FILE '\(keyFile)': \(error)")
}
let apns: APNsClient
do {
    apns = try APNsClient(caFile: values["FRONTDESK_APNS_CA_FILE"])
} catch {
    FileHandle.standardError.write(Data("frontdesk-pusher: cannot start the HTTP/2 client: \(error)\n".utf8))
    exit(1)
}

let bootstrap = ServiceBootstrap(configuration: configuration) { channel in
    try await PusherTopology.declare(on: channel)
}
let pusher = PusherService(
    client: bootstrap.client,
    settings: .init(
        apnsURL: values["FRONTDESK_APNS_URL"], bundleID: bundleID, keyID: keyID, teamID: teamID,
        lifetimeSeconds: configuration.lifetimeSeconds, login: configuration.login, giveUpSeconds: giveUpSeconds),
    logger: bootstrap.logger, metrics: bootstrap.metrics, apns: apns, key: key)
let probes = bootstrap.startProbes(isReady: { pusher.isReady })
bootstrap.logger.info("starting", [
    ("broker", .string("\(configuration.amqp.url)")),
    ("apns", .string(values["FRONTDESK_APNS_URL"] ?? "by environment")),
    ("topic", .string("\(bundleID).push-type.liveactivity")),
])
let status = await ServiceLifecycle.run(bootstrap.lifecycleServices([AMQPClientService(client: bootstrap.client), pusher]), logger: bootstrap.logger)
probes?.stop()
bootstrap.logger.info("stopped", [("status", .int(Int(status)))])
exit(status)
