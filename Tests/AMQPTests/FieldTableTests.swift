@testable import AMQP
import CRabbitMQ
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

@Suite("Field tables from untrusted peers")
struct FieldTableLimitsTests {
    /// `encodedSize` is what rabbitmq-c writes for the same table.
    @Test(arguments: [0, 1, 2, 3, 4, 5, 6, 7])
    func encodedSizeIsWhatRabbitMQCWrites(seed: UInt64) throws {
        var rng = SplitMix(seed)
        var table = FieldTable()
        for i in 0..<Int(rng.next() % 20) {
            table[String(repeating: "k", count: Int(rng.next() % 40)) + "\(i)"] = Self.value(&rng, depth: 0)
        }
        let arena = CArena()
        var c = arena.table(table)
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var offset = 0
        let status = buffer.withUnsafeMutableBytes { raw in
            amqp_encode_table(amqp_bytes_t(len: raw.count, bytes: raw.baseAddress), &c, &offset)
        }
        #expect(status == 0)
        #expect(table.encodedSize == offset)
    }

    static func value(_ rng: inout SplitMix, depth: Int) -> FieldValue {
        switch rng.next() % (depth < 4 ? 16 : 14) {
        case 0: .string(String(repeating: "é", count: Int(rng.next() % 300)))
        case 1: .bytes(Data(repeating: 7, count: Int(rng.next() % 100)))
        case 2: .bool(rng.next() % 2 == 0)
        case 3: .int8(-3)
        case 4: .int16(-300)
        case 5: .int32(-70_000)
        case 6: .int64(Int64.min)
        case 7: .uint8(200)
        case 8: .uint16(60_000)
        case 9: .uint32(4_000_000_000)
        case 10: .float(1.5)
        case 11: .double(-2.5)
        case 12: .decimal(decimals: 2, value: 12_345)
        case 13: rng.next() % 2 == 0 ? .timestamp(rng.next()) : .void
        case 14: .table(FieldTable((0..<Int(rng.next() % 5)).map { ("n\($0)", value(&rng, depth: depth + 1)) }))
        default: .array((0..<Int(rng.next() % 5)).map { _ in value(&rng, depth: depth + 1) })
        }
    }

    /// A key read from the wire can be longer than AMQP carries: each byte
    /// that is not UTF-8 reads as U+FFFD, three bytes. Such a table is caught
    /// before rabbitmq-c would write its length cut to one byte.
    @Test func keysThatGrowWhenReadAreCaught() {
        let raw = [UInt8](repeating: 0xFF, count: 255)
        let table = raw.withUnsafeBufferPointer { k in
            var v = amqp_field_value_t()
            v.kind = UInt8(truncatingIfNeeded: AMQP_FIELD_KIND_BOOLEAN.rawValue)
            v.value.boolean = 1
            var entry = amqp_table_entry_t(key: amqp_bytes_t(len: 255, bytes: UnsafeMutableRawPointer(mutating: k.baseAddress)), value: v)
            return withUnsafeMutablePointer(to: &entry) { FieldTable(amqp_table_t(num_entries: 1, entries: $0)) }
        }
        #expect(table.entries.first?.key.utf8.count == 765)
        #expect(!table.keysFit)
        let outer: FieldTable = ["outer": .array([.int8(1), .table(table)])]
        #expect(!outer.keysFit)
        let message = OutboundMessage(exchange: "", routingKey: "q", body: Data(), properties: AMQPProperties(headers: table))
        #expect(message.amqpCannotCarry == "a header key is over 255 bytes")
        // 127 × "é" is 254 bytes, 128 × is 256.
        let fits: FieldTable = ["k": .table([String(repeating: "é", count: 127): 1])]
        let over: FieldTable = ["k": .table([String(repeating: "é", count: 128): 1])]
        #expect(fits.keysFit)
        #expect(!over.keysFit)
        #expect(OutboundMessage(exchange: "", routingKey: "q", body: Data(), properties: AMQPProperties(headers: ["k": "v"])).amqpCannotCarry == nil)
    }

