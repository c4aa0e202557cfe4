/// The id rules of CONTRACT.md.
public enum Identifiers {
    /// A dispatch id: 1–128 of `[A-Za-z0-9._:-]`.
    public static func isValidDispatchID(_ id: String) -> Bool {
        let bytes = id.utf8
        guard (1...128).contains(bytes.count) else { return false }
        return bytes.allSatisfy { b in
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: ":"), UInt8(ascii: "-"):
                true
            default: false
            }
        }
    }

    /// A project or target id of the routing table: `[a-z0-9][a-z0-9-]{0,62}`.
    /// Such ids never contain `.`, `*` or `#`, so they are safe in routing keys.
    public static func isValidTableID(_ id: String) -> Bool {
        guard (1...63).contains(id.utf8.count) else { return false }
        let bytes = Array(id.utf8)
        func lowerAlnum(_ b: UInt8) -> Bool {
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(b) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b)
        }
        return lowerAlnum(bytes[0]) && bytes.dropFirst().allSatisfy { lowerAlnum($0) || $0 == UInt8(ascii: "-") }
    }
}
