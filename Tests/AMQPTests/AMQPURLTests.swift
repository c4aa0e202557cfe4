@testable import AMQP
import Testing

@Suite("AMQP URL parsing")
struct AMQPURLTests {
    struct Case: Sendable, CustomTestStringConvertible {
        let text: String
        let tls: Bool, host: String, port: Int, user: String, password: String, vhost: String
        var testDescription: String { text }
    }

    static let valid: [Case] = [
        .init(text: "amqp://", tls: false, host: "127.0.0.1", port: 5672, user: "guest", password: "guest", vhost: "/"),
        .init(text: "amqp://guest:guest@127.0.0.1:5672/%2f", tls: false, host: "127.0.0.1", port: 5672, user: "guest", password: "guest", vhost: "/"),
        .init(text: "amqps://broker.example", tls: true, host: "broker.example", port: 5671, user: "guest", password: "guest", vhost: "/"),
        .init(text: "amqp://u:p@host/", tls: false, host: "host", port: 5672, user: "u", password: "p", vhost: "/"),
        .init(text: "amqp://u@host:1234/prod", tls: false, host: "host", port: 1234, user: "u", password: "guest", vhost: "prod"),
        .init(text: "amqp://us%40er:p%3Aa%2Fss%25@h/v%2Fhost", tls: false, host: "h", port: 5672, user: "us@er", password: "p:a/ss%", vhost: "v/host"),
        .init(text: "amqp://u:p%C3%A9@h", tls: false, host: "h", port: 5672, user: "u", password: "pé", vhost: "/"),
        .init(text: "amqp://u:@h", tls: false, host: "h", port: 5672, user: "u", password: "", vhost: "/"),
        .init(text: "amqps://[::1]:5999/x", tls: true, host: "::1", port: 5999, user: "guest", password: "guest", vhost: "x"),
        .init(text: "amqp://h:5672/%2f?heartbeat=5", tls: false, host: "h", port: 5672, user: "guest", password: "guest", vhost: "/"),
    ]

    @Test(arguments: valid)
    func parses(_ c: Case) throws {
        let url = try AMQPURL(parsing: c.text)
        #expect(url.tls == c.tls)
        #expect(url.host == c.host)
        #expect(url.port == c.port)
        #expect(url.user == c.user)
        #expect(url.password == c.password)
        #expect(url.vhost == c.vhost)
    }

    @Test func queryOptions() throws {
        let url = try AMQPURL(parsing: "amqp://h/?heartbeat=7&connection_timeout=2500&frame_max=65536&channel_max=64&auth_mechanism=plain")
        #expect(url.heartbeat == 7)
        #expect(url.connectionTimeoutMs == 2500)
        #expect(url.frameMax == 65536)
        #expect(url.channelMax == 64)
        let defaults = try AMQPURL(parsing: "amqp://h")
        #expect(defaults.heartbeat == AMQPURL.defaultHeartbeat)
        #expect(defaults.frameMax == AMQPURL.defaultFrameMax)
    }

    static let invalid: [(String, String)] = [
        ("http://h", "scheme"),
        ("h:5672", "scheme"),
        ("amqp://h:0", "port"),
        ("amqp://h:70000", "port"),
        ("amqp://h:abc", "port"),
        ("amqp://h/a/b", "one path segment"),
        ("amqp://u:p%zz@h", "password"),
        ("amqp://h/%2", "vhost"),
        ("amqp://h?heartbeat=-1", "heartbeat"),
        ("amqp://h?frame_max=12", "frame_max"),
        ("amqp://[::1", "IPv6"),
    ]

    @Test(arguments: invalid)
    func rejectsWithAClearMessage(_ text: String, _ mentions: String) {
        #expect {
            _ = try AMQPURL(parsing: text)
        } throws: { error in
            let e = error as? AMQPError
            return e?.code == .invalidURL && e?.message.contains(mentions) == true
        }
    }

    @Test func passwordNeverShows() throws {
        let url = try AMQPURL(parsing: "amqp://router:s3cr%21t@broker:5672/prod")
        #expect(url.password == "s3cr!t")
        #expect(url.description == "amqp://router@broker:5672/prod")
        #expect(!"\(url)".contains("s3cr"))
        #expect {
            _ = try AMQPURL(parsing: "amqp://router:s3cr3t@broker:notaport/")
        } throws: { !"\($0)".contains("s3cr3t") && "\($0)".contains("***") }
        #expect(AMQPURL.redact("amqps://a:b@c/d") == "amqps://a:***@c/d")
        #expect(AMQPURL.redact("amqps://c/d") == "amqps://c/d")
        // A password typed raw, with the characters that end a URL's parts.
        for password in ["pa/ss", "p?ss", "p@ss", "p%zz", "a/b?c@d%"] {
            let text = "amqp://user:\(password)@host:5672/vhost"
            #expect(!AMQPURL.redact(text).contains(password), "\(password)")
            #expect(AMQPURL.redact(text).hasPrefix("amqp://user:***@"))
            do {
                let url = try AMQPURL(parsing: text)
                #expect(!url.description.contains(password))
            } catch {
                #expect(!"\(error)".contains(password), "the error shows \(password): \(error)")
            }
        }
        #expect(AMQPURL.redact("amqp://a:x/y@h1/v,amqp://b:z?w@h2/v") == "amqp://a:***@h1/v,amqp://b:***@h2/v")
    }

    @Test func vhostIsEncodedInTheDescription() throws {
        #expect(try AMQPURL(parsing: "amqp://h/%2f").description == "amqp://guest@h:5672/%2f")
        #expect(try AMQPURL(parsing: "amqp://h/a%20b").description == "amqp://guest@h:5672/a%20b")
    }
}
