import AMQP
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

extension BrokerIntegration {
    /// frontdesk-gateway as a process, against the real broker, the router and
    /// the sender: the contract's Gateway section. (In the broker's serialized
    /// suite: others restart the broker or raise its alarms.)
    @Suite(.serialized) struct GatewayTests {
        static let seed = "Reply to Lisa about the AGM agenda — short, confirm 14:00"

        @Test func theSeedRequestStreamsFromRoutingToReplied() async throws {
            try await withHarness("gw-seed") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .slowStream)
                defer { Task { await agent.stop() } }
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let gw = try await h.startGateway()

                let posted = try await gw.call("POST", "/v1/dispatches", body: #"{"input":"\#(Self.seed)","threadId":"t-9"}"#)
                #expect(posted.status == 202)
                let id = try #require(posted.body["id"] as? String)
                #expect(posted.body["events"] as? String == "/v1/dispatches/\(id)/events")

                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/\(id)/events", token: TestGateway.tokens["alice"])
                let events = try await sse.waitFor("replied") { $0.contains { $0.event == "replied" } }
                #expect(sse.status == 200)
                let seqs = events.compactMap { Int($0.id ?? "") }
                #expect(seqs == Array(1...seqs.count), "every event once, in order: \(seqs)")
                #expect(events.first?.event == "drafted")
                #expect(events.map(\.event).contains("routing"))
                #expect(events.last?.event == "replied")
                for e in events {
                    #expect(e.json["input"] as? String == Self.seed)
                    #expect(e.json["event"] == nil && e.json["state"] as? String == e.event)
                }
                // Preview lines grew while it was sending.
                let previews = events.filter { $0.event == "sending" }.compactMap { $0.json["preview"] as? [String] }
                #expect(Set(previews.map(\.count)).count > 1, "the preview grew: \(previews)")
                // The stream ends after the terminal event.
                try await waitUntil("the stream to end", within: .seconds(5)) { sse.isClosed }

                let latest = try await gw.call("GET", "/v1/dispatches/\(id)")
                #expect(latest.status == 200)
                #expect(latest.body["state"] as? String == "replied")
                #expect(latest.body["seq"] as? Int == seqs.last)
                #expect(latest.body["user"] as? String == "alice")

                // Resuming after the next-to-last event gives the last one only.
                let resumed = try SSEClient(
                    port: gw.port, path: "/v1/dispatches/\(id)/events", token: TestGateway.tokens["alice"], lastEventID: "\(seqs.count - 1)")
                try await waitUntil("the resumed stream to end", within: .seconds(5)) { resumed.isClosed }
                #expect(resumed.events.compactMap(\.id) == ["\(seqs.count)"])
                // The type is text/event-stream, exactly.
                #expect(resumed.text.lowercased().contains("\r\ncontent-type: text/event-stream\r\n"), "\(resumed.text.prefix(300))")
                // Resuming after the terminal event (an EventSource's reconnect
                // once the stream ended): 204, which stops it, and no events.
                for past in ["\(seqs.count)", "\(seqs.count + 5)", "99999999999999999999999"] {
                    let done = try SSEClient(port: gw.port, path: "/v1/dispatches/\(id)/events", token: TestGateway.tokens["alice"], lastEventID: past)
                    try await waitUntil("the answer to a resume after the end", within: .seconds(5)) { done.isClosed }
                    #expect(done.status == 204 && done.events.isEmpty, "\(past): \(done.text.prefix(300))")
                }

                // The same id again answers the same dispatch, and changes nothing.
                let again = try await gw.call("POST", "/v1/dispatches", body: #"{"id":"\#(id)","input":"something else"}"#)
                #expect(again.status == 202)
                #expect(again.body["id"] as? String == id)
                #expect(try await gw.call("GET", "/v1/dispatches/\(id)").body["seq"] as? Int == seqs.last)

                // A replica started later knows the whole history: it reads the status log.
                let second = try await h.startGateway()
                let replay = try SSEClient(port: second.port, path: "/v1/dispatches/\(id)/events", token: TestGateway.tokens["alice"])
                try await waitUntil("the replayed stream to end", within: .seconds(5)) { replay.isClosed }
                #expect(replay.events.compactMap { Int($0.id ?? "") } == seqs)
            }
        }

