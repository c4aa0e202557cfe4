import AMQP
import Foundation
import Testing

extension BrokerIntegration {
    @Suite("Router intake", .timeLimit(.minutes(2)))
    struct RouterTests {
        @Test func acceptedRequestGetsDraftedThenRoutingAndAHandOff() async throws {
            try await withHarness("accept") { h in
                try await h.startRouter()
                try await h.publish(
                    "dispatch.request", #"{"id":"d-1","input":"Reply to Lisa about the AGM agenda — short, confirm 14:00","threadId":"t-9","user":"u-42"}"#,
                    properties: RouterHarness.hostileProperties)
                let deliveries = try await h.statusDeliveries { $0.count >= 2 }
                #expect(deliveries.map(\.routingKey) == ["status._._.drafted", "status.yemaya.board-prep.routing"])
                #expect(deliveries.map(\.properties.messageID) == ["d-1/1", "d-1/2"])
                #expect(deliveries.allSatisfy { $0.properties.type == "frontdesk.status.v1" && $0.properties.correlationID == "d-1" && $0.properties.deliveryMode == 2 })
                let events = deliveries.map { try! JSONSerialization.jsonObject(with: $0.body) as! [String: Any] }
                #expect(events.map { $0["seq"] as? Int } == [1, 2])
                #expect(events.map { $0["step"] as? Int } == [0, 1])
                #expect(events.allSatisfy { $0["input"] as? String == "Reply to Lisa about the AGM agenda — short, confirm 14:00" })
                #expect(events.allSatisfy { $0["threadId"] as? String == "t-9" && $0["steps"] as? Int == 3 })
                let routing = events[1]
                #expect((routing["project"] as? [String: Any])?["glyph"] as? String == "YE")
                #expect((routing["target"] as? [String: Any])?["name"] as? String == "Board Prep")
                let route = try #require(routing["route"] as? [String: Any])
                #expect(route["reason"] as? String == "keywords: agm, agenda; contact: Lisa")
                #expect(events[0]["project"] == nil)
                let handoff = try await h.drain("frontdesk.sender.inbox", count: 1)
                #expect(handoff.count == 1)
                #expect(handoff.first?.properties.correlationID == "d-1")
                // The producer's message carried user_id, CC and more: none of it reaches the sender.
                let p = try #require(handoff.first?.properties)
                #expect(p.headers == nil && p.replyTo == nil && p.expiration == nil && p.priority == nil && p.appID == nil)
                // Its user_id is the router's own login, which marks it as written by a service.
                #expect(p.userID == h.url.user)
                #expect(p.timestamp.map { $0 < UInt64(Date().timeIntervalSince1970) + 60 } == true)
            }
        }

