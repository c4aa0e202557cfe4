import CRabbitMQ
import Foundation

private func flag(_ b: Bool) -> amqp_boolean_t { b ? 1 : 0 }

extension ConnectionLoop {
    func exchangeDeclare(
        _ ch: ChannelState, name: String, type: String, passive: Bool, durable: Bool,
        autoDelete: Bool, internal isInternal: Bool, arguments: FieldTable?
    ) throws {
        try flushBeforeDirectWrite()
        let arena = CArena()
        amqp_exchange_declare(
            conn, ch.id, arena.bytes(name), arena.bytes(type), flag(passive), flag(durable),
            flag(autoDelete), flag(isInternal), arena.table(arguments))
        try check(amqp_get_rpc_reply(conn), channel: ch, "declaring exchange '\(name)'")
    }

    func exchangeDelete(_ ch: ChannelState, name: String, ifUnused: Bool) throws {
        try flushBeforeDirectWrite()
        let arena = CArena()
        amqp_exchange_delete(conn, ch.id, arena.bytes(name), flag(ifUnused))
        try check(amqp_get_rpc_reply(conn), channel: ch, "deleting exchange '\(name)'")
    }

    func exchangeBind(_ ch: ChannelState, destination: String, source: String, routingKey: String, arguments: FieldTable?) throws {
        try flushBeforeDirectWrite()
        let arena = CArena()
        amqp_exchange_bind(
            conn, ch.id, arena.bytes(destination), arena.bytes(source), arena.bytes(routingKey), arena.table(arguments))
        try check(amqp_get_rpc_reply(conn), channel: ch, "binding exchange '\(destination)' to '\(source)'")
    }

    func queueDeclare(
        _ ch: ChannelState, name: String, passive: Bool, durable: Bool, exclusive: Bool,
        autoDelete: Bool, arguments: FieldTable?
    ) throws -> QueueDeclareResult {
        try flushBeforeDirectWrite()
        let arena = CArena()
        let ok = amqp_queue_declare(
            conn, ch.id, arena.bytes(name), flag(passive), flag(durable), flag(exclusive),
            flag(autoDelete), arena.table(arguments))
        try check(amqp_get_rpc_reply(conn), channel: ch, "declaring queue '\(name)'")
        guard let ok else { throw AMQPError(.library, "declaring queue '\(name)': no declare-ok") }
        return QueueDeclareResult(
            name: ok.pointee.queue.string, messageCount: ok.pointee.message_count,
            consumerCount: ok.pointee.consumer_count)
    }

    func queueBind(_ ch: ChannelState, queue: String, exchange: String, routingKey: String, arguments: FieldTable?, bind: Bool) throws {
        try flushBeforeDirectWrite()
        let arena = CArena()
        if bind {
            amqp_queue_bind(conn, ch.id, arena.bytes(queue), arena.bytes(exchange), arena.bytes(routingKey), arena.table(arguments))
        } else {
            amqp_queue_unbind(conn, ch.id, arena.bytes(queue), arena.bytes(exchange), arena.bytes(routingKey), arena.table(arguments))
        }
        try check(amqp_get_rpc_reply(conn), channel: ch, "\(bind ? "binding" : "unbinding") queue '\(queue)' and exchange '\(exchange)'")
    }

    func queueDelete(_ ch: ChannelState, name: String, ifUnused: Bool, ifEmpty: Bool) throws -> UInt32 {
        try flushBeforeDirectWrite()
        let arena = CArena()
        let ok = amqp_queue_delete(conn, ch.id, arena.bytes(name), flag(ifUnused), flag(ifEmpty))
        try check(amqp_get_rpc_reply(conn), channel: ch, "deleting queue '\(name)'")
        return ok?.pointee.message_count ?? 0
    }

    func queuePurge(_ ch: ChannelState, name: String) throws -> UInt32 {
        try flushBeforeDirectWrite()
        let arena = CArena()
        let ok = amqp_queue_purge(conn, ch.id, arena.bytes(name))
        try check(amqp_get_rpc_reply(conn), channel: ch, "purging queue '\(name)'")
        return ok?.pointee.message_count ?? 0
    }

    func qos(_ ch: ChannelState, prefetchCount: UInt16, global: Bool) throws {
        try flushBeforeDirectWrite()
        amqp_basic_qos(conn, ch.id, 0, prefetchCount, flag(global))
        try check(amqp_get_rpc_reply(conn), channel: ch, "setting prefetch \(prefetchCount)")
    }

