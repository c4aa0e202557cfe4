import CRabbitMQ
import Foundation

extension ConnectionLoop {
    /// Opens the socket (TCP or TLS), logs in and tunes. Runs on the owner thread.
    static func open(_ configuration: AMQPConnectionConfiguration, core: ConnectionCore) throws -> ConnectionLoop {
        let url = configuration.url
        guard let conn = amqp_new_connection() else {
            throw AMQPError(.library, "rabbitmq-c could not allocate a connection")
        }
        do {
            try openSocket(conn, configuration)
            var rpcTimeout = timeval(
                tv_sec: configuration.rpcTimeoutMs / 1000, tv_usec: (configuration.rpcTimeoutMs % 1000) * 1000)
            _ = amqp_set_rpc_timeout(conn, &rpcTimeout)
            var handshake = timeval(
                tv_sec: url.connectionTimeoutMs / 1000, tv_usec: (url.connectionTimeoutMs % 1000) * 1000)
            _ = amqp_set_handshake_timeout(conn, &handshake)

            let arena = CArena()
            var properties = arena.table(clientProperties(configuration.connectionName))
            let reply = fd_amqp_login_plain(
                conn, arena.cString(url.vhost), Int32(url.channelMax), Int32(url.frameMax), Int32(url.heartbeat),
                &properties, arena.cString(url.user), arena.cString(url.password))
            switch RabbitMQOutcome(reply) {
            case .ok:
                break
            case .connectionClosed(let code, let text), .channelClosed(let code, let text):
                let kind: AMQPError.Code = (code == 403 || code == 530) ? .authenticationFailed : .connectionFailed
                throw AMQPError(
                    kind, "the broker refused \(url.user)@\(url.host):\(url.port) vhost '\(url.vhost)': "
                        + "\(AMQPError.describeReply(code, text))", replyCode: code)
            case .library(let status):
                var error = AMQPError.library(status, "logging in to \(url)")
                // Without authentication_failure_close a bad password shows as a closed socket.
                if error.code == .connectionClosed { error.code = .authenticationFailed }
                throw error
            }
            return ConnectionLoop(
                core: core, conn: conn, heartbeatSeconds: Int(amqp_get_heartbeat(conn)),
                confirmTimeout: .milliseconds(configuration.confirmTimeoutMs),
                republishAfter: .milliseconds(configuration.republishAfterMs), writesWindows: !configuration.url.tls)
        } catch {
            amqp_destroy_connection(conn)
            throw error
        }
    }

    private static func openSocket(_ conn: amqp_connection_state_t, _ configuration: AMQPConnectionConfiguration) throws {
        let url = configuration.url
        let socket: OpaquePointer?
        if url.tls {
            socket = amqp_ssl_socket_new(conn)
            guard let socket else { throw AMQPError(.tlsFailed, "could not create a TLS socket") }
            let tls = configuration.tls
            if let ca = tls.caFile {
                let rc = amqp_ssl_socket_set_cacert(socket, ca)
                guard rc == AMQP_STATUS_OK.rawValue else {
                    throw AMQPError(.tlsFailed, "could not load the CA file \(ca)", libraryStatus: rc)
                }
            }
            if let cert = tls.certificateFile, let key = tls.keyFile {
                let rc = amqp_ssl_socket_set_key(socket, cert, key)
                guard rc == AMQP_STATUS_OK.rawValue else {
                    throw AMQPError(.tlsFailed, "could not load the client certificate \(cert) and key \(key)", libraryStatus: rc)
                }
            } else if (tls.certificateFile == nil) != (tls.keyFile == nil) {
                throw AMQPError(.invalidConfiguration, "a client certificate needs both AMQP_CERT_FILE and AMQP_KEY_FILE")
            }
            amqp_ssl_socket_set_verify_peer(socket, tls.verifyPeer ? 1 : 0)
            amqp_ssl_socket_set_verify_hostname(socket, tls.verifyHostname ? 1 : 0)
        } else {
            socket = amqp_tcp_socket_new(conn)
            guard socket != nil else { throw AMQPError(.connectionFailed, "could not create a TCP socket") }
        }
        var timeout = timeval(tv_sec: url.connectionTimeoutMs / 1000, tv_usec: (url.connectionTimeoutMs % 1000) * 1000)
        let rc = amqp_socket_open_noblock(socket, url.host, Int32(url.port), &timeout)
        guard rc == AMQP_STATUS_OK.rawValue else {
            var error = AMQPError.library(rc, "connecting to \(url.host):\(url.port)")
            if error.code != .tlsFailed { error.code = .connectionFailed }
            throw error
        }
    }

    /// Properties RabbitMQ shows for the connection; `connection_name` is the
    /// name in the management UI, and the capabilities turn on the broker
    /// features this client handles.
    static func clientProperties(_ name: String) -> FieldTable {
        [
            "product": "frontdesk-amqp",
            "platform": "Swift",
            "version": "1",
            "connection_name": .string(name),
            "capabilities": .table([
                "authentication_failure_close": true,
                "publisher_confirms": true,
                "basic.nack": true,
                "consumer_cancel_notify": true,
                "connection.blocked": true,
                "exchange_exchange_bindings": true,
            ]),
        ]
    }
}
