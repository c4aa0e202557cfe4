import Foundation
import Testing

/// The harness itself: a port something else listens on is not handed to a
/// service (a leftover cluster node's distribution port once made three
/// gateway starts in a row fail).
@Suite("Test harness ports")
struct HarnessPortTests {
    @Test func aPortSomeoneListensOnIsNotFree() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = INADDR_ANY
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { a in
                bind(fd, a, length) == 0 && listen(fd, 1) == 0 && getsockname(fd, a, &length) == 0
            }
        }
        guard bound else { close(fd); Issue.record("could not listen"); return }
        let port = Int(UInt16(bigEndian: address.sin_port))
        #expect(!TestPorts.isFree(port))
        close(fd)
        #expect(TestPorts.isFree(port))
    }
}
