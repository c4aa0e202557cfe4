import Foundation
import FrontDeskModel
import ServiceKit
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The gateway's bearer tokens, read again whenever their file changes (a
/// token added or revoked, a Kubernetes Secret updated in place): checked
/// every `interval` on a thread of its own (a `stat`, and a read only when
/// it changed), never on the task pool. A file that no longer reads as
/// tokens is logged and the tokens in use are kept. (A file bind-mounted
/// alone into a container keeps the inode it had: edit it in place there,
/// or mount its directory.)
final class TokenSource: Sendable {
    /// What `stat` says of the file: a change of any is a new file to read
    /// (the change time too: a `chmod` that makes it readable again).
    struct Stamp: Equatable, Sendable {
        var device: UInt64, inode: UInt64, size: Int64, seconds: Int, nanoseconds: Int, changeSeconds: Int, changeNanoseconds: Int
    }

    static let interval = Duration.seconds(2)

    private let current: Mutex<GatewayTokens>
    private let path: String?
    private let logger: Logger
    private let reads: Counter
    private let stamp = Mutex<Stamp?>(nil)
    private let stopped = Atomic<Bool>(false)

    /// `initial` as read from `path` when it had `stamp` (taken before the
    /// read: a change made meanwhile is read again).
    init(initial: GatewayTokens, path: String?, stamp: Stamp?, logger: Logger, reads: Counter) {
        current = Mutex(initial)
        self.path = path
        self.logger = logger
        self.reads = reads
        self.stamp.withLock { $0 = stamp }
    }

    var tokens: GatewayTokens { current.withLock { $0 } }

    /// Starts watching the file (nothing without one).
    func start() {
        guard path != nil else { return }
        let thread = Thread { [self] in
            while !stopped.load(ordering: .acquiring) {
                Thread.sleep(forTimeInterval: Self.interval / .seconds(1))
                check()
            }
        }
        thread.name = "gateway:tokens"
        thread.start()
    }

    func stop() { stopped.store(true, ordering: .releasing) }

    /// Reads the file again if it changed since it was last read.
    func check() {
        guard let path, !stopped.load(ordering: .acquiring) else { return }
        let now = Self.stamp(of: path)
        // A file changed within the last interval may still be being written (in place, within
        // one tick of the clock): its stamp is not kept, so it is read once more next time.
        // (One dated in the future, copied with its times from a clock ahead, counts as settled.)
        let settled = now.map { stamp in
            let age = Date().timeIntervalSince1970 - Double(stamp.seconds)
            return age > Self.interval / .seconds(1) || age < 0
        } ?? true
        guard stamp.withLock({ s in
            defer { s = settled ? now : nil }
            return s != now
        }) else { return }
        guard now != nil, let data = FileManager.default.contents(atPath: path) else {
            logger.warning("cannot read the tokens file; the tokens in use are kept", [("path", .string(path))])
            reads.increment("kept")
            return
        }
        do throws(GatewayConfigError) {
            let tokens = try GatewayTokens(json: data)
            current.withLock { $0 = tokens }
            logger.info("tokens read again", [("path", .string(path)), ("tokens", .int(tokens.users.count))])
            reads.increment("taken")
        } catch {
            logger.warning("the tokens file is not valid; the tokens in use are kept", [("path", .string(path)), ("error", .string(error.message))])
            reads.increment("kept")
        }
    }

    static func stamp(of path: String) -> Stamp? {
        var s = stat()
        guard stat(path, &s) == 0 else { return nil }
        return Stamp(
            device: UInt64(s.st_dev), inode: UInt64(s.st_ino), size: Int64(s.st_size),
            seconds: Int(s.st_mtim.tv_sec), nanoseconds: Int(s.st_mtim.tv_nsec),
            changeSeconds: Int(s.st_ctim.tv_sec), changeNanoseconds: Int(s.st_ctim.tv_nsec))
    }
}
