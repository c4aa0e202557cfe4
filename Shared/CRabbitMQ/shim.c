#include "CRabbitMQ.h"

#include <sys/eventfd.h>

amqp_rpc_reply_t fd_amqp_login_plain(amqp_connection_state_t state,
                                     const char *vhost,
                                     int channel_max,
                                     int frame_max,
                                     int heartbeat,
                                     const amqp_table_t *client_properties,
                                     const char *user,
                                     const char *password) {
  return amqp_login_with_properties(state, vhost, channel_max, frame_max,
                                    heartbeat, client_properties,
                                    AMQP_SASL_METHOD_PLAIN, user, password);
}

const amqp_method_number_t FD_CONNECTION_CLOSE = AMQP_CONNECTION_CLOSE_METHOD;
const amqp_method_number_t FD_CONNECTION_CLOSE_OK = AMQP_CONNECTION_CLOSE_OK_METHOD;
const amqp_method_number_t FD_CONNECTION_BLOCKED = AMQP_CONNECTION_BLOCKED_METHOD;
const amqp_method_number_t FD_CONNECTION_UNBLOCKED = AMQP_CONNECTION_UNBLOCKED_METHOD;
const amqp_method_number_t FD_CHANNEL_CLOSE = AMQP_CHANNEL_CLOSE_METHOD;
const amqp_method_number_t FD_CHANNEL_CLOSE_OK = AMQP_CHANNEL_CLOSE_OK_METHOD;
const amqp_method_number_t FD_BASIC_DELIVER = AMQP_BASIC_DELIVER_METHOD;
const amqp_method_number_t FD_BASIC_ACK = AMQP_BASIC_ACK_METHOD;
const amqp_method_number_t FD_BASIC_NACK = AMQP_BASIC_NACK_METHOD;
const amqp_method_number_t FD_BASIC_RETURN = AMQP_BASIC_RETURN_METHOD;
const amqp_method_number_t FD_BASIC_CANCEL = AMQP_BASIC_CANCEL_METHOD;
const amqp_method_number_t FD_BASIC_CANCEL_OK = AMQP_BASIC_CANCEL_OK_METHOD;

const amqp_flags_t FD_PROP_CONTENT_TYPE = AMQP_BASIC_CONTENT_TYPE_FLAG;
const amqp_flags_t FD_PROP_CONTENT_ENCODING = AMQP_BASIC_CONTENT_ENCODING_FLAG;
const amqp_flags_t FD_PROP_HEADERS = AMQP_BASIC_HEADERS_FLAG;
const amqp_flags_t FD_PROP_DELIVERY_MODE = AMQP_BASIC_DELIVERY_MODE_FLAG;
const amqp_flags_t FD_PROP_PRIORITY = AMQP_BASIC_PRIORITY_FLAG;
const amqp_flags_t FD_PROP_CORRELATION_ID = AMQP_BASIC_CORRELATION_ID_FLAG;
const amqp_flags_t FD_PROP_REPLY_TO = AMQP_BASIC_REPLY_TO_FLAG;
const amqp_flags_t FD_PROP_EXPIRATION = AMQP_BASIC_EXPIRATION_FLAG;
const amqp_flags_t FD_PROP_MESSAGE_ID = AMQP_BASIC_MESSAGE_ID_FLAG;
const amqp_flags_t FD_PROP_TIMESTAMP = AMQP_BASIC_TIMESTAMP_FLAG;
const amqp_flags_t FD_PROP_TYPE = AMQP_BASIC_TYPE_FLAG;
const amqp_flags_t FD_PROP_USER_ID = AMQP_BASIC_USER_ID_FLAG;
const amqp_flags_t FD_PROP_APP_ID = AMQP_BASIC_APP_ID_FLAG;

int fd_amqp_send_heartbeat(amqp_connection_state_t state) {
  amqp_frame_t frame;
  frame.frame_type = AMQP_FRAME_HEARTBEAT;
  frame.channel = 0;
  return amqp_send_frame(state, &frame);
}