    func confirmSelect(_ ch: ChannelState) throws {
        guard !ch.confirming else { return }
        try flushBeforeDirectWrite()
        amqp_confirm_select(conn, ch.id)
        try check(amqp_get_rpc_reply(conn), channel: ch, "turning on publisher confirms")
        ch.confirming = true
    }

    /// Writes the messages; in confirm mode the batch resolves as confirms
    /// arrive, otherwise at once.
    func publish(_ ch: ChannelState, _ messages: [OutboundMessage], batch: PublishBatch) {
        if let reason = core.blockedReason {
            for i in messages.indices {
                batch.resolve(i, .failure(AMQPError(.connectionBlocked, "the broker blocks publishing: \(reason)")))
            }
            return
        }
        // Kept for matching a basic.return, which only a mandatory publish
        // gets, and for publishing again (a copy, or to `ifNacked`).
        if messages.contains(where: { $0.mandatory || $0.repeatable || $0.ifNacked != nil }) { batch.messages = messages }
        if writesWindows {
            let arena = publishArena
            defer { arena.reset() }
            let properties = arena.allocate(MemoryLayout<amqp_basic_properties_t>.stride * messages.count)
                .bindMemory(to: amqp_basic_properties_t.self, capacity: messages.count)
            var window: [fd_publish_t] = []
            window.reserveCapacity(messages.count)
            // Empty (no allocation) unless a message cannot be encoded.
            var refused: Set<Int> = []
            for (i, message) in messages.enumerated() {
                // rabbitmq-c writes a table key's length as one byte whatever
                // it is: a longer key would corrupt the frame, not fail.
                if let headers = message.properties.headers, !headers.keysFit {
                    refused.insert(i)
                    batch.resolve(i, .failure(cannotCarry(message, status: nil)))
                    continue
                }
                let p = properties + window.count
                p.initialize(to: arena.properties(message.properties))
                window.append(fd_publish_t(
                    exchange: arena.bytes(message.exchange), routing_key: arena.bytes(message.routingKey),
                    mandatory: flag(message.mandatory), properties: p, body: arena.bytes(message.body)))
            }
            // Written with the turn's other output (flushOutput): the
            // confirms are tracked from here, and a failed write fails them.
            let rc = fd_amqp_append_publishes(conn, ch.id, window, window.count, output)
            if rc != AMQP_STATUS_OK.rawValue {
                // Nothing of the window is in the buffer: refuse what AMQP
                // cannot carry, one message at a time, and write the rest.
                // The window holds the messages not refused above, in order.
                let indices = messages.indices.filter { !refused.contains($0) }
                for (w, i) in indices.enumerated() {
                    let one = withUnsafePointer(to: window[w]) { fd_amqp_append_publishes(conn, ch.id, $0, 1, output) }
                    guard one != AMQP_STATUS_OK.rawValue else { continue }
                    refused.insert(i)
                    batch.resolve(i, .failure(one == AMQP_STATUS_NO_MEMORY.rawValue
                        ? AMQPError.library(one, "publishing to '\(messages[i].exchange)'")
                        : cannotCarry(messages[i], status: one)))
                }
            }
            if ch.confirming {
                flushOutputIfLarge()
            } else {
                // Without confirms, success means written: write it now.
                flushOutput()
                if let failure {
                    for i in messages.indices where !refused.contains(i) { batch.resolve(i, .failure(failure)) }
                    return
                }
            }
            for i in messages.indices where !refused.contains(i) { published(ch, index: i, batch: batch) }
            return
        }
        for (i, message) in messages.enumerated() {
            // rabbitmq-c writes frame by frame here: a message that fails to
            // encode half way would leave the stream cut. Refuse it before.
            if message.amqpCannotCarry != nil {
                batch.resolve(i, .failure(cannotCarry(message, status: nil)))
                continue
            }
            let arena = CArena()
            var props = arena.properties(message.properties)
            let rc = message.body.withUnsafeBytes { raw in
                amqp_basic_publish(
                    conn, ch.id, arena.bytes(message.exchange), arena.bytes(message.routingKey),
                    flag(message.mandatory), 0, &props,
                    amqp_bytes_t(len: raw.count, bytes: UnsafeMutableRawPointer(mutating: raw.baseAddress)))
            }
            if rc != AMQP_STATUS_OK.rawValue {
                let error = AMQPError.library(rc, "publishing to '\(message.exchange)'")
                fail(error)
                for j in i..<messages.count { batch.resolve(j, .failure(error)) }
                return
            }
            published(ch, index: i, batch: batch)
        }
    }

