import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    /// Any login that may bind a queue to `frontdesk.status` (a surface) or
    /// `frontdesk.dead` (an operator) can bind one that refuses what it is
    /// sent: full, with `x-overflow: reject-publish`. The broker then nacks
    /// the service's publish, though every other queue took it. That must
    /// not make the router retry its requests for ever (its prefetch fills
    /// and every dispatch stalls) nor end the sender's terms one after another.
    @Suite("A queue that refuses status events or dead letters stalls nothing", .timeLimit(.minutes(2)))
    struct HostileSurfaceTests {
        /// A queue bound to `exchange` that holds one message and refuses the rest.
        func refusingQueue(_ h: RouterHarness, on exchange: String, routingKey: String) async throws -> String {
            let queue = TestBroker.uniqueName("refusing")
            try await h.channel.queueDeclare(queue, arguments: ["x-max-length": .int64(1), "x-overflow": .string("reject-publish")])
            try await h.channel.queueBind(queue, exchange: exchange, routingKey: routingKey)
            try await h.channel.publish(exchange: "", routingKey: queue, body: Data("filler".utf8))
            return queue
        }

        /// Reads the status log from its start until `done` holds (the test fails at the deadline).
        func statusLog(_ h: RouterHarness, within: Duration = .seconds(20), until done: @escaping @Sendable ([AMQPDelivery]) -> Bool) async throws
            -> [AMQPDelivery] {
            let c = try await h.connection.openChannel()
            try await c.qos(prefetchCount: 500)
            let consumer = try await c.consume(queue: "frontdesk.status.log", arguments: ["x-stream-offset": .string("first")])
            let collected = CollectedElements<AMQPDelivery>()
            let reader = Task {
                for try await d in consumer {
                    _ = await collected.append(d)
                    try? d.ack()
                }
            }
            try await h.waitUntil("the status log to hold what was expected", within: within) { done(await collected.all) }
            reader.cancel()
            await c.close()
            return await collected.all
        }

        @Test func dispatchesAndDeadLettersGoOnWhileAQueueRefusesThem() async throws {
            try await withHarness("hostile-surface") { h in
                // The sender declares the status log: started first, so the refusing queues come after it.
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep")
                let router = try await h.startRouter()
                let sender = try await h.startSender()
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let refusingStatus = try await refusingQueue(h, on: "frontdesk.status", routingKey: "status.#")
                let refusingDead = try await refusingQueue(h, on: "frontdesk.dead", routingKey: "")

                let ids = (1...30).map { "hs-\($0)" }
                for id in ids { try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"the agm agenda"}"#) }
                for i in 1...5 { try await h.publish("dispatch.request", "{not json \(i)") }

                let events = try await h.events("every dispatch to reply") { events in
                    Set(events.filter { $0["state"] as? String == "replied" }.compactMap { $0["dispatchId"] as? String }).count == ids.count
                }
                for id in ids {
                    let (shown, strays) = RouterHarness.shown(events.filter { $0["dispatchId"] as? String == id })
                    #expect(shown.map { $0["state"] as? String ?? "?" } == ["drafted", "routing", "sending", "sending", "sending", "replied"], "\(id)")
                    #expect(strays.isEmpty, "\(id): \(strays)")
                }
                // The router acked every request and letter (a refused publish
                // it would retry, and count nothing), and the letters are in
                // frontdesk.dead.
                try await h.waitUntil("the router to count 30 accepted and 5 dead letters") {
                    let text = try await h.metrics(router)
                    return text.contains(#"frontdesk_router_requests_total{outcome="accepted"} 30"#)
                        && text.contains(#"frontdesk_router_dead_letters_total{code="invalid_json"} 5"#)
                }
                // Each letter reached frontdesk.dead through the fanout when
                // the refusing queue made the broker nack it, and once more by
                // its own way (a nack does not say which queue refused): twice
                // each, and no more (the router did not publish it again).
                let letters = try await h.drain("frontdesk.dead", count: 10)
                let bodies = letters.map { String(decoding: $0.body, as: UTF8.self) }
                #expect(Set(bodies) == Set((1...5).map { "{not json \($0)" }))
                #expect(bodies.count == 10 && Set((1...5).map { i in bodies.filter { $0 == "{not json \(i)" }.count }) == [2])
                #expect(letters.allSatisfy { $0.properties.headers?["x-frontdesk-error"]?.stringValue == "invalid_json" })
                // The status log, which a next sender leader and the gateway
                // read, holds every dispatch's end.
                let wanted = Set(ids)
                let log = try await statusLog(h) { deliveries in
                    let ended = deliveries.filter { $0.routingKey.hasSuffix(".replied") }.compactMap(\.properties.correlationID)
                    return wanted.isSubset(of: Set(ended))
                }
                #expect(!log.isEmpty)
                // One leader term the whole time: a nack would have ended it
                // (and the standby-free sender would lead again, counting 0 in between).
                #expect(try await h.isLeading(sender))
                #expect(try await h.messages(refusingStatus) == 1)
                #expect(try await h.messages(refusingDead) == 1)
                await agent.stop()
            }
        }
    }
}
