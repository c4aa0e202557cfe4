import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    @Suite("A nacked publish retires its channel", .timeLimit(.minutes(1)))
    struct NackTests {
        /// The numbers of the connection's channels in confirm mode, as the broker lists them.
        func confirmChannels(of connectionName: String) throws -> [Int] {
            // (3.10 lists the client's name only inside its client properties.)
            let connections = try TestBroker.script(["ctl", "list_connections", "name", "client_properties", "--silent"])
            guard let line = connections.split(separator: "\n").first(where: { $0.contains("\"\(connectionName)\"") }),
                let brokerName = line.split(separator: "\t").first
            else { return [] }
            let channels = try TestBroker.script(["ctl", "list_channels", "name", "confirm", "--silent"])
            return channels.split(separator: "\n").compactMap { row in
                let columns = row.split(separator: "\t")
                guard columns.count == 2, columns[1] == "true", columns[0].hasPrefix("\(brokerName) ("),
                    let open = columns[0].lastIndex(of: "("), let number = Int(columns[0][columns[0].index(after: open)...].dropLast())
                else { return nil }
                return number
            }
        }

        // On RabbitMQ 3.10 a channel that met a quorum queue's dead leader node
        // nacks every later publish to that queue: the client must not keep it.
        // A full queue that rejects publishes nacks the same way on one node.
        @Test func theNextPublishGoesOnANewChannelAndTheOldOneCloses() async throws {
            let full = TestBroker.uniqueName("nack-full"), open = TestBroker.uniqueName("nack-open")
            let name = "frontdesk-test:nack-\(UUID().uuidString.prefix(6))"
            let client = AMQPClient(
                configuration: AMQPClient.Configuration(connection: AMQPConnectionConfiguration(url: TestBroker.url, connectionName: name)),
                topology: { channel in
                    try await channel.queueDeclare(full, arguments: ["x-max-length": .int64(1), "x-overflow": .string("reject-publish")])
                    try await channel.queueDeclare(open)
                })
            let runner = Task { await client.run() }
            try await client.waitUntilConnected()
            let message = { (queue: String) in OutboundMessage(exchange: "", routingKey: queue, body: Data("x".utf8)) }

            #expect(try await client.publish([message(full)]).allSatisfy { if case .success = $0 { true } else { false } })
            let before = try confirmChannels(of: name)
            try #require(before.count == 1, "one publish channel: \(before)")

            // The router's path: a window handed over without waiting.
            let window = try await client.publishWithoutWaiting([message(full), message(open)])
            let results = try await window.results()
            #expect(results.count == 2)
            if case .failure(let e) = results[0] { #expect(e.code == .nacked) } else { Issue.record("the full queue took a second message") }
            if case .failure(let e) = results[1] { Issue.record("the open queue refused a message: \(e)") }

            try await waitUntil("the nacked channel closed", within: .seconds(5)) { try confirmChannels(of: name).isEmpty }
            #expect(try await client.publish([message(open)]).allSatisfy { if case .success = $0 { true } else { false } })
            let after = try confirmChannels(of: name)
            #expect(after.count == 1 && after != before, "a new publish channel: before \(before), after \(after)")

            try await client.withChannel { ch in
                _ = try await ch.queueDelete(full)
                _ = try await ch.queueDelete(open)
            }
            await client.shutdown()
            await runner.value
        }
    }
}
