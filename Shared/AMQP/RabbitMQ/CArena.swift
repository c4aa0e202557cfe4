import CRabbitMQ
import Foundation

/// Owns the C memory built for one rabbitmq-c call (strings, tables) and frees
/// it all at once. Used only on a connection's owner thread, inside one call.
final class CArena {
    private var blocks: [UnsafeMutableRawPointer] = []

    deinit {
        for b in blocks { free(b) }
    }

    func allocate(_ size: Int) -> UnsafeMutableRawPointer {
        let p = malloc(max(size, 1))!
        blocks.append(p)
        return p
    }

    func bytes(_ text: String) -> amqp_bytes_t {
        var copy = text
        return copy.withUTF8 { bytes(UnsafeRawBufferPointer($0)) }
    }

    func bytes(_ data: Data) -> amqp_bytes_t {
        data.withUnsafeBytes { bytes($0) }
    }

    func bytes(_ raw: UnsafeRawBufferPointer) -> amqp_bytes_t {
        let p = allocate(raw.count)
        if let base = raw.baseAddress, raw.count > 0 { p.copyMemory(from: base, byteCount: raw.count) }
        return amqp_bytes_t(len: raw.count, bytes: p)
    }

    func cString(_ text: String) -> UnsafePointer<CChar> {
        let utf8 = Array(text.utf8CString)
        let p = allocate(utf8.count).bindMemory(to: CChar.self, capacity: utf8.count)
        p.initialize(from: utf8, count: utf8.count)
        return UnsafePointer(p)
    }
}

extension amqp_bytes_t {
    /// Copies the bytes out of C memory.
    var data: Data {
        guard len > 0, let bytes else { return Data() }
        return Data(bytes: bytes, count: len)
    }

    /// Copies the bytes out of C memory as UTF-8 (invalid sequences repaired).
    var string: String {
        guard len > 0, let bytes else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: bytes, count: len), as: UTF8.self)
    }
}