int fd_eventfd_create(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v) {
  put16(p, (uint16_t)(v >> 16));
  put16(p + 2, (uint16_t)v);
}

static void put64(uint8_t *p, uint64_t v) {
  put32(p, (uint32_t)(v >> 32));
  put32(p + 4, (uint32_t)v);
}

/// A growing output buffer, kept by its connection from one flush to the
/// next: grown once to what a turn of its loop writes, then reused.
struct fd_buffer {
  uint8_t *bytes;
  size_t len, cap;
};
typedef struct fd_buffer fd_buffer_t;

/// What a buffer may keep between flushes; one grown past it by a burst of
/// large bodies is given back after its flush.
enum { BUFFER_KEEP = 1 << 20 };

fd_buffer_t *fd_buffer_create(void) { return calloc(1, sizeof(fd_buffer_t)); }

void fd_buffer_free(fd_buffer_t *b) {
  if (!b) return;
  free(b->bytes);
  free(b);
}

static int reserve(fd_buffer_t *b, size_t more) {
  if (b->len + more <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 16384;
  while (cap < b->len + more) cap *= 2;
  uint8_t *grown = realloc(b->bytes, cap);
  if (!grown) return 0;
  b->bytes = grown;
  b->cap = cap;
  return 1;
}

/// How long a write may make no progress at all before the connection is
/// given up: a broker that stopped reading (gone silent, or a peer that
/// never drains) must not hold the connection's thread for ever.
enum { SEND_STALL_LIMIT_MS = 15000 };

static int send_all(int fd, const uint8_t *p, size_t n) {
  int stalled_ms = 0;
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      stalled_ms = 0;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT, .revents = 0};
      int ready = poll(&pfd, 1, 1000);
      if (ready < 0 && errno != EINTR) return AMQP_STATUS_SOCKET_ERROR;
      if (ready == 0 && (stalled_ms += 1000) >= SEND_STALL_LIMIT_MS) return AMQP_STATUS_TIMEOUT;
    } else {
      return AMQP_STATUS_SOCKET_ERROR;
    }
  }
  return AMQP_STATUS_OK;
}

// A frame: type (1), channel (2), payload size (4), payload, frame-end (1).
enum { FRAME_HEADER = 7, FRAME_OVERHEAD = 8 };

/// Closes the frame at `f` whose payload is written: its header and end
/// marker. Returns the frame's whole size.
static size_t close_frame(uint8_t *f, uint8_t type, amqp_channel_t channel, size_t payload) {
  f[0] = type;
  put16(f + 1, channel);
  put32(f + 3, (uint32_t)payload);
  f[FRAME_HEADER + payload] = AMQP_FRAME_END;
  return FRAME_OVERHEAD + payload;
}

/// Appends one method frame (method id and encoded arguments) to `b`.
static int append_method(fd_buffer_t *b, amqp_channel_t channel, amqp_method_number_t id, void *decoded,
                         size_t room) {
  if (!b || !reserve(b, FRAME_OVERHEAD + 4 + room)) return AMQP_STATUS_NO_MEMORY;
  uint8_t *f = b->bytes + b->len;
  put32(f + FRAME_HEADER, id);
  amqp_bytes_t args = {.len = room, .bytes = f + FRAME_HEADER + 4};
  int n = amqp_encode_method(id, decoded, args);
  if (n < 0) return n;
  b->len += close_frame(f, AMQP_FRAME_METHOD, channel, 4 + (size_t)n);
  return AMQP_STATUS_OK;
}

