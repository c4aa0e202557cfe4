import CRabbitMQ

extension CArena {
    func properties(_ p: AMQPProperties) -> amqp_basic_properties_t {
        var c = amqp_basic_properties_t()
        var flags: amqp_flags_t = 0
        if let v = p.contentType { c.content_type = bytes(v); flags |= FD_PROP_CONTENT_TYPE }
        if let v = p.contentEncoding { c.content_encoding = bytes(v); flags |= FD_PROP_CONTENT_ENCODING }
        if let v = p.headers { c.headers = table(v); flags |= FD_PROP_HEADERS }
        if let v = p.deliveryMode { c.delivery_mode = v; flags |= FD_PROP_DELIVERY_MODE }
        if let v = p.priority { c.priority = v; flags |= FD_PROP_PRIORITY }
        if let v = p.correlationID { c.correlation_id = bytes(v); flags |= FD_PROP_CORRELATION_ID }
        if let v = p.replyTo { c.reply_to = bytes(v); flags |= FD_PROP_REPLY_TO }
        if let v = p.expiration { c.expiration = bytes(v); flags |= FD_PROP_EXPIRATION }
        if let v = p.messageID { c.message_id = bytes(v); flags |= FD_PROP_MESSAGE_ID }
        if let v = p.timestamp { c.timestamp = v; flags |= FD_PROP_TIMESTAMP }
        if let v = p.type { c.type = bytes(v); flags |= FD_PROP_TYPE }
        if let v = p.userID { c.user_id = bytes(v); flags |= FD_PROP_USER_ID }
        if let v = p.appID { c.app_id = bytes(v); flags |= FD_PROP_APP_ID }
        c._flags = flags
        return c
    }
}

extension AMQPProperties {
    /// Copies the properties out of rabbitmq-c's memory.
    init(_ c: amqp_basic_properties_t) {
        self.init()
        let f = c._flags
        func has(_ flag: amqp_flags_t) -> Bool { f & flag != 0 }
        if has(FD_PROP_CONTENT_TYPE) { contentType = c.content_type.string }
        if has(FD_PROP_CONTENT_ENCODING) { contentEncoding = c.content_encoding.string }
        if has(FD_PROP_HEADERS) { headers = FieldTable(c.headers) }
        if has(FD_PROP_DELIVERY_MODE) { deliveryMode = c.delivery_mode }
        if has(FD_PROP_PRIORITY) { priority = c.priority }
        if has(FD_PROP_CORRELATION_ID) { correlationID = c.correlation_id.string }
        if has(FD_PROP_REPLY_TO) { replyTo = c.reply_to.string }
        if has(FD_PROP_EXPIRATION) { expiration = c.expiration.string }
        if has(FD_PROP_MESSAGE_ID) { messageID = c.message_id.string }
        if has(FD_PROP_TIMESTAMP) { timestamp = c.timestamp }
        if has(FD_PROP_TYPE) { type = c.type.string }
        if has(FD_PROP_USER_ID) { userID = c.user_id.string }
        if has(FD_PROP_APP_ID) { appID = c.app_id.string }
    }
}
