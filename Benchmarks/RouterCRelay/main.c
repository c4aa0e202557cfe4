// The ceiling for router-bench: the router's broker work per request as a
// plain C relay on rabbitmq-c, in batches of up to 256 (the router's
// prefetch). Per request: consume it from the intake queue, append a record
// to a stream (confirmed), read the record back, publish three messages
// (two status events and a hand-off, confirmed), ack the request.
//
//   router-c-relay HOST PORT USER PASSWORD VHOST INTAKE STREAM OUT COUNT
// Prints {"requests_per_s": ...} once COUNT requests are relayed.
#include <amqp.h>
#include "bench_amqp.h"
#define PROGRAM "router-c-relay"
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define BATCH 256

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void wait_confirms(amqp_connection_state_t c, uint64_t *confirmed, uint64_t published) {
  while (*confirmed < published) {
    amqp_frame_t f;
    amqp_maybe_release_buffers(c);
    if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK) bench_die(PROGRAM, "wait for confirm");
    if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
      amqp_basic_ack_t *a = f.payload.method.decoded;
      *confirmed = a->multiple ? a->delivery_tag : *confirmed + 1;
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 10) {
    fprintf(stderr, "usage: router-c-relay HOST PORT USER PASSWORD VHOST INTAKE STREAM OUT COUNT\n");
    return 2;
  }
  const char *host = argv[1], *user = argv[3], *password = argv[4], *vhost = argv[5];
  int port = atoi(argv[2]), count = atoi(argv[9]);
  amqp_bytes_t intake = amqp_cstring_bytes(argv[6]), stream = amqp_cstring_bytes(argv[7]), out = amqp_cstring_bytes(argv[8]);

  amqp_connection_state_t in = bench_open(PROGRAM, host, port, user, password, vhost);
  amqp_connection_state_t pub = bench_open(PROGRAM, host, port, user, password, vhost);
  amqp_connection_state_t tail = bench_open(PROGRAM, host, port, user, password, vhost);
  amqp_basic_qos(in, 1, 0, BATCH, 0);
  amqp_basic_consume(in, 1, intake, amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  if (amqp_get_rpc_reply(in).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "consume intake");
  amqp_confirm_select(pub, 1);
  if (amqp_get_rpc_reply(pub).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "confirm.select");
  amqp_basic_qos(tail, 1, 0, 2 * BATCH, 0);
  amqp_table_entry_t offset = {amqp_cstring_bytes("x-stream-offset"), {AMQP_FIELD_KIND_UTF8, {.bytes = amqp_cstring_bytes("next")}}};
  amqp_basic_consume(tail, 1, stream, amqp_empty_bytes, 0, 0, 0, (amqp_table_t){1, &offset});
  if (amqp_get_rpc_reply(tail).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "consume stream");

  amqp_basic_properties_t props = {0};
  props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
  props.delivery_mode = 2;
  props.content_type = amqp_cstring_bytes("application/json");
  char record[600];
  memset(record, 'r', sizeof record);
  char event[700];
  memset(event, 'e', sizeof event);

  uint64_t published = 0, confirmed = 0;
  int relayed = 0;
  double start = 0;
  while (relayed < count) {
    // 1. Up to BATCH requests: wait for the first, then take what is there.
    uint64_t last_tag = 0;
    int n = 0;
    while (n < BATCH && relayed + n < count) {
      amqp_envelope_t e;
      struct timeval tv = {0, n == 0 ? 500000 : 2000};
      amqp_maybe_release_buffers(in);
      amqp_rpc_reply_t r = amqp_consume_message(in, &e, &tv, 0);
      if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) {
        if (n > 0) break;
        continue;
      }
      if (r.reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "consume request");
      if (start == 0) start = now_s();
      last_tag = e.delivery_tag;
      amqp_destroy_envelope(&e);
      n++;
    }
    // 2. Append n records to the stream, confirmed.
    for (int i = 0; i < n; i++) {
      if (amqp_basic_publish(pub, 1, amqp_empty_bytes, stream, 0, 0, &props, (amqp_bytes_t){sizeof record, record}) != 0)
        bench_die(PROGRAM, "publish record");
      published++;
    }
    wait_confirms(pub, &confirmed, published);
    // 3. Read them back from the stream.
    bench_read_stream(PROGRAM, tail, n);
    // 4. Three messages a request, confirmed.
    for (int i = 0; i < 3 * n; i++) {
      if (amqp_basic_publish(pub, 1, amqp_empty_bytes, out, 0, 0, &props, (amqp_bytes_t){sizeof event, event}) != 0)
        bench_die(PROGRAM, "publish event");
      published++;
    }
    wait_confirms(pub, &confirmed, published);
    // 5. Ack the requests.
    amqp_basic_ack(in, 1, last_tag, 1);
    relayed += n;
  }
  printf("{\"requests_per_s\":%.1f}\n", count / (now_s() - start));
  amqp_connection_close(in, AMQP_REPLY_SUCCESS);
  amqp_connection_close(pub, AMQP_REPLY_SUCCESS);
  amqp_connection_close(tail, AMQP_REPLY_SUCCESS);
  return 0;
}
