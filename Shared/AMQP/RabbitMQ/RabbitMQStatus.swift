import CRabbitMQ

/// What a rabbitmq-c call reported, before the connection loop acts on it.
enum RabbitMQOutcome {
    case ok
    /// The broker closed a channel; the loop must answer with channel.close-ok.
    case channelClosed(code: UInt16, text: String)
    /// The broker closed the connection; the loop must answer with connection.close-ok.
    case connectionClosed(code: UInt16, text: String)
    case library(status: Int32)

    init(_ reply: amqp_rpc_reply_t) {
        switch reply.reply_type {
        case AMQP_RESPONSE_NORMAL:
            self = .ok
        case AMQP_RESPONSE_SERVER_EXCEPTION:
            if reply.reply.id == FD_CHANNEL_CLOSE, let d = reply.reply.decoded {
                let m = d.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
                self = .channelClosed(code: m.reply_code, text: m.reply_text.string)
            } else if reply.reply.id == FD_CONNECTION_CLOSE, let d = reply.reply.decoded {
                let m = d.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
                self = .connectionClosed(code: m.reply_code, text: m.reply_text.string)
            } else {
                self = .library(status: AMQP_STATUS_UNEXPECTED_STATE.rawValue)
            }
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            self = .library(status: reply.library_error)
        default:
            self = .library(status: AMQP_STATUS_UNEXPECTED_STATE.rawValue)
        }
    }
}

extension AMQPError {
    /// Maps a rabbitmq-c status to an error; `context` says what was being done.
    static func library(_ status: Int32, _ context: String) -> AMQPError {
        let text = String(cString: amqp_error_string2(status))
        let code: Code
        switch status {
        case AMQP_STATUS_TIMEOUT.rawValue, AMQP_STATUS_HEARTBEAT_TIMEOUT.rawValue:
            code = .timeout
        case AMQP_STATUS_SSL_ERROR.rawValue, AMQP_STATUS_SSL_CONNECTION_FAILED.rawValue,
            AMQP_STATUS_SSL_PEER_VERIFY_FAILED.rawValue, AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED.rawValue,
            AMQP_STATUS_SSL_SET_ENGINE_FAILED.rawValue:
            code = .tlsFailed
        case AMQP_STATUS_CONNECTION_CLOSED.rawValue, AMQP_STATUS_SOCKET_CLOSED.rawValue,
            AMQP_STATUS_SOCKET_ERROR.rawValue, AMQP_STATUS_TCP_ERROR.rawValue:
            code = .connectionClosed
        case AMQP_STATUS_HOSTNAME_RESOLUTION_FAILED.rawValue:
            code = .connectionFailed
        default:
            code = .library
        }
        return AMQPError(code, "\(context): \(text)", libraryStatus: status)
    }

    /// "NOT_FOUND - no queue 'x'": RabbitMQ's reply texts usually start with
    /// the code's name already; others get it added.
    static func describeReply(_ code: UInt16, _ text: String) -> String {
        let name = replyName(code)
        return text.hasPrefix(name) ? text : "\(name) - \(text)"
    }

    /// Names the reply codes a reader meets most.
    static func replyName(_ code: UInt16) -> String {
        switch code {
        case 200: "REPLY_SUCCESS"
        case 311: "CONTENT_TOO_LARGE"
        case 312: "NO_ROUTE"
        case 320: "CONNECTION_FORCED"
        case 402: "INVALID_PATH"
        case 403: "ACCESS_REFUSED"
        case 404: "NOT_FOUND"
        case 405: "RESOURCE_LOCKED"
        case 406: "PRECONDITION_FAILED"
        case 501: "FRAME_ERROR"
        case 502: "SYNTAX_ERROR"
        case 503: "COMMAND_INVALID"
        case 504: "CHANNEL_ERROR"
        case 505: "UNEXPECTED_FRAME"
        case 506: "RESOURCE_ERROR"
        case 530: "NOT_ALLOWED"
        case 540: "NOT_IMPLEMENTED"
        case 541: "INTERNAL_ERROR"
        default: "reply \(code)"
        }
    }
}
