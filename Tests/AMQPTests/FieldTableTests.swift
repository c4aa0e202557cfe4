@testable import AMQP
import Foundation
import Testing

@Suite("Field tables and properties through rabbitmq-c's C types")
struct FieldTableTests {
    @Test func everyKindSurvivesTheCEncoding() {
        let table: FieldTable = [
            "x-queue-type": "quorum",
            "x-message-ttl": .int32(60_000),
            "x-max-length": .int64(1 << 40),
            "x-single-active-consumer": true,
            "x-stream-offset": .timestamp(1_778_665_260),
            "i8": .int8(-8), "u8": .uint8(8), "i16": .int16(-16), "u16": .uint16(16), "u32": .uint32(32),
            "f": .float(1.5), "d": .double(-2.25), "dec": .decimal(decimals: 2, value: 1234),
            "raw": .bytes(Data([0, 1, 2, 255])),
            "nested": .table(["deeper": .table(["k": "v"]), "list": .array(["a", 1, .array([true])])]),
            "empty-list": .array([]), "void": .void,
        ]
        let arena = CArena()
        let c = arena.table(table)
        #expect(c.num_entries == Int32(table.count))
        #expect(FieldTable(c) == table)
    }

    @Test func emptyAndNilTablesEncodeAsEmpty() {
        let arena = CArena()
        #expect(arena.table(nil).num_entries == 0)
        #expect(arena.table(FieldTable()).num_entries == 0)
        #expect(FieldTable(arena.table(nil)).isEmpty)
    }

    @Test func propertiesRoundTripAndUnsetStaysUnset() {
        let arena = CArena()
        let full = AMQPProperties(
            contentType: "application/json", contentEncoding: "utf-8", headers: ["x-frontdesk-error": "too_large"],
            deliveryMode: 2, priority: 9, correlationID: "c", replyTo: "r", expiration: "1000", messageID: "m",
            timestamp: 42, type: "frontdesk.status.v1", userID: "router", appID: "app")
        #expect(AMQPProperties(arena.properties(full)) == full)
        let sparse = AMQPProperties(messageID: "only")
        #expect(AMQPProperties(arena.properties(sparse)) == sparse)
        #expect(AMQPProperties(arena.properties(AMQPProperties())) == AMQPProperties())
    }

    @Test func lookupsTakeTheLastEntryAndAssignmentReplaces() {
        var t: FieldTable = ["a": 1]
        t["a"] = "two"
        t["b"] = true
        #expect(t["a"] == .string("two"))
        #expect(t.count == 2)
        t["a"] = nil
        #expect(t["a"] == nil)
        #expect(FieldValue.int32(5).intValue == 5)
        #expect(FieldValue.bytes(Data("x".utf8)).stringValue == "x")
        #expect(FieldValue.string("x").intValue == nil)
    }
}