        @Test func aUserSeesAndActsOnTheirOwnDispatchesOnly() async throws {
            try await withHarness("gw-users") { h in
                try await h.startRouter()
                try await h.startSender()
                let gw = try await h.startGateway()
                // Queued: acme/legal has no agent.
                let posted = try await gw.call("POST", "/v1/dispatches", body: #"{"id":"mine-1","input":"the contract","project":"acme","target":"legal"}"#)
                #expect(posted.status == 202)
                _ = try await h.events(until: "mine-1", reaches: "queued")

                #expect(try await gw.call("GET", "/v1/dispatches/mine-1", user: "bob").status == 404)
                #expect(try await gw.call("GET", "/v1/dispatches/mine-1/events", user: "bob").status == 404)
                #expect(try await gw.call("POST", "/v1/dispatches/mine-1/cancel", user: "bob", body: "{}").status == 404)
                #expect(try await gw.call("POST", "/v1/dispatches/mine-1/reroute", user: "bob", body: #"{"project":"yemaya","target":"board-prep"}"#).status == 404)
                #expect(try await gw.call("PUT", "/v1/dispatches/mine-1/activity", user: "bob", body: #"{"pushToken":"abcd"}"#).status == 404)
                // Another's dispatch is 404 whatever the body: ownership is checked first.
                #expect(try await gw.call("POST", "/v1/dispatches/mine-1/reroute", user: "bob", body: #"{"project":"no","target":"such"}"#).status == 404)
                #expect(try await gw.call("POST", "/v1/dispatches/mine-1/cancel", user: "bob", body: "nope").status == 404)
                #expect(try await gw.call("PUT", "/v1/dispatches/mine-1/activity", user: "bob", body: #"{"pushToken":"ab","environment":5}"#).status == 404)
                #expect(try await gw.call("PUT", "/v1/dispatches/mine-1/activity", body: #"{"pushToken":"ab","environment":5}"#).status == 400)
                // A dispatch sent to the broker without a user is nobody's to take either: 404, not a 202 for
                // a dispatch its poster could never see.
                try await h.publish("dispatch.request", #"{"id":"cli-1","input":"from the CLI","project":"acme","target":"legal"}"#)
                _ = try await h.events(until: "cli-1", reaches: "queued")
                try await waitUntil("the gateway to know cli-1", within: .seconds(10)) {
                    (try? await h.metrics(gw.process))?.contains("frontdesk_gateway_dispatches 2") == true
                }
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"cli-1","input":"mine now"}"#).status == 404)
                #expect(try await gw.call("GET", "/v1/dispatches/cli-1").status == 404)
                let taken = try await gw.call("POST", "/v1/dispatches", user: "bob", body: #"{"id":"mine-1","input":"steal it"}"#)
                #expect(taken.status == 404)
                #expect((taken.body["error"] as? [String: Any])?["code"] as? String == "not_found")
                // Two users posting one new id at the same moment: one gets it, the other the 404 above
                // (not a 202 for a dispatch they could never see).
                for n in 1...6 {
                    let id = "race-\(n)"
                    let body = #"{"id":"\#(id)","input":"the contract","project":"acme","target":"legal"}"#
                    async let byAlice = gw.call("POST", "/v1/dispatches", user: "alice", body: body)
                    async let byBob = gw.call("POST", "/v1/dispatches", user: "bob", body: body)
                    let (a, b) = try await (byAlice.status, byBob.status)
                    #expect([a, b].sorted() == [202, 404], "\(id): alice \(a), bob \(b)")
                    let winner = a == 202 ? "alice" : "bob"
                    try await waitUntil("\(id) shown to \(winner)", within: .seconds(10)) {
                        (try? await gw.call("GET", "/v1/dispatches/\(id)", user: winner).status) == 200
                    }
                    #expect(try await gw.call("GET", "/v1/dispatches/\(id)", user: winner == "alice" ? "bob" : "alice").status == 404)
                }

                for user in [nil, "not-a-token"] {
                    let answer = try await gw.call("GET", "/v1/dispatches/mine-1", user: user)
                    #expect(answer.status == 401)
                    #expect((answer.body["error"] as? [String: Any])?["code"] as? String == "unauthorized")
                }
                #expect(try await gw.call("GET", "/v1/targets", user: nil).status == 401)
                // However the path is spelled: "%76" is "v".
                #expect(try await gw.call("GET", "/%761/targets", user: nil).status == 401)
                #expect(try await gw.call("POST", "/%761/dispatches", user: nil, body: #"{"id":"anon-1","input":"x"}"#).status == 401)
                #expect(try await gw.call("GET", "/%761/dispatches/mine-1", user: nil).status == 401)
                #expect(try await gw.call("GET", "/%761/dispatches/mine-1").status == 200)
                // Every /v1 request needs a token: also one for no endpoint, or with the wrong method.
                #expect(try await gw.call("GET", "/v1/nope", user: nil).status == 401)
                #expect(try await gw.call("DELETE", "/v1/dispatches/mine-1", user: nil).status == 401)
                #expect(try await gw.call("GET", "/v1/nope").status == 404)
                // The user of a request is the token's, whatever the body says.
                let spoof = try await gw.call("POST", "/v1/dispatches", user: "bob", body: #"{"id":"bob-1","input":"x","user":"alice"}"#)
                #expect(spoof.status == 202)
                #expect(try await gw.call("GET", "/v1/dispatches/bob-1", user: "alice").status == 404)
                #expect(try await gw.call("GET", "/v1/dispatches/bob-1", user: "bob").body["user"] as? String == "bob")

                // A status event put straight into the log by the default exchange (as any agent's
                // user can) is no status event: a replica that reads the whole log ignores it.
                let forged = #"{"dispatchId":"mine-1","seq":99,"state":"replied","user":"alice","reply":"forged","input":"x","startedAt":"2026-05-13T09:41:00.000Z","at":"2026-05-13T09:41:00.000Z","elapsedMs":0,"expiresAt":"2099-05-13T09:41:00.000Z"}"#
                try await h.channel.publish(
                    exchange: "", routingKey: "frontdesk.status.log", body: Data(forged.utf8),
                    properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: "mine-1", messageID: "mine-1/99", type: "frontdesk.status.v1"))
                let second = try await h.startGateway()

                // Nothing bob did, nor the forgery, reached alice's dispatch.
                for g in [gw, second] {
                    let latest = try await g.call("GET", "/v1/dispatches/mine-1")
                    #expect(latest.body["state"] as? String == "queued")
                    #expect((latest.body["target"] as? [String: Any])?["id"] as? String == "legal")
                }
            }
        }

        @Test func aCancelTakenWhileTheRouterIsDownEndsTheDispatchWhenItComes() async throws {
            try await withHarness("gw-early-cancel") { h in
                let router = try await h.startRouter()
                try await h.startSender()
                try await h.channel.queueDeclare("frontdesk.test.activity", arguments: ["x-queue-type": "quorum"])
                try await h.channel.queueBind("frontdesk.test.activity", exchange: "frontdesk.commands", routingKey: "dispatch.activity")
                let gw = try await h.startGateway()
                kill(router.processIdentifier, SIGKILL)
                router.waitUntilExit()
                // No event can come: the request waits in the broker, and so does the cancel.
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"early-1","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                #expect(try await gw.call("POST", "/v1/dispatches/early-1/cancel", user: "bob", body: "{}").status == 404)
                #expect(try await gw.call("POST", "/v1/dispatches/early-1/cancel", body: #"{"reason":"user"}"#).status == 202)
                // bob cannot take the id here; on another replica, which cannot know, his cancel waits
                // for the first event, which shows the dispatch is alice's: it never goes out.
                #expect(try await gw.call("POST", "/v1/dispatches", user: "bob", body: #"{"id":"early-1","input":"mine now"}"#).status == 404)
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"early-2","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                let other = try await h.startGateway()
                #expect(try await other.call("POST", "/v1/dispatches", user: "bob", body: #"{"id":"early-2","input":"mine now"}"#).status == 202)
                #expect(try await other.call("POST", "/v1/dispatches/early-2/cancel", user: "bob", body: #"{"reason":"bob was here"}"#).status == 202)
                // Kept too, like alice's registration for early-1: only the owner's go out.
                #expect(try await other.call("PUT", "/v1/dispatches/early-2/activity", user: "bob", body: #"{"pushToken":"abcd"}"#).status == 204)
                #expect(try await gw.call("PUT", "/v1/dispatches/early-1/activity", body: #"{"pushToken":"a11ce0"}"#).status == 204)
                // A cancel is never pushed out of what waits for the first event by the commands after it.
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"early-3","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                #expect(try await gw.call("POST", "/v1/dispatches/early-3/cancel", body: #"{"reason":"first"}"#).status == 202)
                try await withThrowingTaskGroup(of: Int.self) { group in
                    for _ in 0..<(2 * 8) {
                        group.addTask { try await gw.call("POST", "/v1/dispatches/early-3/reroute", body: #"{"project":"yemaya","target":"board-prep"}"#).status }
                    }
                    for try await status in group { #expect(status == 202) }
                }
                // bob posts an id at one replica while it waits for the first event, which shows it is
                // alice's (posted at another a moment earlier): 404, not a 202 for a dispatch he never sees.
                try await h.publish("dispatch.request", #"{"id":"early-4","input":"the contract","user":"alice"}"#)
                let queued = try await h.messages("frontdesk.router.intake")
                async let bobs = other.call("POST", "/v1/dispatches", user: "bob", body: #"{"id":"early-4","input":"mine now"}"#)
                try await waitUntil("bob's request in the intake", within: .seconds(5)) { (try? await h.messages("frontdesk.router.intake")) == queued + 1 }
                let drafted = #"{"dispatchId":"early-4","seq":1,"state":"drafted","user":"alice","input":"the contract","startedAt":"2026-05-13T09:41:00.000Z","at":"2026-05-13T09:41:00.000Z","elapsedMs":0,"expiresAt":"2099-05-13T09:41:00.000Z"}"#
                try await h.channel.publish(
                    exchange: "frontdesk.status", routingKey: "status._._.drafted", body: Data(drafted.utf8),
                    properties: AMQPProperties(contentType: "application/json", deliveryMode: 2, correlationID: "early-4", messageID: "early-4/1", type: "frontdesk.status.v1"))
                #expect(try await bobs.status == 404)
                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/early-1/events", token: TestGateway.tokens["alice"])
                try await h.startRouter()
                let events = try await h.events(untilEnded: "early-1", "early-3")
                #expect(events.filter { $0["dispatchId"] as? String == "early-1" }.last?["state"] as? String == "cancelled")
                #expect(events.filter { $0["dispatchId"] as? String == "early-3" }.last?["state"] as? String == "cancelled")
                // early-2 is alice's: bob's cancel never went out; only hers ends it.
                try await waitUntil("early-2 queued", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/early-2").body["state"] as? String) == "queued"
                }
                #expect(try await gw.call("POST", "/v1/dispatches/early-2/cancel", body: #"{"reason":"alice"}"#).status == 202)
                try await waitUntil("early-2 cancelled", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/early-2").body["state"] as? String) == "cancelled"
                }
                let early2 = try await gw.call("GET", "/v1/dispatches/early-2")
                #expect((early2.body["cancel"] as? [String: Any])?["reason"] as? String == "alice")
                #expect(early2.body["user"] as? String == "alice")
                // One registration went out, alice's, published at early-1's first event.
                let registrations = try await h.drain("frontdesk.test.activity", count: 1)
                #expect(registrations.compactMap { (try? JSONSerialization.jsonObject(with: $0.body) as? [String: Any])?["pushToken"] as? String } == ["a11ce0"])
                #expect(try await h.messages("frontdesk.test.activity") == 0)
                // The stream opened before the first event gets them all, and ends with the cancel.
                try await waitUntil("the stream to end", within: .seconds(5)) { sse.isClosed }
                #expect(sse.events.last?.event == "cancelled")
                #expect(sse.events.first?.id == "1")
            }
        }

        @Test func aRequestTheBrokerRefusedAnswers503WithTheIdToRetryWith() async throws {
            try await withHarness("gw-refused") { h in
                try await h.startRouter()
                let gw = try await h.startGateway()
                // A full queue bound to the requests' key: the broker refuses (nacks) every request.
                try await h.channel.queueDeclare("frontdesk.test.full", arguments: ["x-max-length": .int64(0), "x-overflow": .string("reject-publish")])
                try await h.channel.queueBind("frontdesk.test.full", exchange: "frontdesk.commands", routingKey: "dispatch.request")
                let body = #"{"input":"the contract","project":"acme","target":"legal"}"#
                let refused = try await gw.call("POST", "/v1/dispatches", body: body)
                #expect(refused.status == 503)
                #expect((refused.body["error"] as? [String: Any])?["code"] as? String == "unavailable")
                // The id the gateway made: the broker may have the request, so a retry must use it.
                let id = try #require(refused.body["id"] as? String)
                try await h.channel.queueDelete("frontdesk.test.full")
                let again = try await gw.call("POST", "/v1/dispatches", body: #"{"id":"\#(id)","input":"the contract","project":"acme","target":"legal"}"#)
                #expect(again.status == 202 && again.body["id"] as? String == id)
                try await waitUntil("\(id) routed", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/\(id)").body["user"] as? String) == "alice"
                }
            }
        }

        @Test func cancelAndRerouteThroughTheGatewayActWithinASecond() async throws {
            try await withHarness("gw-cancel") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let silent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .silent)
                defer { Task { await silent.stop() } }
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                let gw = try await h.startGateway()

                // A slow one, with an agent that never answers: cancelled.
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"slow-1","input":"\#(Self.seed)"}"#).status == 202)
                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/slow-1/events", token: TestGateway.tokens["alice"])
                try await sse.waitFor("sending") { $0.contains { $0.event == "sending" } }
                let asked = ContinuousClock.now
                let cancel = try await gw.call("POST", "/v1/dispatches/slow-1/cancel", body: #"{"reason":"changed my mind"}"#)
                #expect(cancel.status == 202)
                let events = try await sse.waitFor("cancelled", within: .seconds(5)) { $0.contains { $0.event == "cancelled" } }
                let took = ContinuousClock.now - asked
                #expect(took < .seconds(1), "cancelled after \(took)")
                #expect((events.last?.json["cancel"] as? [String: Any])?["reason"] as? String == "changed my mind")
                try await waitUntil("the stream to end", within: .seconds(5)) { sse.isClosed }

                // Queued for an offline target: rerouted, with a new queued event showing the new route.
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"q-1","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                let q = try SSEClient(port: gw.port, path: "/v1/dispatches/q-1/events", token: TestGateway.tokens["alice"])
                try await q.waitFor("queued") { $0.contains { $0.event == "queued" } }
                let unknown = try await gw.call("POST", "/v1/dispatches/q-1/reroute", body: #"{"project":"acme","target":"nowhere"}"#)
                #expect(unknown.status == 422)
                #expect((unknown.body["error"] as? [String: Any])?["code"] as? String == "unknown_target")
                let rerouted = ContinuousClock.now
                #expect(try await gw.call("POST", "/v1/dispatches/q-1/reroute", body: #"{"project":"yemaya","target":"board-prep"}"#).status == 202)
                try await q.waitFor("a queued or sending event for board-prep", within: .seconds(5)) { events in
                    events.contains { ($0.json["target"] as? [String: Any])?["id"] as? String == "board-prep" }
                }
                #expect(ContinuousClock.now - rerouted < .seconds(1))
            }
        }

        @Test func badRequestsGetAnErrorWithACode() async throws {
            try await withHarness("gw-bad") { h in
                try await h.startRouter()
                try await h.startSender()
                let gw = try await h.startGateway()
                func code(_ r: (status: Int, body: [String: Any], data: Data)) -> String? {
                    (r.body["error"] as? [String: Any])?["code"] as? String
                }
                let big = #"{"input":""# + String(repeating: "a", count: 70_000) + #""}"#
                let tooLarge = try await gw.call("POST", "/v1/dispatches", body: big)
                #expect(tooLarge.status == 413 && code(tooLarge) == "too_large")
                // Without a Content-Length (chunked), found too large while it
                // arrives: the same 413 once it has all come, not a dropped connection.
                let head = "POST /v1/dispatches HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(TestGateway.tokens["alice"]!)\r\nContent-Type: application/json\r\nConnection: close\r\n"
                let chunked = try gw.chunkedCall(head, body: Data(big.utf8))
                #expect(chunked.hasPrefix("HTTP/1.1 413") && chunked.contains("\"too_large\""), "\(chunked.prefix(300))")
                // Without a valid token, the 401 any other request gets, with the body over the limit or not
                // (declared, or found while it arrives): the limit is nobody's business but a user's.
                let anonymous = try await gw.call("POST", "/v1/dispatches", user: nil, body: big)
                #expect(anonymous.status == 401 && code(anonymous) == "unauthorized", "\(anonymous.status)")
                let forged = try await gw.call("POST", "/v1/dispatches/x-1/cancel", user: nil, body: big, headers: ["Authorization": "Bearer forged"])
                #expect(forged.status == 401 && code(forged) == "unauthorized", "\(forged.status)")
                let badHead = head.replacingOccurrences(of: TestGateway.tokens["alice"]!, with: "forged")
                let chunkedForged = try gw.chunkedCall(badHead, body: Data(big.utf8))
                #expect(
                    chunkedForged.hasPrefix("HTTP/1.1 401") && chunkedForged.contains("\"unauthorized\"")
                        && chunkedForged.lowercased().contains("www-authenticate: bearer"), "\(chunkedForged.prefix(300))")
                // Announced over the limit and never sent: the 401 at once, the body not waited for. One under
                // the limit is read first (closing on unread bytes could reach the client as a reset, not a 401).
                let started = ContinuousClock.now
                let unsent = try gw.rawCall(Data("POST /v1/dispatches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 70000\r\n\r\n".utf8))
                #expect(unsent.hasPrefix("HTTP/1.1 401") && unsent.contains("\"unauthorized\""), "\(unsent.prefix(300))")
                #expect(ContinuousClock.now - started < .seconds(3))
                let tiny = #"{"input":"x"}"#
                let read = try gw.rawCall(Data("POST /v1/dispatches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: \(tiny.utf8.count)\r\nConnection: close\r\n\r\n\(tiny)".utf8))
                #expect(read.hasPrefix("HTTP/1.1 401") && read.contains("\"unauthorized\"") && read.lowercased().contains("www-authenticate: bearer"), "\(read.prefix(300))")
                // A client that waits for 100 Continue is refused at once: it sends no body in vain.
                let expecting = try gw.rawCall(Data("POST /v1/dispatches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n".utf8))
                #expect(expecting.hasPrefix("HTTP/1.1 401") && expecting.contains("\"unauthorized\""), "\(expecting.prefix(300))")
                // A head without Host is malformed: a JSON 400, once the token passed (without one: the 401).
                let hostless = try gw.rawCall(Data("GET /v1/targets HTTP/1.1\r\nConnection: close\r\n\r\n".utf8))
                #expect(hostless.hasPrefix("HTTP/1.1 401") && hostless.contains("\"unauthorized\""), "\(hostless.prefix(300))")
                let hostlessWithToken = try gw.rawCall(Data(
                    "GET /v1/targets HTTP/1.1\r\nAuthorization: Bearer \(TestGateway.tokens["alice"]!)\r\nConnection: close\r\n\r\n".utf8))
                #expect(
                    hostlessWithToken.hasPrefix("HTTP/1.1 400") && hostlessWithToken.contains("\"invalid_request\""),
                    "\(hostlessWithToken.prefix(300))")
                // Off /v1 no token is asked for: the 413.
                #expect(try await gw.call("POST", "/", user: nil, body: big).status == 413)
                // A small chunked body is read as any other.
                let small = try gw.chunkedCall(head, body: Data(#"{"id":"chunked-1","input":"the contract","project":"acme","target":"legal"}"#.utf8), chunk: 7)
                #expect(small.hasPrefix("HTTP/1.1 202"), "\(small.prefix(300))")
                let notJSON = try await gw.call("POST", "/v1/dispatches", body: "{nope")
                #expect(notJSON.status == 400 && code(notJSON) == "invalid_json")
                let noInput = try await gw.call("POST", "/v1/dispatches", body: #"{"id":"x-1"}"#)
                #expect(noInput.status == 400 && code(noInput) == "invalid_request")
                let badID = try await gw.call("POST", "/v1/dispatches", body: #"{"id":"a/b","input":"x"}"#)
                #expect(badID.status == 400)
                let wrongMethod = try await gw.call("DELETE", "/v1/dispatches")
                #expect(wrongMethod.status == 405 && code(wrongMethod) == "method_not_allowed")
                #expect(try await gw.call("GET", "/v1/nothing").status == 404)
                #expect(try await gw.call("GET", "/v1/dispatches/never-seen").status == 404)
                // A path is decoded a segment at a time: an escaped "/" or NUL is part of the id, no way to another endpoint.
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"esc-1","input":"x","project":"acme","target":"legal"}"#).status == 202)
                try await waitUntil("the gateway to know esc-1", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/esc-1").status) == 200
                }
                #expect(try await gw.call("GET", "/v1/dispatches/esc%2D1").status == 200)
                #expect(try await gw.call("GET", "/v1/dispatches/esc-1%2Fevents").status == 404)
                #expect(try await gw.call("GET", "/v1/dispatches/esc-1%00junk").status == 404)
                #expect(try await gw.call("POST", "/v1/dispatches/esc-1%2Fcancel", body: "{}").status == 404)
                let route = try await gw.call("GET", "/v1/route?input=")
                #expect(route.status == 400)
                // Nothing of it reached the broker as a dispatch.
                #expect(try await h.messages("frontdesk.dead") == 0)
            }
        }

        /// A token added or revoked in the tokens file counts within seconds,
        /// with no restart; a file that no longer reads as tokens changes nothing.
        @Test func theTokensFileIsReadAgainWhenItChanges() async throws {
            try await withHarness("gw-tokens") { h in
                let path = FileManager.default.temporaryDirectory.appendingPathComponent("tokens-\(UUID().uuidString).json").path
                defer { try? FileManager.default.removeItem(atPath: path) }
                func write(_ users: [String], raw: String? = nil) throws {
                    var object: [String: String] = [:]
                    for user in users { object[TestGateway.sha256(TestGateway.tokens[user]!)] = user }
                    let data = try raw.map { Data($0.utf8) } ?? JSONSerialization.data(withJSONObject: object)
                    // As a Secret or an editor replaces it: a new file moved over the old one.
                    try data.write(to: URL(fileURLWithPath: path + ".new"))
                    _ = rename(path + ".new", path)
                }
                try write(["alice"])
                let gw = try await h.startGateway(extraEnvironment: ["FRONTDESK_GATEWAY_TOKENS": path])
                #expect(try await gw.call("GET", "/v1/targets", user: "alice").status == 200)
                #expect(try await gw.call("GET", "/v1/targets", user: "bob").status == 401)
                try write(["bob"])
                try await waitUntil("bob's token taken", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/targets", user: "bob").status) == 200
                }
                #expect(try await gw.call("GET", "/v1/targets", user: "alice").status == 401)
                try write(["alice", "bob"])
                try await waitUntil("both tokens taken", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/targets", user: "alice").status) == 200
                }
                #expect(try await gw.call("GET", "/v1/targets", user: "bob").status == 200)
                // Not tokens any more: the ones in use stay.
                try write([], raw: "{not json")
                try await waitUntil("the bad file seen", within: .seconds(10)) {
                    (try? await h.metrics(gw.process))?.contains(#"frontdesk_gateway_token_reads_total{result="kept"} 1"#) == true
                }
                #expect(try await gw.call("GET", "/v1/targets", user: "alice").status == 200)
                #expect(try await gw.call("GET", "/v1/targets", user: "bob").status == 200)
            }
        }

        @Test func targetsRouteAndActivity() async throws {
            try await withHarness("gw-targets") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                let agent = try await TestAgent(url: h.url, queue: "frontdesk.agent.yemaya.board-prep", behaviour: .reply)
                defer { Task { await agent.stop() } }
                try await h.waitUntilSenderSeesAgents(sender, on: "yemaya/board-prep")
                // Registrations go to whoever binds dispatch.activity (the pusher); here, a test queue.
                try await h.channel.queueDeclare("frontdesk.test.activity", arguments: ["x-queue-type": "quorum"])
                try await h.channel.queueBind("frontdesk.test.activity", exchange: "frontdesk.commands", routingKey: "dispatch.activity")
                let gw = try await h.startGateway()
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"park-1","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                _ = try await h.events(until: "park-1", reaches: "queued")

                var projects: [[String: Any]] = []
                try await waitUntil("presence: board-prep online, legal with one parked", within: .seconds(10)) {
                    projects = (try? await gw.call("GET", "/v1/targets").body["projects"] as? [[String: Any]]) ?? []
                    let targets = projects.flatMap { ($0["targets"] as? [[String: Any]]) ?? [] }
                    let board = targets.first { $0["id"] as? String == "board-prep" }
                    let legal = targets.first { $0["id"] as? String == "legal" }
                    return board?["online"] as? Bool == true && legal?["online"] as? Bool == false && legal?["parked"] as? Int == 1
                }
                #expect(projects.first?["accent"] as? String == "#6E56CF")
                #expect(projects.first?["glyph"] as? String == "YE")

                let guess = try await gw.call("GET", "/v1/route?input=" + "the AGM agenda for Lisa".addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed)!)
                #expect(guess.status == 200)
                #expect((guess.body["target"] as? [String: Any])?["id"] as? String == "board-prep")
                #expect(((guess.body["route"] as? [String: Any])?["reason"] as? String)?.isEmpty == false)
                // The longest input a request may have, of two-byte characters: ~24 KB percent-encoded in the URL.
                let longest = "Lisa: the AGM agenda " + String(repeating: "é", count: 4000 - 21)
                let long = try await gw.call("GET", "/v1/route?input=" + longest.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)
                #expect(long.status == 200)
                #expect((long.body["target"] as? [String: Any])?["id"] as? String == "board-prep")
                // A "%00" is a character of the input, not its end: what follows it counts.
                let nul = try await gw.call("GET", "/v1/route?input=hello%00%40acme/legal")
                #expect(nul.status == 200 && (nul.body["target"] as? [String: Any])?["id"] as? String == "legal", "\(nul.body)")

                let registered = try await gw.call("PUT", "/v1/dispatches/park-1/activity", body: #"{"pushToken":"00FFab12","environment":"sandbox"}"#)
                #expect(registered.status == 204)
                let bad = try await gw.call("PUT", "/v1/dispatches/park-1/activity", body: #"{"pushToken":"not hex"}"#)
                #expect(bad.status == 400)
                let messages = try await h.drain("frontdesk.test.activity", count: 1)
                let body = try #require(try JSONSerialization.jsonObject(with: messages[0].body) as? [String: Any])
                #expect(body["id"] as? String == "park-1")
                #expect(body["pushToken"] as? String == "00ffab12")
                #expect(body["environment"] as? String == "sandbox")
                // The router left it alone: no dead letter.
                try await Task.sleep(for: .milliseconds(300))  // an idle period: what a dead letter would need to appear
                #expect(try await h.messages("frontdesk.dead") == 0)
            }
        }

        @Test func aLongHistoryReplaysWholeAndStreamsPerUserAreCapped() async throws {
            try await withHarness("gw-history") { h in
                try await h.startRouter()
                let sender = try await h.startSender()
                // An agent that streams a 200 KB single line eight times: a history of several MiB.
                let agentConnection = try await AMQPConnection.connect(.init(url: h.url, connectionName: "big-agent"))
                let tasks = try await agentConnection.openChannel()
                try await tasks.queueDeclare("frontdesk.agent.acme.legal", arguments: ["x-queue-type": "quorum"])
                let replies = try await agentConnection.openChannel()
                try await replies.confirmSelect()
                let consumer = try await tasks.consume(queue: "frontdesk.agent.acme.legal")
                let worker = Task {
                    for try await task in consumer {
                        let body = try JSONSerialization.jsonObject(with: task.body) as? [String: Any] ?? [:]
                        let line = String(repeating: "x", count: 200_000)
                        for kind in Array(repeating: "progress", count: 8) + ["final"] {
                            let reply: [String: Any] = ["dispatchId": body["dispatchId"] ?? "", "attempt": body["attempt"] ?? 1, "kind": kind, "text": line]
                            try await replies.publish(
                                exchange: "", routingKey: "frontdesk.replies", body: try JSONSerialization.data(withJSONObject: reply),
                                properties: AMQPProperties(contentType: "application/json", deliveryMode: 2))
                        }
                        try task.ack()
                    }
                }
                defer {
                    worker.cancel()
                    Task { await agentConnection.close() }
                }
                try await h.waitUntilSenderSeesAgents(sender, on: "acme/legal")
                let gw = try await h.startGateway()
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"big-1","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                _ = try await h.events(until: "big-1", reaches: "replied", within: .seconds(30))
                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/big-1/events", token: TestGateway.tokens["alice"])
                try await waitUntil("the whole history to arrive and the stream to end", within: .seconds(20)) { sse.isClosed }
                let events = sse.events
                #expect(events.last?.event == "replied", "got \(events.count) events, \(sse.text.utf8.count) bytes")
                #expect(sse.text.utf8.count > 1 << 20, "more than the 1 MiB a slow client could queue live")

                // One user's streams are capped (FRONTDESK_GATEWAY_STREAMS_PER_USER; 1,024 by
                // default, 64 here); another user is not affected.
                let capped = try await h.startGateway(extraEnvironment: ["FRONTDESK_GATEWAY_STREAMS_PER_USER": "64"])
                #expect(try await capped.call("POST", "/v1/dispatches", body: #"{"id":"cap-1","input":"the contract","project":"yemaya","target":"board-prep"}"#).status == 202)
                var open: [SSEClient] = []
                for _ in 0..<64 { open.append(try SSEClient(port: capped.port, path: "/v1/dispatches/cap-1/events", token: TestGateway.tokens["alice"])) }
                try await waitUntil("64 streams open", within: .seconds(10)) { open.allSatisfy { $0.status == 200 } }
                let refused = try await capped.call("GET", "/v1/dispatches/cap-1/events")
                #expect(refused.status == 429)
                #expect(try await capped.call("GET", "/v1/dispatches/cap-1").status == 200)
                // Streams whose clients closed make room at once, not at the next keep-alive (15 s).
                for s in open.prefix(4) { s.close() }
                // (The gateway looks at a capped user's streams at most once a second: a try within a second
                // of the last 429 may get another.)
                var again: [SSEClient] = []
                try await waitUntil("4 streams in place of the 4 closed", within: .seconds(5)) {
                    let next = try SSEClient(port: capped.port, path: "/v1/dispatches/cap-1/events", token: TestGateway.tokens["alice"])
                    try await waitUntil("its answer", within: .seconds(2)) { next.status != 0 }
                    if next.status == 200 { again.append(next) } else { next.close() }
                    return again.count == 4
                }
                #expect(try await capped.call("GET", "/v1/dispatches/cap-1/events").status == 429, "the cap holds for the open ones")
                #expect(try await capped.call("POST", "/v1/dispatches", user: "bob", body: #"{"id":"cap-bob","input":"the contract","project":"yemaya","target":"board-prep"}"#).status == 202)
                let bobs = try SSEClient(port: capped.port, path: "/v1/dispatches/cap-bob/events", token: TestGateway.tokens["bob"])
                try await waitUntil("bob's stream open", within: .seconds(5)) { bobs.status == 200 }
                // The default leaves room for more than 64 of one user's streams.
                var more: [SSEClient] = []
                for _ in 0..<80 { more.append(try SSEClient(port: gw.port, path: "/v1/dispatches/cap-1/events", token: TestGateway.tokens["alice"])) }
                try await waitUntil("80 streams open", within: .seconds(10)) { more.allSatisfy { $0.status == 200 } }
            }
        }

        /// The gateway's live queue (exclusive, auto-delete) goes when its
        /// consumer's channel does, or when someone deletes it: it is
        /// declared again and consumed, and dispatches go on showing. A
        /// restart used to wait for a passive declare that could never find it.
        @Test func aLiveQueueDeletedUnderTheGatewayIsDeclaredAgain() async throws {
            try await withHarness("gw-live") { h in
                try await h.startRouter()
                try await h.startSender()
                let gw = try await h.startGateway()
                /// The gateway's live queues and their consumers.
                func live() throws -> [String: Int] {
                    var found: [String: Int] = [:]
                    for line in try TestBroker.script(["ctl", "list_queues", "-p", h.vhost, "-q", "name", "consumers"]).split(separator: "\n") {
                        let fields = line.split(separator: "\t")
                        if fields.count == 2, fields[0].hasPrefix("frontdesk.gateway.live.") { found[String(fields[0])] = Int(fields[1]) }
                    }
                    return found
                }
                try await waitUntil("the live queue consumed") { try live().count == 1 && live().values.first == 1 }
                let name = try #require(try live().keys.first)
                _ = try TestBroker.script(["ctl", "delete_queue", "-p", h.vhost, name])  // (exclusive: no other connection may)
                try await waitUntil("the live queue declared and consumed again") { try live() == [name: 1] }
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"live-1","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                try await waitUntil("live-1 queued, as the gateway shows it") {
                    (try? await gw.call("GET", "/v1/dispatches/live-1").body["state"] as? String) == "queued"
                }
            }
        }

        @Test func aGatewayStoppedUnderLoadExitsCleanly() async throws {
            try await withHarness("gw-stop") { h in
                try await h.startRouter()
                try await h.startSender()
                let gw = try await h.startGateway()
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"s-1","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                var streams: [SSEClient] = []
                for _ in 0..<20 { streams.append(try SSEClient(port: gw.port, path: "/v1/dispatches/s-1/events", token: TestGateway.tokens["alice"])) }
                // Requests for unknown ids wait (suspended) for a second: many are waiting when SIGTERM comes.
                let load = Task {
                    await withTaskGroup(of: Void.self) { group in
                        for i in 0..<40 {
                            group.addTask { _ = try? await gw.call("GET", "/v1/dispatches/unknown-\(i)/events") }
                        }
                    }
                }
                try await waitUntil("20 streams open", within: .seconds(10)) { streams.allSatisfy { $0.status == 200 } }
                kill(gw.process.processIdentifier, SIGTERM)
                try await waitUntil("the gateway to exit", within: .seconds(25)) { !gw.process.isRunning }
                #expect(gw.process.terminationReason == .exit)
                #expect(gw.process.terminationStatus == 0)
                load.cancel()
                try await waitUntil("its streams to end", within: .seconds(5)) { streams.allSatisfy(\.isClosed) }
            }
        }

        /// On a cluster the router's routing event can reach the gateway after
        /// the sender's sending one: an open stream writes it too, not only
        /// events above the last seq it wrote.
        @Test func anEventThatComesLateWithALowerSeqStillReachesTheStream() async throws {
            try await withHarness("gw-late") { h in
                let gw = try await h.startGateway()
                func event(_ seq: Int, _ state: String) async throws { try await h.publishStatus("late-1", seq: seq, state: state) }
                try await event(1, "drafted")
                try await event(3, "sending")
                try await waitUntil("the gateway to know late-1", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/late-1").status) == 200
                }
                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/late-1/events", token: TestGateway.tokens["alice"])
                try await waitUntil("the replay", within: .seconds(10)) { sse.events.count == 2 }
                try await event(2, "routing")
                try await event(4, "replied")
                try await waitUntil("the stream to end", within: .seconds(10)) { sse.isClosed }
                #expect(sse.events.map { $0.id ?? "?" } == ["1", "3", "2", "4"])
                #expect(sse.events.map { $0.event ?? "?" } == ["drafted", "sending", "routing", "replied"])
                // Resumed after 3 (the highest it saw): only the later ones, 4.
                let resumed = try SSEClient(port: gw.port, path: "/v1/dispatches/late-1/events", token: TestGateway.tokens["alice"], lastEventID: "3")
                try await waitUntil("the resumed stream to end", within: .seconds(10)) { resumed.isClosed }
                #expect(resumed.events.map { $0.id ?? "?" } == ["4"])
            }
        }

        /// The gateway's broker connection drops while a stream is open: events
        /// that came while it was away are still written, in seq order, before
        /// the later ones (the log is read from where it left off, and the live
        /// copies wait until it has caught up). Before, the log was read again
        /// from the lifetime window's start, and live events overtook the gap.
        @Test func aStreamKeepsItsOrderAcrossAReconnectOfTheGateway() async throws {
            try await withHarness("gw-reconnect") { h in
                let router = try await h.startRouter()  // the topology, then gone
                kill(router.processIdentifier, SIGKILL)
                router.waitUntilExit()
                let gw = try await h.startGateway()
                func event(_ seq: Int, _ state: String) async throws { try await h.publishStatus("rc-1", seq: seq, state: state) }
                // A log long enough that reading it again takes a while.
                let filler = (0..<30000).map { i in
                    OutboundMessage(
                        exchange: "frontdesk.status", routingKey: "status.yemaya.board-prep.drafted",
                        body: Data(#"{"dispatchId":"filler-\#(i)","seq":1,"state":"drafted","at":"2026-12-04T12:00:00.000Z","user":"bob","input":"x"}"#.utf8),
                        properties: .persistentJSON(messageID: "filler-\(i)/1", correlationID: "filler-\(i)", type: "frontdesk.status.v1"))
                }
                for chunk in stride(from: 0, to: filler.count, by: 500) {
                    _ = try await h.channel.publish(Array(filler[chunk..<min(filler.count, chunk + 500)]))
                }
                try await event(1, "drafted")
                try await waitUntil("the gateway to know rc-1", within: .seconds(20)) {
                    (try? await gw.call("GET", "/v1/dispatches/rc-1").status) == 200
                }
                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/rc-1/events", token: TestGateway.tokens["alice"])
                _ = try await sse.waitFor("drafted") { !$0.isEmpty }
                func logReads() async throws -> Double {
                    let text = try await h.metrics(gw.process)
                    let line = text.split(separator: "\n").first { $0.hasPrefix("frontdesk_gateway_log_reads_total ") }
                    return Double(line?.split(separator: " ").last ?? "") ?? -1
                }
                // The whole log read (the filler, rc-1's event, the start's marker) before the reconnect.
                try await waitUntil("the gateway to read the log", within: .seconds(30)) { (try? await logReads()) ?? 0 >= 30002 }
                let readBefore = try await logReads()
                // Drop the gateway's connection (not its alarm probe's).
                func gatewayConnection() throws -> String? {
                    let rows = try TestBroker.script(["ctl", "list_connections", "pid", "vhost", "client_properties", "--silent"])
                    return rows.split(separator: "\n").first {
                        $0.contains("\t\(h.vhost)\t") && $0.contains("\"frontdesk-gateway@") && !$0.contains("(alarm probe)")
                    }?.split(separator: "\t").first.map(String.init)
                }
                let name = try #require(try gatewayConnection())  // its pid: what close_connection takes
                _ = try TestBroker.script(["ctl", "close_connection", name, "test"])
                try await event(2, "routing")  // while it is away (or just back): the log has it
                try await waitUntil("the gateway to connect again", within: .seconds(20)) {
                    guard let now = try? gatewayConnection() else { return false }
                    return now != name
                }
                try await waitUntil("the gateway's consumers to start again", within: .seconds(20)) {
                    (try? await logReads()) ?? 0 > readBefore
                }
                try await event(3, "sending")
                try await event(4, "replied")
                try await waitUntil("the stream to end", within: .seconds(20)) { sse.isClosed }
                #expect(sse.events.compactMap(\.id) == ["1", "2", "3", "4"], "\(sse.events.map { "\($0.id ?? "?") \($0.event ?? "?")" })")
                // The reconnect read on from where the log was left, not the whole window again.
                let readAfter = try await logReads()
                #expect(readAfter - readBefore < 100, "read \(readAfter - readBefore) messages of the log again")
            }
        }

        /// A client resuming with a Last-Event-ID beyond any seq the dispatch
        /// has (a stale or made-up one) gets none of its events, but its stream
        /// still ends with the dispatch: after the terminal event, not never.
        /// So does one waiting on a posted id that turns out to be another's.
        @Test func aStreamResumedPastTheLastSeqEndsWithTheDispatch() async throws {
            try await withHarness("gw-resume-past") { h in
                // Started to declare the topology, then gone: no event comes but the test's.
                let router = try await h.startRouter()
                kill(router.processIdentifier, SIGKILL)
                router.waitUntilExit()
                let gw = try await h.startGateway()
                func event(_ seq: Int, _ state: String) async throws { try await h.publishStatus("past-1", seq: seq, state: state) }
                try await event(1, "drafted")
                try await waitUntil("the gateway to know past-1", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/past-1").status) == 200
                }
                let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/past-1/events", token: TestGateway.tokens["alice"], lastEventID: "999")
                // Open, waiting: the gateway counts it among its streams.
                try await waitUntil("the stream to be held open", within: .seconds(10)) {
                    (try? await h.metrics(gw.process))?.contains("frontdesk_gateway_streams 1") == true
                }
                try await event(2, "sending")
                try await event(3, "replied")
                try await waitUntil("the stream to end with the dispatch", within: .seconds(10)) { sse.isClosed }
                #expect(sse.events.isEmpty, "\(sse.text)")
                try await waitUntil("the gateway to let the stream go", within: .seconds(10)) {
                    (try? await h.metrics(gw.process))?.contains("frontdesk_gateway_streams 0") == true
                }

                // A stream opened on a posted id before its first event, when that
                // event shows the dispatch is another's: it ends too, with nothing.
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"past-2","input":"the contract"}"#).status == 202)
                let early = try SSEClient(port: gw.port, path: "/v1/dispatches/past-2/events", token: TestGateway.tokens["alice"])
                try await waitUntil("the early stream to be held open", within: .seconds(10)) {
                    (try? await h.metrics(gw.process))?.contains("frontdesk_gateway_streams 1") == true
                }
                try await h.publishStatus("past-2", seq: 1, state: "drafted", user: "bob")
                try await waitUntil("the early stream to end", within: .seconds(10)) { early.isClosed }
                #expect(early.events.isEmpty, "\(early.text)")
            }
        }

        /// A long history is replayed in parts: the stream ends after
        /// FRONTDESK_GATEWAY_REPLAY_BYTES and a client resuming with the last id
        /// it got gets the next part, until the terminal event; every event
        /// once, in order. (An agent sets the pace of a dispatch's events.)
        @Test func aLongHistoryIsReplayedInPartsThatResume() async throws {
            try await withHarness("gw-replay-parts") { h in
                let gw = try await h.startGateway(extraEnvironment: ["FRONTDESK_GATEWAY_REPLAY_BYTES": "2048"])
                let padding = String(repeating: "p", count: 300)
                let count = 40
                for seq in 1...count {
                    let state = seq == 1 ? "drafted" : seq == 2 ? "routing" : seq == count ? "replied" : "sending"
                    let body = #"{"dispatchId":"long-1","seq":\#(seq),"state":"\#(state)","at":"2026-12-04T12:00:00.000Z","user":"alice","input":"\#(padding)"}"#
                    try await h.channel.publish(
                        exchange: "frontdesk.status", routingKey: "status.yemaya.board-prep.\(state)", body: Data(body.utf8),
                        properties: .persistentJSON(messageID: "long-1/\(seq)", correlationID: "long-1", type: "frontdesk.status.v1"))
                }
                try await waitUntil("the gateway to know all of long-1", within: .seconds(10)) {
                    (try? await gw.call("GET", "/v1/dispatches/long-1").body["seq"] as? Int) == count
                }
                var seen: [Int] = []
                var parts = 0
                var last: String?
                while seen.last != count, parts < 3 * count {
                    let sse = try SSEClient(port: gw.port, path: "/v1/dispatches/long-1/events", token: TestGateway.tokens["alice"], lastEventID: last)
                    try await waitUntil("part \(parts + 1) to end", within: .seconds(10)) { sse.isClosed }
                    #expect(sse.status == 200)
                    let ids = sse.events.compactMap { Int($0.id ?? "") }
                    #expect(!ids.isEmpty && sse.text.utf8.count < 2048 + 1024, "a part is about the limit: \(sse.text.utf8.count) bytes")
                    if ids.last != count { #expect(sse.events.last?.event == "sending" || sse.events.last?.event == "routing") }
                    seen += ids
                    last = ids.last.map(String.init) ?? last
                    parts += 1
                }
                #expect(seen == Array(1...count), "every event once, in order: \(seen)")
                #expect(parts >= 5, "40 events of ~400 bytes in parts of 2 KiB: \(parts)")
                let metrics = try await h.metrics(gw.process)
                #expect(metrics.contains("frontdesk_gateway_replays_cut_total \(parts - 1)"))
            }
        }

        @Test func clientsThatHoldConnectionsOrReadNothingDelayNoOne() async throws {
            try await withHarness("gw-slow") { h in
                try await h.startRouter()
                try await h.startSender()
                let gw = try await h.startGateway()
                #expect(try await gw.call("POST", "/v1/dispatches", body: #"{"id":"q-2","input":"the contract","project":"acme","target":"legal"}"#).status == 202)
                var idle: [Int32] = []
                defer { for fd in idle { close(fd) } }
                for i in 0..<220 {
                    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
                    var address = sockaddr_in()
                    address.sin_family = sa_family_t(AF_INET)
                    address.sin_port = in_port_t(UInt16(gw.port).bigEndian)
                    address.sin_addr.s_addr = inet_addr("127.0.0.1")
                    _ = withUnsafePointer(to: &address) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
                    }
                    // Every tenth starts a request and never finishes it.
                    if i % 10 == 0 { _ = "POST /v1/dispatches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{".withCString { send(fd, $0, strlen($0), 0) } }
                    idle.append(fd)
                }
                // Streams whose clients never read.
                var streams: [SSEClient] = []
                for _ in 0..<20 { streams.append(try SSEClient(port: gw.port, path: "/v1/dispatches/q-2/events", token: TestGateway.tokens["alice"])) }
                for _ in 0..<5 {
                    let start = ContinuousClock.now
                    let answer = try await gw.call("GET", "/v1/dispatches/q-2")
                    #expect(answer.status == 200)
                    #expect(ContinuousClock.now - start < .seconds(1))
                }
                #expect(streams.count == 20)
            }
        }
    }
}

extension RouterHarness {
    /// Publishes a status event of `id` as the services would (seq < 10), for the gateway to take.
    func publishStatus(_ id: String, seq: Int, state: String, user: String = "alice") async throws {
        let body = #"{"dispatchId":"\#(id)","seq":\#(seq),"state":"\#(state)","at":"2026-12-04T12:00:0\#(seq).000Z","user":"\#(user)","input":"the agm agenda"}"#
        try await channel.publish(
            exchange: "frontdesk.status", routingKey: "status.yemaya.board-prep.\(state)", body: Data(body.utf8),
            properties: .persistentJSON(messageID: "\(id)/\(seq)", correlationID: id, type: "frontdesk.status.v1"))
    }
}