int fd_amqp_append_publishes(amqp_connection_state_t state, amqp_channel_t channel,
                             const fd_publish_t *messages, size_t count, fd_buffer_t *b) {
  if (!b) return AMQP_STATUS_NO_MEMORY;
  size_t frame_max = (size_t)amqp_get_frame_max(state);
  if (frame_max < 4096) frame_max = 4096;
  size_t chunk = frame_max - FRAME_OVERHEAD;
  size_t start = b->len;
  int status = AMQP_STATUS_OK;
  for (size_t i = 0; i < count && status == AMQP_STATUS_OK; i++) {
    const fd_publish_t *m = &messages[i];
    // Method frame: basic.publish and its arguments.
    amqp_basic_publish_t publish = {.ticket = 0, .exchange = m->exchange, .routing_key = m->routing_key,
                                    .mandatory = m->mandatory, .immediate = 0};
    status = append_method(b, channel, AMQP_BASIC_PUBLISH_METHOD, &publish, chunk - 4);
    if (status != AMQP_STATUS_OK) break;
    // Header frame: class, weight, body size, properties.
    if (!reserve(b, frame_max)) { status = AMQP_STATUS_NO_MEMORY; break; }
    uint8_t *f = b->bytes + b->len;
    put16(f + FRAME_HEADER, AMQP_BASIC_CLASS);
    put16(f + FRAME_HEADER + 2, 0);
    put64(f + FRAME_HEADER + 4, (uint64_t)m->body.len);
    amqp_bytes_t props = {.len = chunk - 12, .bytes = f + FRAME_HEADER + 12};
    int n = amqp_encode_properties(AMQP_BASIC_CLASS, (void *)m->properties, props);
    if (n < 0) { status = n; break; }
    b->len += close_frame(f, AMQP_FRAME_HEADER, channel, 12 + (size_t)n);
    // Body frames of at most frame_max.
    for (size_t offset = 0; offset < m->body.len; offset += chunk) {
      size_t size = m->body.len - offset < chunk ? m->body.len - offset : chunk;
      if (!reserve(b, size + FRAME_OVERHEAD)) { status = AMQP_STATUS_NO_MEMORY; break; }
      f = b->bytes + b->len;
      memcpy(f + FRAME_HEADER, (const uint8_t *)m->body.bytes + offset, size);
      b->len += close_frame(f, AMQP_FRAME_BODY, channel, size);
    }
  }
  // A window that failed to encode leaves nothing of itself behind.
  if (status != AMQP_STATUS_OK) b->len = start;
  return status;
}

/// Room for the arguments of basic.ack, nack or reject (a tag and a bit field).
enum { ACK_ARGS_ROOM = 32 };

int fd_amqp_append_ack(fd_buffer_t *b, amqp_channel_t channel, uint64_t tag, amqp_boolean_t multiple) {
  amqp_basic_ack_t m = {.delivery_tag = tag, .multiple = multiple};
  return append_method(b, channel, AMQP_BASIC_ACK_METHOD, &m, ACK_ARGS_ROOM);
}

int fd_amqp_append_nack(fd_buffer_t *b, amqp_channel_t channel, uint64_t tag, amqp_boolean_t multiple,
                        amqp_boolean_t requeue) {
  amqp_basic_nack_t m = {.delivery_tag = tag, .multiple = multiple, .requeue = requeue};
  return append_method(b, channel, AMQP_BASIC_NACK_METHOD, &m, ACK_ARGS_ROOM);
}

int fd_amqp_append_reject(fd_buffer_t *b, amqp_channel_t channel, uint64_t tag, amqp_boolean_t requeue) {
  amqp_basic_reject_t m = {.delivery_tag = tag, .requeue = requeue};
  return append_method(b, channel, AMQP_BASIC_REJECT_METHOD, &m, ACK_ARGS_ROOM);
}

size_t fd_buffer_length(const fd_buffer_t *b) { return b ? b->len : 0; }

int fd_buffer_flush(amqp_connection_state_t state, fd_buffer_t *b) {
  if (!b) return AMQP_STATUS_OK;
  int status = b->len > 0 ? send_all(amqp_get_sockfd(state), b->bytes, b->len) : AMQP_STATUS_OK;
  b->len = 0;
  size_t frame_max = (size_t)amqp_get_frame_max(state);
  if (b->cap > BUFFER_KEEP && b->cap > 4 * frame_max) {
    free(b->bytes);
    b->bytes = NULL;
    b->cap = 0;
  }
  return status;
}
