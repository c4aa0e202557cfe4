#ifndef FRONTDESK_CRABBITMQ_H
#define FRONTDESK_CRABBITMQ_H

// rabbitmq-c moved its headers into rabbitmq-c/ in 0.12; Debian 12 ships 0.11.
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/framing.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

#include <stdint.h>

/// PLAIN login with client properties. Exists because
/// `amqp_login_with_properties` is variadic (the SASL credentials), which
/// Swift cannot call.
amqp_rpc_reply_t fd_amqp_login_plain(amqp_connection_state_t state,
                                     const char *vhost,
                                     int channel_max,
                                     int frame_max,
                                     int heartbeat,
                                     const amqp_table_t *client_properties,
                                     const char *user,
                                     const char *password);

// Method ids and property flags are cast or shift macros in framing.h, which
// do not all import into Swift; these constants carry the same values.
extern const amqp_method_number_t FD_CONNECTION_CLOSE;
extern const amqp_method_number_t FD_CONNECTION_CLOSE_OK;
extern const amqp_method_number_t FD_CONNECTION_BLOCKED;
extern const amqp_method_number_t FD_CONNECTION_UNBLOCKED;
extern const amqp_method_number_t FD_CHANNEL_CLOSE;
extern const amqp_method_number_t FD_CHANNEL_CLOSE_OK;
extern const amqp_method_number_t FD_BASIC_DELIVER;
extern const amqp_method_number_t FD_BASIC_ACK;
extern const amqp_method_number_t FD_BASIC_NACK;
extern const amqp_method_number_t FD_BASIC_RETURN;
extern const amqp_method_number_t FD_BASIC_CANCEL;
extern const amqp_method_number_t FD_BASIC_CANCEL_OK;

extern const amqp_flags_t FD_PROP_CONTENT_TYPE;
extern const amqp_flags_t FD_PROP_CONTENT_ENCODING;
extern const amqp_flags_t FD_PROP_HEADERS;
extern const amqp_flags_t FD_PROP_DELIVERY_MODE;
extern const amqp_flags_t FD_PROP_PRIORITY;
extern const amqp_flags_t FD_PROP_CORRELATION_ID;
extern const amqp_flags_t FD_PROP_REPLY_TO;
extern const amqp_flags_t FD_PROP_EXPIRATION;
extern const amqp_flags_t FD_PROP_MESSAGE_ID;
extern const amqp_flags_t FD_PROP_TIMESTAMP;
extern const amqp_flags_t FD_PROP_TYPE;
extern const amqp_flags_t FD_PROP_USER_ID;
extern const amqp_flags_t FD_PROP_APP_ID;

/// Sends a heartbeat frame: rabbitmq-c sends them only from inside its own
/// blocking waits, and our owner thread waits in poll(2) instead.
int fd_amqp_send_heartbeat(amqp_connection_state_t state);

/// One basic.publish of a window.
typedef struct {
  amqp_bytes_t exchange;
  amqp_bytes_t routing_key;
  amqp_boolean_t mandatory;
  const amqp_basic_properties_t *properties;
  amqp_bytes_t body;
} fd_publish_t;

/// The output buffer a connection keeps: what one turn of its loop writes
/// (publish windows, acknowledgements) goes out in one write.
typedef struct fd_buffer fd_buffer_t;
fd_buffer_t *fd_buffer_create(void);
void fd_buffer_free(fd_buffer_t *buffer);
size_t fd_buffer_length(const fd_buffer_t *buffer);

/// Writes what `buffer` holds with as few send(2) calls as the socket takes
/// and empties it; it keeps its memory for the next turn (up to 1 MiB, or
/// four frames when frames are larger). Plain TCP sockets only (TLS must go
/// through rabbitmq-c). Returns AMQP_STATUS_OK or an error status; after an
/// error the connection's stream is in an unknown state.
int fd_buffer_flush(amqp_connection_state_t state, fd_buffer_t *buffer);

/// Appends a window of basic.publish (method, header and body frames, the
/// same bytes amqp_basic_publish writes; rabbitmq-c makes three send calls
/// a message) to `buffer`, unsent. On an error status the buffer is as it
/// was before the call.
int fd_amqp_append_publishes(amqp_connection_state_t state, amqp_channel_t channel,
                             const fd_publish_t *messages, size_t count, fd_buffer_t *buffer);

/// Append basic.ack, basic.nack or basic.reject to `buffer`, unsent.
int fd_amqp_append_ack(fd_buffer_t *buffer, amqp_channel_t channel, uint64_t tag, amqp_boolean_t multiple);
int fd_amqp_append_nack(fd_buffer_t *buffer, amqp_channel_t channel, uint64_t tag, amqp_boolean_t multiple,
                        amqp_boolean_t requeue);
int fd_amqp_append_reject(fd_buffer_t *buffer, amqp_channel_t channel, uint64_t tag, amqp_boolean_t requeue);

/// A non-blocking, close-on-exec eventfd, or -1. Exists because Swift's Glibc
/// module does not export <sys/eventfd.h>; it wakes a connection's owner
/// thread out of poll(2) when a command arrives.
int fd_eventfd_create(void);

#endif
