import Foundation

/// A value of an AMQP field table (headers, queue and consume arguments).
public enum FieldValue: Sendable, Hashable {
    case string(String)
    case bytes(Data)
    case bool(Bool)
    case int8(Int8)
    case int16(Int16)
    case int32(Int32)
    case int64(Int64)
    case uint8(UInt8)
    case uint16(UInt16)
    case uint32(UInt32)
    case float(Float)
    case double(Double)
    case decimal(decimals: UInt8, value: UInt32)
    case timestamp(UInt64)
    case table(FieldTable)
    case array([FieldValue])
    case void

    /// The value as an integer, whatever width the broker used.
    public var intValue: Int64? {
        switch self {
        case .int8(let v): Int64(v)
        case .int16(let v): Int64(v)
        case .int32(let v): Int64(v)
        case .int64(let v): v
        case .uint8(let v): Int64(v)
        case .uint16(let v): Int64(v)
        case .uint32(let v): Int64(v)
        case .timestamp(let v): Int64(exactly: v)
        default: nil
        }
    }

    /// The value as text: a long string, or bytes that are valid UTF-8.
    public var stringValue: String? {
        switch self {
        case .string(let s): s
        case .bytes(let d): String(data: d, encoding: .utf8)
        default: nil
        }
    }

    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    public var tableValue: FieldTable? {
        if case .table(let t) = self { return t }
        return nil
    }
}

/// An ordered AMQP field table. Order is kept as given, so what is encoded is
/// what was written; look-ups take the last entry of a name.
public struct FieldTable: Sendable, Hashable, ExpressibleByDictionaryLiteral, Sequence {
    public private(set) var entries: [(key: String, value: FieldValue)]

    public init() { entries = [] }

    public init(_ entries: [(String, FieldValue)]) {
        self.entries = entries.map { (key: $0.0, value: $0.1) }
    }

    public init(dictionaryLiteral elements: (String, FieldValue)...) {
        self.init(elements)
    }

    public subscript(key: String) -> FieldValue? {
        get { entries.last(where: { $0.key == key })?.value }
        set {
            entries.removeAll { $0.key == key }
            if let newValue { entries.append((key: key, value: newValue)) }
        }
    }

    public var isEmpty: Bool { entries.isEmpty }
    public var count: Int { entries.count }

    public func makeIterator() -> IndexingIterator<[(key: String, value: FieldValue)]> {
        entries.makeIterator()
    }

    public static func == (a: FieldTable, b: FieldTable) -> Bool {
        a.entries.count == b.entries.count
            && zip(a.entries, b.entries).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }

    public func hash(into hasher: inout Hasher) {
        for e in entries {
            hasher.combine(e.key)
            hasher.combine(e.value)
        }
    }
}

extension FieldTable {
    /// How deep tables and arrays are read from the wire; a value nested
    /// deeper is read as `.void`. The frame allows ~26,000 levels, and
    /// following them all would overflow the reading thread's stack.
    public static let maxDepth = 32

    /// The most bytes an AMQP short string holds: names, keys, most properties.
    public static let maxShortStringBytes = 255

    /// The bytes this table takes on the wire (AMQP 0-9-1 field table): its
    /// 4-byte length, then each entry's short-string key, type octet and value.
    public var encodedSize: Int {
        entries.reduce(4) { $0 &+ 1 &+ $1.key.utf8.count &+ $1.value.encodedSize }
    }

    /// True when every key, in nested tables too, is a short string AMQP
    /// can carry. A key read from the wire can be longer: each byte that is
    /// not UTF-8 reads as U+FFFD, three bytes.
    public var keysFit: Bool {
        entries.allSatisfy { Self.keysFit($0.key, $0.value) }
    }

    /// True when `key` and every key inside `value` is a short string AMQP can carry.
    public static func keysFit(_ key: String, _ value: FieldValue) -> Bool {
        key.utf8.count <= maxShortStringBytes && value.keysFit
    }
}

extension FieldValue {
    /// The bytes this value takes on the wire, its type octet included.
    public var encodedSize: Int {
        switch self {
        case .string(let s): 5 &+ s.utf8.count
        case .bytes(let d): 5 &+ d.count
        case .bool, .int8, .uint8: 2
        case .int16, .uint16: 3
        case .int32, .uint32, .float: 5
        case .int64, .double, .timestamp: 9
        case .decimal: 6
        case .table(let t): 1 &+ t.encodedSize
        case .array(let items): items.reduce(5) { $0 &+ $1.encodedSize }
        case .void: 1
        }
    }

    /// True when no table inside this value has a key over 255 bytes.
    public var keysFit: Bool {
        switch self {
        case .table(let t): t.keysFit
        case .array(let items): items.allSatisfy(\.keysFit)
        default: true
        }
    }
}

extension FieldValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral {
    public init(stringLiteral value: String) { self = .string(value) }
    /// Integer literals encode as signed 64-bit, which RabbitMQ accepts for every numeric argument.
    public init(integerLiteral value: Int64) { self = .int64(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
}
