import CRabbitMQ
import Foundation

private func kind(_ k: amqp_field_value_kind_t) -> UInt8 { UInt8(truncatingIfNeeded: k.rawValue) }

extension CArena {
    /// Builds a C table that lives as long as the arena.
    func table(_ table: FieldTable?) -> amqp_table_t {
        guard let table, !table.isEmpty else { return amqp_table_t(num_entries: 0, entries: nil) }
        let entries = allocate(MemoryLayout<amqp_table_entry_t>.stride * table.count)
            .bindMemory(to: amqp_table_entry_t.self, capacity: table.count)
        for (i, entry) in table.entries.enumerated() {
            (entries + i).initialize(to: amqp_table_entry_t(key: bytes(entry.key), value: fieldValue(entry.value)))
        }
        return amqp_table_t(num_entries: Int32(table.count), entries: entries)
    }

    func fieldValue(_ value: FieldValue) -> amqp_field_value_t {
        var v = amqp_field_value_t()
        switch value {
        case .string(let s):
            v.kind = kind(AMQP_FIELD_KIND_UTF8)
            v.value.bytes = bytes(s)
        case .bytes(let d):
            v.kind = kind(AMQP_FIELD_KIND_BYTES)
            v.value.bytes = bytes(d)
        case .bool(let b):
            v.kind = kind(AMQP_FIELD_KIND_BOOLEAN)
            v.value.boolean = b ? 1 : 0
        case .int8(let n):
            v.kind = kind(AMQP_FIELD_KIND_I8)
            v.value.i8 = n
        case .int16(let n):
            v.kind = kind(AMQP_FIELD_KIND_I16)
            v.value.i16 = n
        case .int32(let n):
            v.kind = kind(AMQP_FIELD_KIND_I32)
            v.value.i32 = n
        case .int64(let n):
            v.kind = kind(AMQP_FIELD_KIND_I64)
            v.value.i64 = n
        case .uint8(let n):
            v.kind = kind(AMQP_FIELD_KIND_U8)
            v.value.u8 = n
        case .uint16(let n):
            v.kind = kind(AMQP_FIELD_KIND_U16)
            v.value.u16 = n
        case .uint32(let n):
            v.kind = kind(AMQP_FIELD_KIND_U32)
            v.value.u32 = n
        case .float(let f):
            v.kind = kind(AMQP_FIELD_KIND_F32)
            v.value.f32 = f
        case .double(let d):
            v.kind = kind(AMQP_FIELD_KIND_F64)
            v.value.f64 = d
        case .decimal(let decimals, let raw):
            v.kind = kind(AMQP_FIELD_KIND_DECIMAL)
            v.value.decimal = amqp_decimal_t(decimals: decimals, value: raw)
        case .timestamp(let t):
            v.kind = kind(AMQP_FIELD_KIND_TIMESTAMP)
            v.value.u64 = t
        case .table(let t):
            v.kind = kind(AMQP_FIELD_KIND_TABLE)
            v.value.table = table(t)
        case .array(let items):
            v.kind = kind(AMQP_FIELD_KIND_ARRAY)
            let p = allocate(MemoryLayout<amqp_field_value_t>.stride * items.count)
                .bindMemory(to: amqp_field_value_t.self, capacity: max(items.count, 1))
            for (i, item) in items.enumerated() { (p + i).initialize(to: fieldValue(item)) }
            v.value.array = amqp_array_t(num_entries: Int32(items.count), entries: items.isEmpty ? nil : p)
        case .void:
            v.kind = kind(AMQP_FIELD_KIND_VOID)
        }
        return v
    }
}

extension FieldTable {
    /// Copies a C table out of rabbitmq-c's memory; tables and arrays nested
    /// deeper than `maxDepth` are read as `.void` (a producer chooses the depth).
    init(_ c: amqp_table_t, depth: Int = 0) {
        self.init()
        guard c.num_entries > 0, let entries = c.entries else { return }
        var out: [(String, FieldValue)] = []
        out.reserveCapacity(Int(c.num_entries))
        for i in 0..<Int(c.num_entries) {
            out.append((entries[i].key.string, FieldValue(entries[i].value, depth: depth + 1)))
        }
        self.init(out)
    }
}

extension FieldValue {
    init(_ c: amqp_field_value_t, depth: Int = 1) {
        if depth > FieldTable.maxDepth, c.kind == kind(AMQP_FIELD_KIND_TABLE) || c.kind == kind(AMQP_FIELD_KIND_ARRAY) {
            self = .void
            return
        }
        switch c.kind {
        case kind(AMQP_FIELD_KIND_UTF8): self = .string(c.value.bytes.string)
        case kind(AMQP_FIELD_KIND_BYTES): self = .bytes(c.value.bytes.data)
        case kind(AMQP_FIELD_KIND_BOOLEAN): self = .bool(c.value.boolean != 0)
        case kind(AMQP_FIELD_KIND_I8): self = .int8(c.value.i8)
        case kind(AMQP_FIELD_KIND_I16): self = .int16(c.value.i16)
        case kind(AMQP_FIELD_KIND_I32): self = .int32(c.value.i32)
        case kind(AMQP_FIELD_KIND_I64): self = .int64(c.value.i64)
        case kind(AMQP_FIELD_KIND_U8): self = .uint8(c.value.u8)
        case kind(AMQP_FIELD_KIND_U16): self = .uint16(c.value.u16)
        case kind(AMQP_FIELD_KIND_U32): self = .uint32(c.value.u32)
        case kind(AMQP_FIELD_KIND_U64): self = .int64(Int64(bitPattern: c.value.u64))
        case kind(AMQP_FIELD_KIND_F32): self = .float(c.value.f32)
        case kind(AMQP_FIELD_KIND_F64): self = .double(c.value.f64)
        case kind(AMQP_FIELD_KIND_DECIMAL): self = .decimal(decimals: c.value.decimal.decimals, value: c.value.decimal.value)
        case kind(AMQP_FIELD_KIND_TIMESTAMP): self = .timestamp(c.value.u64)
        case kind(AMQP_FIELD_KIND_TABLE): self = .table(FieldTable(c.value.table, depth: depth))
        case kind(AMQP_FIELD_KIND_ARRAY):
            let a = c.value.array
            if a.num_entries > 0, let entries = a.entries {
                self = .array((0..<Int(a.num_entries)).map { FieldValue(entries[$0], depth: depth + 1) })
            } else {
                self = .array([])
            }
        default: self = .void
        }
    }
}
