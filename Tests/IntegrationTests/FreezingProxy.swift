import Foundation
import Glibc
import Synchronization

/// A TCP proxy to the test broker for one client that can be frozen: it then
/// stops passing bytes either way but keeps both sockets open, as a broker
/// behind a dead network path looks to its client (no FIN, no RST).
final class FreezingProxy: Sendable {
    let port: UInt16
    private let listener: Int32
    private let frozen = Atomic<Bool>(false)
    /// A client connected through it.
    let used = Atomic<Bool>(false)
    private let stopped = Atomic<Bool>(false)

    init(upstreamPort: UInt16) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        listener = fd
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { p -> Bool in
                bind(fd, p, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, p, &length) == 0
            }
        }
        guard bound else { throw POSIXError(.EADDRNOTAVAIL) }
        port = UInt16(bigEndian: address.sin_port)
        Thread.detachNewThread { [self] in
            let client = accept(fd, nil, nil)
            guard client >= 0 else { return }
            used.store(true, ordering: .relaxed)
            var upstream = sockaddr_in()
            upstream.sin_family = sa_family_t(AF_INET)
            upstream.sin_addr.s_addr = inet_addr("127.0.0.1")
            upstream.sin_port = upstreamPort.bigEndian
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            let connected = withUnsafePointer(to: &upstream) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
            }
            if connected { relay(client, server) }
            close(client)
            close(server)
        }
    }

    /// From now on nothing passes; the sockets stay open.
    func freeze() { frozen.store(true, ordering: .relaxed) }

    func stop() {
        stopped.store(true, ordering: .relaxed)
        close(listener)
    }

    private func relay(_ a: Int32, _ b: Int32) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while !stopped.load(ordering: .relaxed) {
            if frozen.load(ordering: .relaxed) {
                usleep(50_000)
                continue
            }
            var fds = [pollfd(fd: a, events: Int16(POLLIN), revents: 0), pollfd(fd: b, events: Int16(POLLIN), revents: 0)]
            guard poll(&fds, 2, 50) >= 0 else { return }
            for (from, to) in [(0, b), (1, a)] where fds[from].revents != 0 {
                let n = read(fds[from].fd, &buffer, buffer.count)
                guard n > 0 else { return }
                var sent = 0
                while sent < n {
                    let w = buffer.withUnsafeBytes { write(to, $0.baseAddress! + sent, n - sent) }
                    guard w > 0 else { return }
                    sent += w
                }
            }
        }
    }
}