    @Test func aUTF8PrefixEndsBetweenScalars() {
        #expect("abc".utf8Prefix(5) == "abc")
        #expect("abc".utf8Prefix(0) == "")
        #expect("aé".utf8Prefix(2) == "a")
        #expect("é".utf8Prefix(1) == "")
        #expect("👍🏽x".utf8Prefix(5) == "👍")  // 4 + 4 + 1 bytes; the skin tone is a scalar of its own
        let replaced = String(repeating: "\u{FFFD}", count: 255)  // 765 bytes
        #expect(replaced.utf8Prefix(255) == String(repeating: "\u{FFFD}", count: 85))
        #expect(replaced.utf8Prefix(256).utf8.count == 255)
    }

    /// A producer may nest tables and arrays as deep as a frame allows
    /// (~26,000 levels); past `maxDepth` they are read as `.void`, so
    /// reading them never follows the producer down the stack.
    @Test func tablesNestedPastTheLimitAreReadAsVoid() {
        let levels = 20_000
        // Built in C memory, without recursion: a table whose one entry holds
        // a table, 20,000 times, and an array of arrays as deep.
        let entries = UnsafeMutablePointer<amqp_table_entry_t>.allocate(capacity: levels)
        let items = UnsafeMutablePointer<amqp_field_value_t>.allocate(capacity: levels)
        defer {
            entries.deallocate()
            items.deallocate()
        }
        let key = Array("k".utf8)
        key.withUnsafeBufferPointer { k in
            let name = amqp_bytes_t(len: 1, bytes: UnsafeMutableRawPointer(mutating: k.baseAddress))
            for i in 0..<levels {
                var v = amqp_field_value_t()
                if i == levels - 1 {
                    v.kind = UInt8(truncatingIfNeeded: AMQP_FIELD_KIND_BOOLEAN.rawValue)
                    v.value.boolean = 1
                } else {
                    v.kind = UInt8(truncatingIfNeeded: AMQP_FIELD_KIND_TABLE.rawValue)
                    v.value.table = amqp_table_t(num_entries: 1, entries: entries + i + 1)
                }
                (entries + i).initialize(to: amqp_table_entry_t(key: name, value: v))
                var a = amqp_field_value_t()
                a.kind = UInt8(truncatingIfNeeded: AMQP_FIELD_KIND_ARRAY.rawValue)
                a.value.array = i == levels - 1 ? amqp_array_t(num_entries: 0, entries: nil) : amqp_array_t(num_entries: 1, entries: items + i + 1)
                (items + i).initialize(to: a)
            }
            let table = FieldTable(amqp_table_t(num_entries: 1, entries: entries))
            // The top table and 32 below it; the 33rd is void.
            #expect(Self.walk(.table(table)).levels == FieldTable.maxDepth + 1)
            #expect(Self.walk(.table(table)).leaf == .void)
            let array = FieldValue(items[0])
            #expect(Self.walk(array).levels == FieldTable.maxDepth)
            #expect(Self.walk(array).leaf == .void)
            // As deep as the limit is read whole, down to its leaf.
            var c = amqp_table_t(num_entries: 1, entries: entries + levels - FieldTable.maxDepth)
            let shallow = FieldTable(c)
            #expect(Self.walk(.table(shallow)).levels == FieldTable.maxDepth)
            #expect(Self.walk(.table(shallow)).leaf == .bool(true))
            var buffer = [UInt8](repeating: 0, count: 4096)
            var offset = 0
            let status = buffer.withUnsafeMutableBytes { raw in
                amqp_encode_table(amqp_bytes_t(len: raw.count, bytes: raw.baseAddress), &c, &offset)
            }
            #expect(status == 0)
            #expect(shallow.encodedSize == offset)
        }
    }

    /// Levels of single-entry tables and arrays down to the leaf.
    static func walk(_ v: FieldValue) -> (levels: Int, leaf: FieldValue) {
        var levels = 0
        var v = v
        while true {
            switch v {
            case .table(let t) where t.count == 1: v = t.entries[0].value
            case .array(let a) where a.count == 1: v = a[0]
            default: return (levels, v)
            }
            levels += 1
        }
    }
}

/// A small deterministic generator for the tests' tables.
struct SplitMix {
    var state: UInt64
    init(_ seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE5_E9B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
