import CRabbitMQ
import Foundation

/// Owns the C memory built for rabbitmq-c calls (strings, tables, bodies)
/// and frees it all at once: at `reset()` or when the arena goes. Used only
/// on a connection's owner thread.
///
/// Small pieces are cut from chunks (one malloc per 8 KiB instead of one a
/// string: a window's properties were 7% of the router's CPU samples as
/// single mallocs); `reset()` keeps the first chunk, so a connection's
/// publish arena allocates nothing for a window that fits in it.
final class CArena {
    private static let chunkSize = 8192
    /// Pieces larger than this get a block of their own.
    private static let largePiece = 2048
    private var chunks: [UnsafeMutableRawPointer] = []
    private var large: [UnsafeMutableRawPointer] = []
    /// Where the next piece goes in the last chunk.
    private var offset = chunkSize

    deinit {
        for b in chunks { free(b) }
        for b in large { free(b) }
    }

    /// Frees every piece; the first chunk stays for the next use.
    func reset() {
        for b in large { free(b) }
        large.removeAll(keepingCapacity: true)
        if chunks.count > 1 {
            for b in chunks[1...] { free(b) }
            chunks.removeSubrange(1...)
        }
        offset = chunks.isEmpty ? Self.chunkSize : 0
    }

    /// `size` bytes aligned to 16, valid until `reset()` or the arena's end.
    func allocate(_ size: Int) -> UnsafeMutableRawPointer {
        let size = max(size, 1)
        if size > Self.largePiece {
            let p = malloc(size)!
            large.append(p)
            return p
        }
        let rounded = (size + 15) & ~15
        if offset + rounded > Self.chunkSize {
            chunks.append(malloc(Self.chunkSize)!)
            offset = 0
        }
        let p = chunks[chunks.count - 1] + offset
        offset += rounded
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
