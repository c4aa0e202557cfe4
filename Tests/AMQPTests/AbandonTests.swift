@testable import AMQP
import Foundation
import Glibc
import Testing

/// A stopping service abandons a connection the broker blocks
/// (`ConnectionCore.abandonWhenBlocked`): its socket is shut down, which
/// ends an RPC waiting in rabbitmq-c, and the client does not connect again.
/// Here the socket is one end of a socketpair; the other end sees the shutdown.
@Suite("Abandoning a blocked connection for a stop", .serialized)
struct AbandonTests {
    /// A core whose socket is one end of a fresh socketpair; returns the other end.
    private func core() -> (ConnectionCore, peer: Int32, mine: Int32) {
        var fds: [Int32] = [-1, -1]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        let core = ConnectionCore(name: "test")
        core.noteSocket(fds[0])
        return (core, fds[1], fds[0])
    }

    /// Whether the peer sees the other end shut down (end of stream) within `ms`.
    private func peerSeesEnd(_ peer: Int32, withinMs ms: Int32) -> Bool {
        var p = pollfd(fd: peer, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, ms) == 1 else { return false }
        var byte: UInt8 = 0
        return recv(peer, &byte, 1, Int32(MSG_DONTWAIT)) == 0
    }

    private func close(_ fds: Int32...) { for fd in fds { _ = Glibc.close(fd) } }

    @Test func aBlockedConnectionIsDroppedAtOnce() {
        let (core, peer, mine) = core()
        defer { core.forgetSocket(); close(peer, mine) }
        core.blockedReason = "low on memory"
        core.abandonWhenBlocked(cutAfterMs: 60_000)
        #expect(core.abandonsWhenBlocked)
        #expect(peerSeesEnd(peer, withinMs: 1000))
        #expect(core.wasAbandoned)
    }

    @Test func anIdleUnblockedConnectionIsLeftAlone() {
        let (core, peer, mine) = core()
        defer { core.forgetSocket(); close(peer, mine) }
        #expect(core.prepareToWait())  // the loop waits in poll
        core.abandonWhenBlocked(cutAfterMs: 50)
        #expect(!peerSeesEnd(peer, withinMs: 400))
        #expect(!core.wasAbandoned)
        #expect(core.abandonsWhenBlocked)
    }

    /// A turn still busy when the stop began (an RPC waiting on a block
    /// rabbitmq-c holds unread) is cut short once the wait has passed.
    @Test func aTurnStillBusyAfterTheWaitIsCutShort() {
        let (core, peer, mine) = core()
        defer { core.forgetSocket(); close(peer, mine) }
        core.abandonWhenBlocked(cutAfterMs: 50)
        #expect(!core.wasAbandoned)
        #expect(peerSeesEnd(peer, withinMs: 2000))
        #expect(core.wasAbandoned)
    }

    @Test func aTurnThatEndsInTimeIsLeftAlone() {
        let (core, peer, mine) = core()
        defer { core.forgetSocket(); close(peer, mine) }
        core.abandonWhenBlocked(cutAfterMs: 200)
        _ = core.prepareToWait()  // the turn ended (a command is queued: it turns again at once)
        #expect(!peerSeesEnd(peer, withinMs: 600))
        #expect(!core.wasAbandoned)
    }

    /// The core shuts down its own duplicate of the socket, forgotten (and
    /// closed) before rabbitmq-c's handle is destroyed: a cut that comes
    /// after it touches no descriptor, whatever now has the number.
    @Test func aCutAfterTheSocketWasForgottenTouchesNothing() {
        let (core, peer, mine) = core()
        defer { close(peer, mine) }
        core.abandonWhenBlocked(cutAfterMs: 50)
        core.forgetSocket()
        #expect(!peerSeesEnd(peer, withinMs: 400))
        #expect(!core.wasAbandoned)
        // The connection's own descriptor still works.
        var byte: UInt8 = 7
        #expect(send(mine, &byte, 1, 0) == 1)
    }
}