    /// The error for a message AMQP cannot carry: what is too long, or what
    /// rabbitmq-c said when its headers would not encode.
    private func cannotCarry(_ message: OutboundMessage, status: Int32?) -> AMQPError {
        let why = message.amqpCannotCarry
            ?? "its headers cannot be encoded (\(status.map { String(cString: amqp_error_string2($0)) } ?? "unknown"))"
        return AMQPError(
            .invalidMessage, "AMQP cannot carry the message for '\(message.exchange)': \(why)", libraryStatus: status)
    }

    /// Tracks a written message's confirm (or resolves it at once without confirms).
    private func published(_ ch: ChannelState, index i: Int, batch: PublishBatch) {
        if ch.confirming {
            ch.pending.append(PendingPublish(batch: batch, index: i, publishedAt: .now))
        } else {
            batch.resolve(i, .success(()))
        }
    }

    func consume(
        _ ch: ChannelState, queue: String, consumerTag: String, noAck: Bool, exclusive: Bool,
        arguments: FieldTable?, sink: ConsumerSink
    ) throws -> String {
        try flushBeforeDirectWrite()
        let arena = CArena()
        let ok = amqp_basic_consume(
            conn, ch.id, arena.bytes(queue), arena.bytes(consumerTag), 0, flag(noAck), flag(exclusive),
            arena.table(arguments))
        try check(amqp_get_rpc_reply(conn), channel: ch, "consuming from queue '\(queue)'")
        guard let ok else { throw AMQPError(.library, "consuming from '\(queue)': no consume-ok") }
        let tag = ok.pointee.consumer_tag.string
        ch.consumers[tag] = sink
        // A stream consumer is one that names where in the stream it starts.
        if noAck || arguments?[AMQPStream.offsetArgument] != nil {
            ch.neverRejected.insert(tag)
        } else {
            ch.neverRejected.remove(tag)  // a tag of the caller's, used before by such a consumer
        }
        return tag
    }

    func cancel(_ ch: ChannelState, consumerTag: String) throws {
        guard let sink = ch.consumers[consumerTag] else { return }
        try flushBeforeDirectWrite()
        let arena = CArena()
        amqp_basic_cancel(conn, ch.id, arena.bytes(consumerTag))
        try check(amqp_get_rpc_reply(conn), channel: ch, "cancelling consumer \(consumerTag)")
        ch.consumers[consumerTag] = nil
        sink.finish(nil)
    }

    func acknowledge(_ ch: ChannelState, tag: UInt64, kind: AcknowledgementKind) throws {
        let rc: Int32
        if writesWindows {
            // Buffered with the turn's other output (flushOutput).
            switch kind {
            case .ack(let multiple):
                rc = fd_amqp_append_ack(output, ch.id, tag, flag(multiple))
            case .nack(let multiple, let requeue):
                rc = fd_amqp_append_nack(output, ch.id, tag, flag(multiple), flag(requeue))
            case .reject(let requeue):
                rc = fd_amqp_append_reject(output, ch.id, tag, flag(requeue))
            }
            if rc != AMQP_STATUS_OK.rawValue {
                // The acks buffered before this one still go out.
                flushOutput()
                try checkStatus(rc, "acknowledging delivery \(tag)")
            }
            flushOutputIfLarge()
            return
        }
        switch kind {
        case .ack(let multiple):
            rc = amqp_basic_ack(conn, ch.id, tag, flag(multiple))
        case .nack(let multiple, let requeue):
            rc = amqp_basic_nack(conn, ch.id, tag, flag(multiple), flag(requeue))
        case .reject(let requeue):
            rc = amqp_basic_reject(conn, ch.id, tag, flag(requeue))
        }
        try checkStatus(rc, "acknowledging delivery \(tag)")
    }
}

enum AcknowledgementKind: Sendable {
    case ack(multiple: Bool)
    case nack(multiple: Bool, requeue: Bool)
    case reject(requeue: Bool)
}
