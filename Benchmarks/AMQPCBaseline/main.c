// The baseline for amqp-bench: the same workload as the Swift layer, as a
// plain C loop on rabbitmq-c. One publisher connection publishes persistent
// messages to a quorum queue in windows of W and waits for their confirms;
// one consumer connection (its own thread) consumes with prefetch 2W and acks
// each message. Prints one JSON line of figures.
//
//   amqp-c-baseline HOST PORT USER PASSWORD MESSAGES WINDOW BODY_BYTES
//
// With --echo, one stage of a pipeline instead, as a service is one: each
// message consumed from FROM (prefetch 2) is published to TO, persistent and
// confirmed, then acked, on one connection with two channels.
//
//   amqp-c-baseline --echo HOST PORT USER PASSWORD VHOST FROM TO
#include <amqp.h>
#include "bench_amqp.h"
#define PROGRAM "amqp-c-baseline"
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *host, *user, *password;
static int port, messages, window, body_bytes;
static char queue[128];

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double consumer_done_ms;

static void *consume(void *arg) {
  amqp_connection_state_t c = arg;
  amqp_basic_qos(c, 1, 0, (uint16_t)(2 * window), 0);
  amqp_basic_consume(c, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "basic.consume");
  for (int received = 0; received < messages;) {
    amqp_envelope_t e;
    amqp_maybe_release_buffers(c);
    amqp_rpc_reply_t r = amqp_consume_message(c, &e, NULL, 0);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "consume");
    amqp_basic_ack(c, 1, e.delivery_tag, 0);
    amqp_destroy_envelope(&e);
    received++;
  }
  consumer_done_ms = now_ms();
  return NULL;
}

static int compare(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/// --echo: consume FROM on channel 1, publish each body to TO on channel 2
/// of the same connection (as the Swift stage does), ack each delivery once
/// its publish is confirmed; until the broker ends the consumer or the
/// connection, or the driver that started it is gone.
static int echo(char **argv) {
  host = argv[2]; port = atoi(argv[3]); user = argv[4]; password = argv[5];
  const char *vhost = argv[6], *from = argv[7], *to = argv[8];
  pid_t parent = getppid();
  amqp_connection_state_t c = bench_open(PROGRAM, host, port, user, password, vhost);
  amqp_channel_open(c, 2);
  if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "channel.open 2");
  amqp_confirm_select(c, 2);
  if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "confirm.select");
  amqp_basic_qos(c, 1, 0, 2, 0);
  amqp_basic_consume(c, 1, amqp_cstring_bytes(from), amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
  if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "basic.consume");
  amqp_basic_properties_t props = {0};
  props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
  props.delivery_mode = 2;
  props.content_type = amqp_cstring_bytes("application/json");
  // Deliveries waiting for their publish's confirm, in publish order (at
  // most the prefetch, 2): publish sequence number and delivery tag.
  uint64_t seqs[2], tags[2];
  int waiting = 0;
  uint64_t next_seq = 1;
  struct timeval second = {1, 0};
  for (;;) {
    amqp_envelope_t e;
    amqp_maybe_release_buffers(c);
    amqp_rpc_reply_t r = amqp_consume_message(c, &e, &second, 0);
    if (r.reply_type == AMQP_RESPONSE_NORMAL) {
      if (waiting == 2) bench_die(PROGRAM, "a third delivery past the prefetch of 2");
      if (amqp_basic_publish(c, 2, amqp_empty_bytes, amqp_cstring_bytes(to), 0, 0, &props, e.message.body) != AMQP_STATUS_OK)
        bench_die(PROGRAM, "publish");
      seqs[waiting] = next_seq++;
      tags[waiting] = e.delivery_tag;
      waiting++;
      amqp_destroy_envelope(&e);
      continue;
    }
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) {
      if (getppid() != parent) return 0;  // the driver is gone
      continue;
    }
    if (r.reply_type != AMQP_RESPONSE_LIBRARY_EXCEPTION || r.library_error != AMQP_STATUS_UNEXPECTED_STATE) return 0;
    // Not a delivery: a confirm, a cancel or a close.
    amqp_frame_t f;
    if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK) return 0;
    if (f.frame_type != AMQP_FRAME_METHOD) continue;
    if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
      amqp_basic_ack_t *ack = f.payload.method.decoded;
      while (waiting > 0 && (seqs[0] == ack->delivery_tag || (ack->multiple && seqs[0] < ack->delivery_tag))) {
        if (amqp_basic_ack(c, 1, tags[0], 0) != AMQP_STATUS_OK) bench_die(PROGRAM, "ack");
        seqs[0] = seqs[1]; tags[0] = tags[1];
        waiting--;
      }
      continue;
    }
    if (f.payload.method.id == AMQP_BASIC_NACK_METHOD) bench_die(PROGRAM, "a publish was nacked");
    return 0;  // basic.cancel (the queue went), channel.close or connection.close: done
  }
}

