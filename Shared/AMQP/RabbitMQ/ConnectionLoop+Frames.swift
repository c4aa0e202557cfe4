import CRabbitMQ
import Foundation

extension ConnectionLoop {
    /// Reads and dispatches every frame that is already available, without
    /// blocking; returns how many it handled.
    @discardableResult
    func pumpFrames() -> Int {
        var zero = timeval(tv_sec: 0, tv_usec: 0)
        var handled = 0
        while failure == nil {
            var frame = amqp_frame_t()
            let rc = amqp_simple_wait_frame_noblock(conn, &frame, &zero)
            if rc == AMQP_STATUS_TIMEOUT.rawValue { break }
            if rc != AMQP_STATUS_OK.rawValue {
                fail(.library(rc, "reading from the broker"))
                break
            }
            handle(frame)
            handled += 1
            // Nothing left in rabbitmq-c's buffer: back to poll, which tells
            // whether the socket has more (a read would find out with a failed
            // recv and a poll of its own).
            if amqp_frames_enqueued(conn) == 0, amqp_data_in_buffer(conn) == 0 { break }
            // Let queued commands (acks, publishes) in between long runs of deliveries.
            if handled % 64 == 0, core.hasCommands { break }
        }
        amqp_maybe_release_buffers(conn)
        return handled
    }

    private func handle(_ frame: amqp_frame_t) {
        guard frame.frame_type == UInt8(AMQP_FRAME_METHOD) else { return }  // heartbeats; stray content
        let method = frame.payload.method
        let id = method.id
        let channelID = frame.channel
        switch id {
        case FD_BASIC_DELIVER:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_deliver_t.self).pointee
            handleDeliver(m, channelID: channelID)
        case FD_BASIC_ACK:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_ack_t.self).pointee
            channels[channelID]?.confirm(tag: m.delivery_tag, multiple: m.multiple != 0, ack: true)
        case FD_BASIC_NACK:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_nack_t.self).pointee
            channels[channelID]?.confirm(tag: m.delivery_tag, multiple: m.multiple != 0, ack: false)
        case FD_BASIC_RETURN:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_return_t.self).pointee
            handleReturn(m, channelID: channelID)
        case FD_BASIC_CANCEL:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_cancel_t.self).pointee
            let tag = m.consumer_tag.string
            if let sink = channels[channelID]?.consumers.removeValue(forKey: tag) {
                sink.finish(AMQPError(.consumerCancelled, "the broker cancelled consumer \(tag)"))
            }
        case FD_CHANNEL_CLOSE:
            let m = method.decoded.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
            if let ch = channels[channelID] {
                brokerClosedChannel(ch, AMQPError(
                    .channelClosed,
                    "the broker closed channel \(channelID): \(AMQPError.describeReply(m.reply_code, m.reply_text.string))",
                    replyCode: m.reply_code))
            }
        case FD_CONNECTION_CLOSE:
            let m = method.decoded.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
            _ = brokerClosedConnection(code: m.reply_code, text: m.reply_text.string, context: core.name)
        case FD_CONNECTION_BLOCKED:
            let m = method.decoded.assumingMemoryBound(to: amqp_connection_blocked_t.self).pointee
            core.blockedReason = m.reason.len > 0 ? m.reason.string : "a resource alarm"
        case FD_CONNECTION_UNBLOCKED:
            core.blockedReason = nil
        default:
            break
        }
    }

    private func readContent(channelID: UInt16) -> (AMQPProperties, Data)? {
        var message = amqp_message_t()
        let reply = amqp_read_message(conn, channelID, &message, 0)
        defer { amqp_destroy_message(&message) }
        guard case .ok = RabbitMQOutcome(reply) else {
            if case .library(let status) = RabbitMQOutcome(reply) {
                fail(.library(status, "reading a message body"))
            } else {
                fail(AMQPError(.library, "unexpected frame while reading a message body"))
            }
            return nil
        }
        return (AMQPProperties(message.properties), message.body.data)
    }

    private func handleDeliver(_ m: amqp_basic_deliver_t, channelID: UInt16) {
        let consumerTag = m.consumer_tag.string
        let exchange = m.exchange.string
        let routingKey = m.routing_key.string
        guard let (properties, body) = readContent(channelID: channelID) else { return }
        guard let ch = channels[channelID], ch.closedError == nil else { return }
        guard let sink = ch.consumers[consumerTag] else {
            // A delivery that raced with a cancel: hand it back to the queue.
            flushOutput()
            if failure == nil { _ = amqp_basic_reject(conn, channelID, m.delivery_tag, 1) }
            return
        }
        let delivery = AMQPDelivery(
            body: body, properties: properties, exchange: exchange, routingKey: routingKey,
            redelivered: m.redelivered != 0, deliveryTag: m.delivery_tag, consumerTag: consumerTag,
            acknowledger: DeliveryAcknowledger(core: core, channel: channelID, epoch: ch.epoch))
        sink.deliver(delivery)
    }

    private func handleReturn(_ m: amqp_basic_return_t, channelID: UInt16) {
        let replyText = m.reply_text.string
        let exchange = m.exchange.string
        let routingKey = m.routing_key.string
        guard let (properties, body) = readContent(channelID: channelID) else { return }
        channels[channelID]?.markReturned(ReturnedMessage(
            replyCode: m.reply_code, replyText: replyText, exchange: exchange, routingKey: routingKey,
            body: body, properties: properties))
    }
}