        /// A decision log that gives nothing back while the router's
        /// publishes to it are confirmed (as a RabbitMQ 3.10 stream consumer
        /// can hang when its member restarts; here: the stream deleted, so
        /// its records go nowhere): the router connects again, which
        /// declares the log again, and goes on by itself.
        @Test func aDecisionLogThatGivesNothingBackMakesTheRouterConnectAgain() async throws {
            try await withHarness("decisions-hang") { h in
                try await h.startRouter()
                try await h.publish("dispatch.request", #"{"id":"h-1","input":"before","project":"acme","target":"legal"}"#)
                _ = try await h.events(until: "h-1", reaches: "routing")
                try await h.channel.queueDelete("frontdesk.router.decisions")
                let deleted = ContinuousClock.now
                try await h.publish("dispatch.request", #"{"id":"h-2","input":"after","project":"acme","target":"legal"}"#)
                _ = try await h.events(until: "h-2", reaches: "routing", within: .seconds(60))
                let took = ContinuousClock.now - deleted
                #expect(took < .seconds(40), "\(took)")
            }
        }

        /// Requests that come often wait for each other (FRONTDESK_INTAKE_LINGER_MS,
        /// a second here so that it shows on a slow machine too): every one
        /// still goes through, in order, and the handling time the router
        /// reports includes the wait; with no linger nothing waits.
        @Test(arguments: [1000, 0])
        func requestsThatComeOftenWaitForEachOtherAndAllGoThrough(lingerMs: Int) async throws {
            try await withHarness("linger-\(lingerMs)") { h in
                let router = try await h.startRouter(extraEnvironment: ["FRONTDESK_INTAKE_LINGER_MS": "\(lingerMs)"])
                let ids = (0..<30).map { "l-\($0)" }
                for id in ids {
                    try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"x","project":"acme","target":"legal"}"#)
                    // Paced: ~80 a second, several expected within the linger.
                    try await Task.sleep(for: .milliseconds(12))
                }
                let handOffs = try await h.drain("frontdesk.sender.inbox", count: ids.count)
                #expect(handOffs.map { $0.properties.correlationID ?? "?" } == ids)
                func value(_ prefix: String) async throws -> Double? {
                    try await h.metrics(router).split(separator: "\n").first { $0.hasPrefix(prefix) }
                        .flatMap { Double($0.split(separator: " ").last ?? "") }
                }
                // Handling is observed once the hand-offs are confirmed, which may be just after they arrive.
                try await h.waitUntil("every request to be handled") {
                    try await value("frontdesk_router_handling_seconds_count ") == Double(ids.count)
                }
                let count = Double(ids.count)
                if lingerMs > 0 {
                    // Only the first two batches go at once: the first waits for no estimate, the second makes one.
                    let quick = try #require(try await value(#"frontdesk_router_handling_seconds_bucket{le="0.5"} "#))
                    #expect(quick < count / 2, "\(Int(quick)) of \(Int(count)) handled within 0.5 s: no wait")
                } else {
                    let quick = try #require(try await value(#"frontdesk_router_handling_seconds_bucket{le="1"} "#))
                    #expect(quick == count, "\(Int(count - quick)) of \(Int(count)) took over 1 s with no linger")
                }
            }
        }

        /// A producer's `expiration` loses nothing: requests and a cancel
        /// that expire in the intake while the router is down are
        /// dead-lettered with the reason when it is back (their producer
        /// said not to act on them after that), the others handled. One put
        /// straight on the expired queue with a forged `x-death` naming a
        /// cancel is only dead-lettered, never handed to the sender.
        @Test func messagesThatExpireWhileTheRouterIsDownAreDeadLetteredWhenItIsBack() async throws {
            try await withHarness("expiring") { h in
                let router = try await h.startRouter()
                try await waitUntil("the topology", within: .seconds(10)) {
                    (try? await h.connection.withChannel { try await $0.queueDeclare("frontdesk.router.intake.expired", passive: true) }) != nil
                }
                kill(router.processIdentifier, SIGTERM)
                router.waitUntilExit()
                func expiring(_ ms: String) -> AMQPProperties {
                    AMQPProperties(contentType: "application/json", deliveryMode: 2, expiration: ms)
                }
                try await h.publish("dispatch.request", #"{"id":"ex-0","input":"the agm agenda"}"#, properties: expiring("0"))
                try await h.publish("dispatch.request", #"{"id":"ex-1","input":"the agm minutes"}"#, properties: expiring("30"))
                try await h.publish("dispatch.cancel", #"{"id":"ex-2","reason":"changed my mind"}"#, properties: expiring("60"))
                try await h.publish("dispatch.request", #"{"id":"ex-2","input":"the contract"}"#)
                let forged = FieldTable([("x-death", .array([.table(["routing-keys": .array([.string("dispatch.cancel")])])]))])
                try await h.connection.withChannel { c in
                    try await c.publish(exchange: "", routingKey: "frontdesk.router.intake.expired", body: Data(#"{"id":"ex-2","reason":"forged"}"#.utf8),
                        properties: AMQPProperties(contentType: "application/json", headers: forged, deliveryMode: 2))
                }
                try await waitUntil("the three to expire", within: .seconds(10)) {
                    let n = try? await h.connection.withChannel { try await $0.queueDeclare("frontdesk.router.intake.expired", passive: true).messageCount }
                    return (n ?? 0) >= 4
                }
                try await h.startRouter()
                try await h.startSender()
                let dead = try await h.drain("frontdesk.dead", count: 4)
                #expect(dead.count == 4)
                for d in dead {
                    #expect(d.properties.headers?["x-frontdesk-error"]?.stringValue == "invalid_request")
                    #expect(d.properties.headers?["x-frontdesk-reason"]?.stringValue?.contains("expired") == true)
                }
                #expect(Set(dead.map { String(decoding: $0.body, as: UTF8.self) }).count == 4)
                // The one without an expiration is a dispatch, and no cancel (genuine or forged) reached it.
                let events = try await h.events(until: "ex-2", reaches: "queued")
                #expect(!events.contains { $0["state"] as? String == "cancelled" })
                #expect(!events.contains { ["ex-0", "ex-1"].contains($0["dispatchId"] as? String ?? "") })
            }
        }

        /// An intake declared by an older build (or definitions) without the
        /// way for expired messages: the router says so and goes on with it.
        @Test func aRouterStartsOnAnIntakeDeclaredWithoutTheExpiredWay() async throws {
            try await withHarness("old-intake") { h in
                try await h.connection.withChannel { try await $0.queueDeclare("frontdesk.router.intake", arguments: ["x-queue-type": "quorum"]) }
                try await h.startRouter()
                try await h.publish("dispatch.request", #"{"id":"old-1","input":"the agm agenda"}"#)
                _ = try await h.events(until: "old-1", reaches: "routing")
            }
        }

        @Test func everyDeadLetterCodeWithItsHeaders() async throws {
            try await withHarness("deadletters") { h in
                try await h.startRouter()
                try await h.publish("dispatch.request", "{not json")
                try await h.publish("dispatch.request", #"{"input":"no id"}"#)
                try await h.publish("dispatch.request", #"{"id":"bad#id","input":"x"}"#)
                try await h.publish("dispatch.request", #"{"id":"has-id","input":""}"#)
                try await h.publish("dispatch.request", "{\"id\":\"big\",\"input\":\"\(String(repeating: "x", count: 70_000))\"}")
                try await h.publish("dispatch.request", #"{"id":"v2","input":"x"}"#, type: "frontdesk.dispatch.v2")
                try await h.publish("dispatch.reroute", #"{"id":"r-1","project":"nope","target":"x"}"#)
                try await h.publish("dispatch.cancel", #"{"reason":"user"}"#)
                try await h.publish("something.else", #"{"id":"x"}"#)
                let dead = try await h.drain("frontdesk.dead", count: 9)
                let codes = dead.map { $0.properties.headers?["x-frontdesk-error"]?.stringValue ?? "?" }
                // Handlers run concurrently: the set of codes counts, not their order.
                #expect(codes.sorted() == ["invalid_json", "invalid_request", "invalid_request", "invalid_request", "invalid_request",
                                           "invalid_request", "too_large", "unknown_target", "unsupported_version"])
                for d in dead {
                    let headers = try #require(d.properties.headers)
                    #expect(headers["x-frontdesk-service"]?.stringValue == "frontdesk-router")
                    #expect(headers["x-frontdesk-routing-key"]?.stringValue == d.routingKey)
                    #expect((headers["x-frontdesk-reason"]?.stringValue ?? "").count > 10)
                }
                #expect(dead.contains { $0.body == Data("{not json".utf8) && $0.properties.headers?["x-frontdesk-error"]?.stringValue == "invalid_json" })
                // Only the invalid request whose id could be read gets an event: failed, seq 1.
                let events = try await h.events(untilEnded: "has-id")
                #expect(events.count == 1)
                #expect(events.first?["dispatchId"] as? String == "has-id")
                #expect(events.first?["state"] as? String == "failed")
                #expect(events.first?["seq"] as? Int == 1)
                #expect((events.first?["error"] as? [String: Any])?["code"] as? String == "invalid_request")
            }
        }

        /// Headers that nearly fill the frame: the dead letter cannot copy them
        /// all and add its own four; it keeps what fits, says how many it left
        /// out, and the router goes on (it used to retry the message forever).
        @Test func aDeadLetterOfHeadersThatFillTheFrameKeepsWhatFits() async throws {
            try await withHarness("full-frame") { h in
                try await h.startRouter()
                // 131,072-byte frames: 20 for the frame and class, the rest properties.
                let headers: FieldTable = ["x-small": "kept", "x-fill": .string(String(repeating: "f", count: 130_900)), "x-last": 7]
                try await h.publish("dispatch.request", "{not json", properties: AMQPProperties(headers: headers))
                try await h.publish("dispatch.request", #"{"id":"after-full","input":"the agm agenda"}"#)
                let dead = try await h.drain("frontdesk.dead", count: 1)
                let got = try #require(dead.first?.properties.headers)
                #expect(got["x-frontdesk-error"]?.stringValue == "invalid_json")
                #expect(got["x-small"]?.stringValue == "kept")
                #expect(got["x-last"] == .int64(7))
                #expect(got["x-fill"] == nil)
                #expect(got["x-frontdesk-headers-dropped"] == .int64(1))
                #expect(dead.first?.body == Data("{not json".utf8))
                // The next request is not held up behind it.
                let events = try await h.events(until: "after-full", reaches: "routing")
                #expect(events.last?["state"] as? String == "routing")
                // A producer's headers of the services' own names are not taken for theirs.
                let forged: FieldTable = ["x-frontdesk-headers-dropped": 99, "x-frontdesk-error": "forged", "x-mine": 1]
                try await h.publish("dispatch.request", "{forged", properties: AMQPProperties(headers: forged))
                let second = try #require(try await h.drain("frontdesk.dead", count: 1).first?.properties.headers)
                #expect(second["x-frontdesk-error"]?.stringValue == "invalid_json")
                #expect(second["x-frontdesk-headers-dropped"] == nil)
                #expect(second["x-mine"] == .int64(1))
            }
        }

        @Test func unknownHintsFailWithoutGuessing() async throws {
            try await withHarness("hints") { h in
                try await h.startRouter()
                try await h.publish("dispatch.request", #"{"id":"h-1","input":"the agm agenda","project":"acme","target":"nope"}"#)
                let events = try await h.events(untilEnded: "h-1")
                #expect(events.map { $0["state"] as? String } == ["drafted", "failed"])
                #expect((events.last?["error"] as? [String: Any])?["code"] as? String == "unknown_target")
            }
        }

        @Test func duplicateAcrossARouterRestartMakesNoNewEvent() async throws {
            try await withHarness("restart") { h in
                let first = try await h.startRouter()
                try await h.publish("dispatch.request", #"{"id":"same","input":"the contract"}"#)
                #expect(try await h.events { $0.count >= 2 }.count == 2)
                first.terminate()
                first.waitUntilExit()
                #expect(first.terminationStatus == 0)
                try await h.startRouter()
                try await h.publish("dispatch.request", #"{"id":"same","input":"the contract"}"#)
                try await h.publish("dispatch.request", #"{"id":"same","input":"a corrected request reusing the id"}"#)
                try await h.publish("dispatch.request", #"{"id":"other","input":"the contract"}"#)
                // "other" was published last: once its events are in, the two before it were handled.
                let events = try await h.events { $0.filter { $0["dispatchId"] as? String == "other" }.count >= 2 }
                #expect(events.map { $0["dispatchId"] as? String } == ["other", "other"])
            }
        }

        @Test func twoReplicasAndAKillInTheMiddleOfABurst() async throws {
            try await withHarness("replicas") { h in
                let a = try await h.startRouter()
                try await h.startRouter()
                // Every id twice, while one replica is killed -9 and a new one starts.
                let ids = (0..<300).map { "burst-\($0)" }
                for (i, id) in ids.enumerated() {
                    try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"the agm agenda \#(i)"}"#)
                    try await h.publish("dispatch.request", #"{"id":"\#(id)","input":"the agm agenda \#(i)"}"#)
                    if i == 100 { kill(a.processIdentifier, SIGKILL) }
                    if i == 150 { try await h.startRouter() }
                }
                let deliveries = try await h.statusDeliveries("both events of every id") { ds in
                    Set(ds.compactMap(\.properties.messageID)).count >= 2 * ids.count
                }
                var byID: [String: [String: Data]] = [:]  // id → message_id → body
                for d in deliveries {
                    let id = d.properties.correlationID ?? "?"
                    let mid = d.properties.messageID ?? "?"
                    if let seen = byID[id]?[mid] {
                        #expect(seen == d.body, "a second, different event \(mid)")
                    }
                    byID[id, default: [:]][mid] = d.body
                }
                // Exactly one history per id: drafted (seq 1) and routing (seq 2), however often re-sent.
                #expect(Set(byID.keys) == Set(ids))
                for id in ids { #expect(Set(byID[id]?.keys ?? [:].keys) == ["\(id)/1", "\(id)/2"]) }
                let handoffs = try await h.drain("frontdesk.sender.inbox", count: ids.count)
                #expect(Set(handoffs.compactMap(\.properties.correlationID)) == Set(ids))
            }
        }
    }
}
