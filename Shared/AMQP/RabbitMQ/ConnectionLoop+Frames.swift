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
        switch frame.frame_type {
        case UInt8(AMQP_FRAME_METHOD): break
        case UInt8(AMQP_FRAME_HEADER), UInt8(AMQP_FRAME_BODY): return handleContent(frame)
        default: return  // heartbeats
        }
        let method = frame.payload.method
        let id = method.id
        let channelID = frame.channel
        switch id {
        case FD_BASIC_DELIVER:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_deliver_t.self).pointee
            begin(channelID, .deliver(
                consumerTag: m.consumer_tag.string, exchange: m.exchange.string, routingKey: m.routing_key.string,
                redelivered: m.redelivered != 0, deliveryTag: m.delivery_tag))
        case FD_BASIC_ACK:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_ack_t.self).pointee
            channels[channelID]?.confirm(tag: m.delivery_tag, multiple: m.multiple != 0, ack: true)
        case FD_BASIC_NACK:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_nack_t.self).pointee
            guard let ch = channels[channelID] else { break }
            let redirected = ch.confirm(tag: m.delivery_tag, multiple: m.multiple != 0, ack: false) { message, copy in
                self.publish(ch, [message], batch: copy)
            }
            if !redirected.isEmpty {
                core.noteRedirected(redirected.count, channelEpoch: ch.epoch)
                // Only a repeatable one: its queues drop a repeat. (A dead
                // letter would be taken again by every queue that took it.)
                for message in redirected where message.repeatable { scheduleReoffer(message, offered: 0, now: .now) }
            }
        case FD_BASIC_RETURN:
            let m = method.decoded.assumingMemoryBound(to: amqp_basic_return_t.self).pointee
            begin(channelID, .returned(
                replyCode: m.reply_code, replyText: m.reply_text.string, exchange: m.exchange.string, routingKey: m.routing_key.string))
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
            } else {
                sendChannelCloseOK(channelID)  // one we let go of without a close of our own
            }
        case FD_CONNECTION_CLOSE:
            let m = method.decoded.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
            _ = brokerClosedConnection(code: m.reply_code, text: m.reply_text.string, context: core.name)
        case FD_CONNECTION_BLOCKED:
            let m = method.decoded.assumingMemoryBound(to: amqp_connection_blocked_t.self).pointee
            core.blockedReason = m.reason.len > 0 ? m.reason.string : "a resource alarm"
            // Stopping: nothing more will be answered on this connection.
            _ = droppedWhileBlocked()
        case FD_CONNECTION_UNBLOCKED:
            core.blockedReason = nil
        default:
            break
        }
    }

    /// A deliver or a return: its header and body frames follow on the
    /// channel, one frame at a time, read by `pumpFrames` like any other
    /// (never a blocking read in the middle of a pump). Not `amqp_read_message`:
    /// it clones the properties, and its clone refuses a header table with an
    /// empty key (legal AMQP, which any producer may send) with
    /// `AMQP_STATUS_INVALID_PARAMETER`, leaving the body unread: the
    /// connection had to be dropped and the broker delivered the message
    /// again, forever. Properties and body are copied into Swift values
    /// straight from each decoded frame.
    private func begin(_ channelID: UInt16, _ method: ArrivingContent.Method) {
        // A channel that closed in the middle of a message leaves its part behind: replaced.
        arriving[channelID] = ArrivingContent(method: method)
    }

    private func handleContent(_ frame: amqp_frame_t) {
        let channelID = frame.channel
        guard var content = arriving[channelID] else { return }  // stray content of a closed channel
        if frame.frame_type == UInt8(AMQP_FRAME_HEADER) {
            guard content.properties == nil, let decoded = frame.payload.properties.decoded else {
                return fail(AMQPError(.library, "a second content header on channel \(channelID)"))
            }
            content.properties = AMQPProperties(decoded.assumingMemoryBound(to: amqp_basic_properties_t.self).pointee)
            content.size = frame.payload.properties.body_size
            // The announced size is the peer's word: no more than a frame's worth reserved ahead.
            content.body.reserveCapacity(Int(min(content.size, UInt64(AMQPURL.defaultFrameMax))))
        } else {
            guard content.properties != nil else {
                return fail(AMQPError(.library, "a message body before its header on channel \(channelID)"))
            }
            let fragment = frame.payload.body_fragment
            guard UInt64(content.body.count) + UInt64(fragment.len) <= content.size else {
                return fail(AMQPError(.library, "a message body longer than its header announced on channel \(channelID)"))
            }
            if fragment.len > 0, let bytes = fragment.bytes {
                content.body.append(bytes.assumingMemoryBound(to: UInt8.self), count: fragment.len)
            }
        }
        guard let properties = content.properties, UInt64(content.body.count) == content.size else {
            arriving[channelID] = content
            return
        }
        arriving[channelID] = nil
        switch content.method {
        case .deliver(let consumerTag, let exchange, let routingKey, let redelivered, let deliveryTag):
            deliver(channelID, consumerTag: consumerTag, exchange: exchange, routingKey: routingKey,
                    redelivered: redelivered, deliveryTag: deliveryTag, properties: properties, body: content.body)
        case .returned(let replyCode, let replyText, let exchange, let routingKey):
            channels[channelID]?.markReturned(ReturnedMessage(
                replyCode: replyCode, replyText: replyText, exchange: exchange, routingKey: routingKey,
                body: content.body, properties: properties))
        }
    }

    private func deliver(
        _ channelID: UInt16, consumerTag: String, exchange: String, routingKey: String, redelivered: Bool,
        deliveryTag: UInt64, properties: AMQPProperties, body: Data
    ) {
        guard let ch = channels[channelID], ch.closedError == nil else { return }
        guard let sink = ch.consumers[consumerTag] else {
            // A delivery that raced with a cancel: handed back to its queue
            // (a stream's or a no-ack one is left alone, see `neverRejected`).
            guard !ch.neverRejected.contains(consumerTag) else { return }
            flushOutput()
            if failure == nil { _ = amqp_basic_reject(conn, channelID, deliveryTag, 1) }
            return
        }
        let delivery = AMQPDelivery(
            body: body, properties: properties, exchange: exchange, routingKey: routingKey,
            redelivered: redelivered, deliveryTag: deliveryTag, consumerTag: consumerTag, frameMax: frameMax,
            acknowledger: DeliveryAcknowledger(core: core, channel: channelID, epoch: ch.epoch))
        sink.deliver(delivery)
    }
}

/// A message whose method frame has come and whose header and body are coming.
struct ArrivingContent {
    enum Method {
        case deliver(consumerTag: String, exchange: String, routingKey: String, redelivered: Bool, deliveryTag: UInt64)
        case returned(replyCode: UInt16, replyText: String, exchange: String, routingKey: String)
    }
    let method: Method
    var properties: AMQPProperties?
    var size: UInt64 = 0
    var body = Data()
}
