#include "bench_amqp.h"

#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>

void bench_read_stream(const char *program, amqp_connection_state_t c, int count) {
  for (int i = 0; i < count; i++) {
    amqp_envelope_t e;
    amqp_maybe_release_buffers(c);
    if (amqp_consume_message(c, &e, NULL, 0).reply_type != AMQP_RESPONSE_NORMAL) bench_die(program, "read stream");
    amqp_basic_ack(c, 1, e.delivery_tag, 0);
    amqp_destroy_envelope(&e);
  }
}

void bench_die(const char *program, const char *what) {
  fprintf(stderr, "%s: %s failed\n", program, what);
  exit(1);
}

amqp_connection_state_t bench_open(const char *program, const char *host, int port, const char *user,
                                   const char *password, const char *vhost) {
  amqp_connection_state_t c = amqp_new_connection();
  amqp_socket_t *s = amqp_tcp_socket_new(c);
  if (!s || amqp_socket_open(s, host, port) != AMQP_STATUS_OK) bench_die(program, "connect");
  if (amqp_login(c, vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, user, password).reply_type != AMQP_RESPONSE_NORMAL)
    bench_die(program, "login");
  amqp_channel_open(c, 1);
  if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(program, "channel.open");
  return c;
}