int main(int argc, char **argv) {
  if (argc == 9 && strcmp(argv[1], "--echo") == 0) return echo(argv);
  if (argc != 8) {
    fprintf(stderr, "usage: amqp-c-baseline HOST PORT USER PASSWORD MESSAGES WINDOW BODY_BYTES\n");
    return 2;
  }
  host = argv[1]; port = atoi(argv[2]); user = argv[3]; password = argv[4];
  messages = atoi(argv[5]); window = atoi(argv[6]); body_bytes = atoi(argv[7]);
  snprintf(queue, sizeof queue, "frontdesk.bench.c.%d", (int)getpid());

  amqp_connection_state_t pub = bench_open(PROGRAM, host, port, user, password, "/");
  amqp_table_entry_t type = {amqp_cstring_bytes("x-queue-type"), {AMQP_FIELD_KIND_UTF8, {.bytes = amqp_cstring_bytes("quorum")}}};
  amqp_table_t args = {1, &type};
  amqp_queue_declare(pub, 1, amqp_cstring_bytes(queue), 0, 1, 0, 0, args);
  if (amqp_get_rpc_reply(pub).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "queue.declare");
  amqp_confirm_select(pub, 1);
  if (amqp_get_rpc_reply(pub).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "confirm.select");

  amqp_connection_state_t sub = bench_open(PROGRAM, host, port, user, password, "/");
  pthread_t consumer;
  pthread_create(&consumer, NULL, consume, sub);

  char *body = malloc(body_bytes);
  memset(body, 'x', body_bytes);
  amqp_basic_properties_t props = {0};
  props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
  props.delivery_mode = 2;
  props.content_type = amqp_cstring_bytes("application/json");

  int windows = (messages + window - 1) / window;
  double *latency = calloc(windows, sizeof(double));
  double start = now_ms();
  uint64_t published = 0, confirmed = 0;
  for (int w = 0; w < windows; w++) {
    int count = (w + 1) * window <= messages ? window : messages - w * window;
    double t0 = now_ms();
    for (int i = 0; i < count; i++) {
      if (amqp_basic_publish(pub, 1, amqp_empty_bytes, amqp_cstring_bytes(queue), 0, 0, &props,
                             (amqp_bytes_t){(size_t)body_bytes, body}) != AMQP_STATUS_OK) bench_die(PROGRAM, "publish");
      published++;
    }
    while (confirmed < published) {
      amqp_frame_t f;
      amqp_maybe_release_buffers(pub);
      if (amqp_simple_wait_frame(pub, &f) != AMQP_STATUS_OK) bench_die(PROGRAM, "wait for confirm");
      if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
        amqp_basic_ack_t *a = f.payload.method.decoded;
        confirmed = a->multiple ? a->delivery_tag : confirmed + 1;
      }
    }
    latency[w] = now_ms() - t0;
  }
  pthread_join(consumer, NULL);
  double elapsed = consumer_done_ms - start;
  qsort(latency, windows, sizeof(double), compare);
  printf("{\"messages_per_s\":%.1f,\"confirm_p50_ms\":%.3f,\"confirm_p99_ms\":%.3f}\n",
         messages / (elapsed / 1e3), latency[windows / 2], latency[(int)(windows * 0.99)]);

  amqp_queue_delete(pub, 1, amqp_cstring_bytes(queue), 0, 0);
  amqp_connection_close(pub, AMQP_REPLY_SUCCESS);
  amqp_connection_close(sub, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(pub);
  amqp_destroy_connection(sub);
  free(latency);
  free(body);
  return 0;
}
