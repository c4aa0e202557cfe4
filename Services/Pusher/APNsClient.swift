import CCrypto
import CCurl
import Foundation
import ServiceKit
import Synchronization

/// HTTP/2 POSTs to APNs through libcurl (`Shared/CCurl`): one thread of its
/// own, one kept-alive connection per host with multiplexed streams. The
/// completion runs on that thread; it must not block.
final class APNsClient: Sendable {
    /// `retryAfter`: the seconds of the answer's `Retry-After`, when it had one.
    typealias Completion = @Sendable (_ status: Int, _ body: Data?, _ retryAfter: TimeInterval?, _ error: String?) -> Void

    private final class Pending: Sendable {
        let waiting = Mutex<[UInt64: Completion]>([:])
        let next = Atomic<UInt64>(0)
    }

    private let pending = Pending()
    private let box: Unmanaged<Pending>
    private let client: Mutex<Int>

    init(caFile: String?) throws {
        let box = Unmanaged.passRetained(pending)
        var error = [CChar](repeating: 0, count: 256)
        let started = fd_h2_start(
            caFile,
            { context, id, status, body, length, retryAfter, error in
                guard let context else { return }
                let pending = Unmanaged<Pending>.fromOpaque(context).takeUnretainedValue()
                guard let completion = pending.waiting.withLock({ $0.removeValue(forKey: id) }) else { return }
                let data = body.map { Data(bytes: $0, count: length) }
                completion(Int(status), data, retryAfter > 0 ? TimeInterval(retryAfter) : nil, error.map { String(cString: $0) })
            },
            box.toOpaque(), &error, error.count)
        guard let started else {
            box.release()
            throw PusherError(String(cBuffer: error))
        }
        self.box = box
        client = Mutex(Int(bitPattern: UnsafeRawPointer(started)))
    }

    func post(url: String, headers: [String], body: Data, timeoutMs: Int = 15_000, completion: @escaping Completion) {
        let id = pending.next.wrappingAdd(1, ordering: .relaxed).newValue
        pending.waiting.withLock { $0[id] = completion }
        let queued: Bool = client.withLock { c in
            guard let pointer = OpaquePointer(bitPattern: c) else { return false }
            var cHeaders = headers.map { strdup($0) }
            defer { cHeaders.forEach { free($0) } }
            return cHeaders.withUnsafeMutableBufferPointer { lines in
                lines.withMemoryRebound(to: UnsafePointer<CChar>?.self) { constLines in
                    body.withUnsafeBytes { b in
                        fd_h2_post(pointer, id, url, constLines.baseAddress, constLines.count, b.baseAddress, b.count, timeoutMs) == 1
                    }
                }
            }
        }
        if !queued, let completion = pending.waiting.withLock({ $0.removeValue(forKey: id) }) {
            completion(0, nil, nil, "the APNs client is stopped")
        }
    }

    /// Ends the client: what is in flight completes with an error first. The
    /// join happens outside the lock (a completion may post again; it fails),
    /// and on a thread of its own: it waits for libcurl's thread, which must
    /// not hold up a thread of the task pool.
    func stop() async {
        guard let pointer = take() else { return }
        let address = Int(bitPattern: UnsafeRawPointer(pointer))
        await withCheckedContinuation { (stopped: CheckedContinuation<Void, Never>) in
            let thread = Thread {
                fd_h2_stop(OpaquePointer(bitPattern: address))
                stopped.resume()
            }
            thread.name = "apns:stop"
            thread.start()
        }
    }

    /// The client's pointer, once: nil after a stop.
    private func take() -> OpaquePointer? {
        client.withLock { c -> OpaquePointer? in
            defer { c = 0 }
            return OpaquePointer(bitPattern: c)
        }
    }

    deinit {
        if let pointer = take() { fd_h2_stop(pointer) }
        box.release()
    }
}

/// The APNs signing key (.p8), held by libcrypto; its bytes are never logged.
final class SigningKey: Sendable {
    private let key: Int

    init(path: String) throws {
        var error = [CChar](repeating: 0, count: 256)
        guard let loaded = fd_es256_key_load(path, &error, error.count) else {
            throw PusherError(String(cBuffer: error))
        }
        key = Int(bitPattern: UnsafeRawPointer(loaded))
    }

    /// The raw 64-byte ES256 signature of `message`.
    func sign(_ message: Data) -> Data? {
        guard let pointer = OpaquePointer(bitPattern: key) else { return nil }
        var signature = [UInt8](repeating: 0, count: 64)
        let ok = message.withUnsafeBytes { fd_es256_sign(pointer, $0.baseAddress, $0.count, &signature) == 1 }
        return ok ? Data(signature) : nil
    }

    deinit { fd_es256_key_free(OpaquePointer(bitPattern: key)) }
}

struct PusherError: Error, CustomStringConvertible, Sendable {
    var description: String
    init(_ d: String) { description = d }
}
