import ServiceKit
import Testing

@Suite("Configuration from environment and flags")
struct OptionReaderTests {
    let options = ServiceConfiguration.options(defaultHTTPPort: 9101)

    func read(_ arguments: [String], _ environment: [String: String] = [:]) throws -> ServiceConfiguration {
        guard case .values(let values) = try OptionReader.read(
            options, arguments: arguments, environment: environment, program: "frontdesk-router", summary: "s")
        else { throw UsageError("help") }
        return try ServiceConfiguration(service: "frontdesk-router", values: values, defaultHTTPPort: 9101, hostName: "h1")
    }

    @Test func defaultsAreTheContracts() throws {
        let c = try read([])
        #expect(c.amqp.url == (try! .init(parsing: "amqp://guest:guest@127.0.0.1:5672/%2f")))
        #expect(c.lifetimeSeconds == 14_400)
        #expect(c.retry == .init(baseMs: 1000, maxMs: 60_000, maxAttempts: 5))
        #expect(c.replyTimeoutSeconds == 600)
        #expect(c.intakeLingerMs == 5)
        #expect(c.httpPort == 9101)
        #expect(c.routesPath == nil)
        #expect(c.amqp.connectionName == "frontdesk-router@h1")
        #expect(c.amqp.tls.verifyPeer && c.amqp.tls.verifyHostname)
    }

    @Test func flagsWinOverTheEnvironment() throws {
        let c = try read(
            ["--lifetime-s", "60", "--retry-base-ms=10", "--amqp-url", "amqps://u:p@b/v", "--http-port", "0", "--intake-linger-ms", "0"],
            ["FRONTDESK_LIFETIME_S": "99", "FRONTDESK_RETRY_MAX_MS": "500", "FRONTDESK_MAX_ATTEMPTS": "3",
             "AMQP_CA_FILE": "/ca.pem", "FRONTDESK_ROUTES": "/r.json", "FRONTDESK_REPLY_TIMEOUT_S": "7"])
        #expect(c.lifetimeSeconds == 60)
        #expect(c.retry == .init(baseMs: 10, maxMs: 500, maxAttempts: 3))
        #expect(c.amqp.url.tls && c.amqp.url.vhost == "v")
        #expect(c.amqp.tls.caFile == "/ca.pem")
        #expect(c.routesPath == "/r.json")
        #expect(c.replyTimeoutSeconds == 7)
        #expect(c.httpPort == 0)
        #expect(c.intakeLingerMs == 0)
    }

    @Test func eachVariableSpelledOutIsAFlagToo() throws {
        let c = try read(["--frontdesk-lifetime-s", "60", "--frontdesk-retry-base-ms=10", "--frontdesk-routes", "/r.json", "--lifetime-s", "61"])
        #expect(c.lifetimeSeconds == 61, "the later flag wins, whichever spelling")
        #expect(c.retry.baseMs == 10 && c.routesPath == "/r.json")
        #expect(throws: UsageError.self) { try read(["--frontdesk-amqp-url", "amqp://b"]) }
    }

    @Test(arguments: [
        (["--lifetime-s", "x"], "FRONTDESK_LIFETIME_S"),
        (["--max-attempts", "0"], "FRONTDESK_MAX_ATTEMPTS"),
        (["--intake-linger-ms", "-1"], "FRONTDESK_INTAKE_LINGER_MS"),
        (["--intake-linger-ms", "1001"], "FRONTDESK_INTAKE_LINGER_MS"),
        (["--bogus", "1"], "unknown option '--bogus'"),
        (["--lifetime-s"], "needs a value"),
        (["--amqp-url", "http://x"], "AMQP_URL"),
        (["--amqp-cert-file", "/c.pem"], "AMQP_KEY_FILE"),
        (["--log-level", "loud"], "FRONTDESK_LOG_LEVEL"),
    ])
    func mistakesAreOneClearSentence(_ arguments: [String], _ mentions: String) {
        #expect {
            _ = try read(arguments)
        } throws: { "\($0)".contains(mentions) }
    }

    @Test func helpListsEveryVariableAndFlag() throws {
        guard case .help(let text) = try OptionReader.read(
            options, arguments: ["--help"], environment: [:], program: "frontdesk-router", summary: "routes")
        else {
            Issue.record("no help")
            return
        }
        for o in options {
            #expect(text.contains(o.variable))
            #expect(text.contains(o.flag))
        }
        #expect(text.contains("--amqp-url"))
        #expect(text.contains("--reply-timeout-s"))
    }
}
