@testable import AMQP
import CRabbitMQ
import Testing

@Suite("Error mapping")
struct ErrorMappingTests {
    @Test(arguments: [
        (AMQP_STATUS_TIMEOUT.rawValue, AMQPError.Code.timeout),
        (AMQP_STATUS_HEARTBEAT_TIMEOUT.rawValue, .timeout),
        (AMQP_STATUS_SSL_PEER_VERIFY_FAILED.rawValue, .tlsFailed),
        (AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED.rawValue, .tlsFailed),
        (AMQP_STATUS_CONNECTION_CLOSED.rawValue, .connectionClosed),
        (AMQP_STATUS_SOCKET_ERROR.rawValue, .connectionClosed),
        (AMQP_STATUS_HOSTNAME_RESOLUTION_FAILED.rawValue, .connectionFailed),
        (AMQP_STATUS_BAD_AMQP_DATA.rawValue, .library),
    ])
    func libraryStatusMapsToACode(_ status: Int32, _ code: AMQPError.Code) {
        let error = AMQPError.library(status, "doing something")
        #expect(error.code == code)
        #expect(error.libraryStatus == status)
        #expect(error.message.hasPrefix("doing something: "))
    }

    @Test func serverRepliesBecomeTypedOutcomes() {
        var close = amqp_channel_close_t()
        close.reply_code = 404
        let text = Array("NOT_FOUND - no queue 'q' in vhost '/'".utf8)
        text.withUnsafeBufferPointer { buffer in
            close.reply_text = amqp_bytes_t(len: buffer.count, bytes: UnsafeMutableRawPointer(mutating: buffer.baseAddress))
            withUnsafeMutablePointer(to: &close) { pointer in
                var reply = amqp_rpc_reply_t()
                reply.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION
                reply.reply.id = FD_CHANNEL_CLOSE
                reply.reply.decoded = UnsafeMutableRawPointer(pointer)
                guard case .channelClosed(let code, let message) = RabbitMQOutcome(reply) else {
                    Issue.record("not a channel close")
                    return
                }
                #expect(code == 404)
                #expect(message == "NOT_FOUND - no queue 'q' in vhost '/'")
            }
        }
        var library = amqp_rpc_reply_t()
        library.reply_type = AMQP_RESPONSE_LIBRARY_EXCEPTION
        library.library_error = AMQP_STATUS_SOCKET_ERROR.rawValue
        guard case .library(let status) = RabbitMQOutcome(library) else {
            Issue.record("not a library error")
            return
        }
        #expect(status == AMQP_STATUS_SOCKET_ERROR.rawValue)
    }

    @Test func replyDescriptionsNameTheCodeOnce() {
        #expect(AMQPError.describeReply(404, "NOT_FOUND - no exchange 'x'") == "NOT_FOUND - no exchange 'x'")
        #expect(AMQPError.describeReply(406, "inequivalent arg") == "PRECONDITION_FAILED - inequivalent arg")
    }

    @Test func retryability() {
        #expect(AMQPError(.connectionClosed, "").isRetryable)
        #expect(AMQPError(.channelClosed, "", replyCode: 320).isRetryable)
        #expect(!AMQPError(.channelClosed, "", replyCode: 404).isRetryable)
        #expect(!AMQPError(.authenticationFailed, "", replyCode: 403).isRetryable)
        #expect(!AMQPError(.returned, "", replyCode: 312).isRetryable)
    }
}

@Suite("Backoff")
struct BackoffTests {
    @Test(arguments: [(1, 1000), (2, 2000), (3, 4000), (6, 32000), (7, 60000), (60, 60000)])
    func ceilingDoublesUpToTheCap(_ attempt: Int, _ expected: Int) {
        #expect(Backoff(baseMs: 1000, maxMs: 60_000).ceilingMs(afterAttempt: attempt) == expected)
    }

    @Test func jitterOnlyShortensAndNeverBelowHalf() {
        let b = Backoff(baseMs: 1000, maxMs: 60_000)
        #expect(b.delayMs(afterAttempt: 3, unit: 0) == 2000)
        #expect(b.delayMs(afterAttempt: 3, unit: 0.999_999) == 3999)
        #expect(b.delayMs(afterAttempt: 3, unit: 0.5) == 3000)
        for _ in 0..<1000 {
            let d = b.delayMs(afterAttempt: 4)
            #expect((4000...8000).contains(d))
        }
        #expect(Backoff(baseMs: 1, maxMs: 1).delayMs(afterAttempt: 1, unit: 0) == 1)
        #expect(Backoff(baseMs: Int.max / 2, maxMs: 5000).ceilingMs(afterAttempt: 50) == 5000)
    }
}
