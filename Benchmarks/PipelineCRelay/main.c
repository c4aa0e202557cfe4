// The broker-bound ceiling for pipeline-bench: the pipeline's broker work per
// dispatch as three plain C loops on rabbitmq-c (one thread and its own
// connections each), batched like the services (up to 256 a batch, every
// publish confirmed, persistent, quorum queues):
//
//   router: consume the request; append a record to a stream (confirmed) and
//           read it back; publish drafted + routing to the status exchange
//           and a hand-off to the inbox (confirmed); ack.
//   sender: consume a hand-off: publish the task and a sending event
//           (confirmed); consume a reply: publish replied (confirmed); ack.
//   agent:  consume a task, publish a final reply (confirmed), ack.
//
// The same producer and status subscriber (pipeline-bench) drive it as drive
// the real services. Requests carry their id as message_id; the relay keeps it
// as correlation_id. Runs until killed.
//
//   pipeline-c-relay HOST PORT USER PASSWORD VHOST
//   pipeline-c-relay HOST PORT USER PASSWORD VHOST --agent QUEUE
//
// With --agent it is only an instant agent for the real services (the agent
// protocol: answer each task in QUEUE with a final reply to its reply_to), so
// the pipeline and the relay are measured with the same C agent: the issue's
// load driver did the same, and the agent is no part of what is measured.
#include <amqp.h>
#include "bench_amqp.h"
#define PROGRAM "pipeline-c-relay"
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define BATCH 256
#define ID_MAX 129  /* the longest dispatch id (128 characters) and its NUL */

static const char *host, *user, *password, *vhost;
static int port;

static void consume(amqp_connection_state_t c, const char *queue, amqp_table_t args, int prefetch) {
  amqp_basic_qos(c, 1, 0, prefetch, 0);
  amqp_basic_consume(c, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0, args);
  if (amqp_get_rpc_reply(c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, queue);
}

#define WINDOW 4096

/// A publisher connection with confirms. A message routed to queues of several
/// types (a stream and a quorum queue) can be confirmed out of order, so each
/// tag of the window is marked on its own.
typedef struct {
  amqp_connection_state_t c;
  uint64_t published, window_start;
  unsigned char acked[WINDOW];
} publisher_t;

static publisher_t *open_publisher(void) {
  publisher_t *p = calloc(1, sizeof *p);
  p->c = bench_open(PROGRAM, host, port, user, password, vhost);
  amqp_confirm_select(p->c, 1);
  if (amqp_get_rpc_reply(p->c).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "confirm.select");
  return p;
}

static void publish(publisher_t *p, const char *exchange, const char *key, const char *id, const char *body, size_t size) {
  amqp_basic_properties_t props = {0};
  props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CORRELATION_ID_FLAG;
  props.delivery_mode = 2;
  props.content_type = amqp_cstring_bytes("application/json");
  props.correlation_id = amqp_cstring_bytes(id);
  if (amqp_basic_publish(p->c, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes(key), 0, 0, &props,
                         (amqp_bytes_t){size, (void *)body}) != 0)
    bench_die(PROGRAM, "publish");
  if (++p->published - p->window_start > WINDOW) bench_die(PROGRAM, "publish window");
}

static void wait_confirms(publisher_t *p) {
  uint64_t pending = p->published - p->window_start;
  while (pending > 0) {
    amqp_frame_t f;
    amqp_maybe_release_buffers(p->c);
    int status = amqp_simple_wait_frame(p->c, &f);
    if (status != AMQP_STATUS_OK) {
      fprintf(stderr, "pipeline-c-relay: waiting for confirms: %s\n", amqp_error_string2(status));
      exit(1);
    }
    if (f.frame_type != AMQP_FRAME_METHOD) continue;
    if (f.payload.method.id == AMQP_BASIC_NACK_METHOD) bench_die(PROGRAM, "confirm (nack)");
    if (f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) bench_die(PROGRAM, "connection (closed by the broker)");
    if (f.payload.method.id != AMQP_BASIC_ACK_METHOD) continue;
    amqp_basic_ack_t *a = f.payload.method.decoded;
    uint64_t from = a->multiple ? p->window_start + 1 : a->delivery_tag;
    for (uint64_t tag = from; tag <= a->delivery_tag; tag++) {
      unsigned char *mark = &p->acked[tag - p->window_start - 1];
      if (!*mark) {
        *mark = 1;
        pending--;
      }
    }
  }
  memset(p->acked, 0, sizeof p->acked);
  p->window_start = p->published;
}

/// One consumed message: its id and which queue (consumer tag) it came from.
typedef struct {
  char id[ID_MAX];
  char from[32];
} item_t;

/// The `n`th message of a batch into *e: the first waits as long as it takes,
/// the others at most 2 ms. Returns 0 when none came in time.
static int next_message(amqp_connection_state_t c, amqp_envelope_t *e, int n) {
  struct timeval tv = {0, 2000};
  amqp_maybe_release_buffers(c);
  amqp_rpc_reply_t r = amqp_consume_message(c, e, n == 0 ? NULL : &tv, 0);
  if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) return 0;
  if (r.reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "consume");
  return 1;
}

/// Waits for one message, then takes what else is there, up to BATCH.
/// Returns the count; *last is the highest delivery tag.
static int take_batch(amqp_connection_state_t c, item_t *items, uint64_t *last) {
  int n = 0;
  while (n < BATCH) {
    amqp_envelope_t e;
    if (!next_message(c, &e, n)) break;
    amqp_basic_properties_t *p = &e.message.properties;
    amqp_bytes_t id = (p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG) ? p->correlation_id
                      : (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) ? p->message_id
                                                                 : amqp_cstring_bytes("?");
    size_t len = id.len < ID_MAX - 1 ? id.len : ID_MAX - 1;
    memcpy(items[n].id, id.bytes, len);
    items[n].id[len] = 0;
    len = e.consumer_tag.len < 31 ? e.consumer_tag.len : 31;
    memcpy(items[n].from, e.consumer_tag.bytes, len);
    items[n].from[len] = 0;
    *last = e.delivery_tag;
    amqp_destroy_envelope(&e);
    n++;
  }
  return n;
}

static size_t event(char *out, const char *id, int seq, const char *state) {
  static char pad[520];
  if (!pad[0]) memset(pad, 'e', sizeof pad - 1);
  return (size_t)snprintf(out, 700, "{\"dispatchId\":\"%s\",\"seq\":%d,\"state\":\"%s\",\"pad\":\"%s\"}", id, seq, state, pad);
}

static void publish_event(publisher_t *p, const char *id, int seq, const char *state) {
  char body[700], key[64];
  size_t size = event(body, id, seq, state);
  snprintf(key, sizeof key, "status.bench.agent.%s", state);
  publish(p, "frontdesk.status", key, id, body, size);
}

static void *router(void *unused) {
  (void)unused;
  amqp_connection_state_t in = bench_open(PROGRAM, host, port, user, password, vhost);
  amqp_connection_state_t tail = bench_open(PROGRAM, host, port, user, password, vhost);
  publisher_t *pub = open_publisher();
  consume(in, "frontdesk.router.intake", amqp_empty_table, 2 * BATCH);
  amqp_table_entry_t offset = {amqp_cstring_bytes("x-stream-offset"), {AMQP_FIELD_KIND_UTF8, {.bytes = amqp_cstring_bytes("next")}}};
  consume(tail, "bench.decisions", (amqp_table_t){1, &offset}, 2 * BATCH);
  static item_t items[BATCH];
  char record[600];
  memset(record, 'r', sizeof record);
  for (;;) {
    uint64_t last = 0;
    int n = take_batch(in, items, &last);
    for (int i = 0; i < n; i++) publish(pub, "", "bench.decisions", items[i].id, record, sizeof record);
    wait_confirms(pub);
    bench_read_stream(PROGRAM, tail, n);
    for (int i = 0; i < n; i++) {
      publish_event(pub, items[i].id, 1, "drafted");
      publish_event(pub, items[i].id, 2, "routing");
      publish(pub, "", "bench.inbox", items[i].id, record, sizeof record);
    }
    wait_confirms(pub);
    amqp_basic_ack(in, 1, last, 1);
  }
  return NULL;
}

static void *sender(void *unused) {
  (void)unused;
  amqp_connection_state_t in = bench_open(PROGRAM, host, port, user, password, vhost);
  publisher_t *pub = open_publisher();
  amqp_basic_qos(in, 1, 0, 2 * BATCH, 0);
  amqp_basic_consume(in, 1, amqp_cstring_bytes("bench.inbox"), amqp_cstring_bytes("inbox"), 0, 0, 0, amqp_empty_table);
  amqp_basic_consume(in, 1, amqp_cstring_bytes("bench.replies"), amqp_cstring_bytes("replies"), 0, 0, 0, amqp_empty_table);
  if (amqp_get_rpc_reply(in).reply_type != AMQP_RESPONSE_NORMAL) bench_die(PROGRAM, "consume inbox");
  static item_t items[BATCH];
  char task[700];
  memset(task, 't', sizeof task);
  for (;;) {
    uint64_t last = 0;
    int n = take_batch(in, items, &last);
    for (int i = 0; i < n; i++) {
      if (strcmp(items[i].from, "inbox") == 0) {
        publish(pub, "", "bench.agent", items[i].id, task, sizeof task);
        publish_event(pub, items[i].id, 3, "sending");
      } else {
        publish_event(pub, items[i].id, 4, "replied");
      }
    }
    wait_confirms(pub);
    amqp_basic_ack(in, 1, last, 1);
  }
  return NULL;
}

static void *agent(void *unused) {
  (void)unused;
  amqp_connection_state_t in = bench_open(PROGRAM, host, port, user, password, vhost);
  publisher_t *pub = open_publisher();
  consume(in, "bench.agent", amqp_empty_table, 2 * BATCH);
  static item_t items[BATCH];
  char reply[300];
  memset(reply, 'a', sizeof reply);
  for (;;) {
    uint64_t last = 0;
    int n = take_batch(in, items, &last);
    for (int i = 0; i < n; i++) publish(pub, "", "bench.replies", items[i].id, reply, sizeof reply);
    wait_confirms(pub);
    amqp_basic_ack(in, 1, last, 1);
  }
  return NULL;
}

/// The value after `"key":` in a JSON body written by the sender (sorted
/// keys, no spaces): a string without its quotes, or a number. 0 if absent.
static size_t field(const char *body, size_t size, const char *key, char *out, size_t cap) {
  char pattern[40];
  int plen = snprintf(pattern, sizeof pattern, "\"%s\":", key);
  for (size_t i = 0; plen > 0 && i + (size_t)plen < size; i++) {
    if (memcmp(body + i, pattern, (size_t)plen) != 0) continue;
    size_t j = i + (size_t)plen, n = 0;
    int quoted = body[j] == '"';
    if (quoted) j++;
    while (j < size && n + 1 < cap && (quoted ? body[j] != '"' : (body[j] >= '0' && body[j] <= '9'))) out[n++] = body[j++];
    out[n] = 0;
    return n;
  }
  return 0;
}

/// An instant agent for the real services: every task in `queue` gets its
/// final reply at once, a batch of up to BATCH a confirmed window.
static void serve_agent(const char *queue) {
  amqp_connection_state_t in = bench_open(PROGRAM, host, port, user, password, vhost);
  publisher_t *pub = open_publisher();
  consume(in, queue, amqp_empty_table, 2 * BATCH);
  for (;;) {
    uint64_t last = 0;
    for (int n = 0; n < BATCH; n++) {
      amqp_envelope_t e;
      if (!next_message(in, &e, n)) break;
      char id[ID_MAX], attempt[16], to[256], body[400];
      amqp_basic_properties_t *p = &e.message.properties;
      size_t tolen = (p->_flags & AMQP_BASIC_REPLY_TO_FLAG) && p->reply_to.len < sizeof to ? p->reply_to.len : 0;
      memcpy(to, p->reply_to.bytes, tolen);
      to[tolen] = 0;
      if (field(e.message.body.bytes, e.message.body.len, "dispatchId", id, sizeof id) > 0 &&
          field(e.message.body.bytes, e.message.body.len, "attempt", attempt, sizeof attempt) > 0) {
        int size = snprintf(body, sizeof body,
                            "{\"attempt\":%s,\"dispatchId\":\"%s\",\"kind\":\"final\",\"text\":\"Done: confirmed for 14:00.\"}",
                            attempt, id);
        publish(pub, "", tolen ? to : "frontdesk.replies", id, body, (size_t)size);
      }
      last = e.delivery_tag;
      amqp_destroy_envelope(&e);
    }
    wait_confirms(pub);
    amqp_basic_ack(in, 1, last, 1);
  }
}

int main(int argc, char **argv) {
  if (argc != 6 && !(argc == 8 && strcmp(argv[6], "--agent") == 0)) {
    fprintf(stderr, "usage: pipeline-c-relay HOST PORT USER PASSWORD VHOST [--agent QUEUE]\n");
    return 2;
  }
  host = argv[1];
  port = atoi(argv[2]);
  user = argv[3];
  password = argv[4];
  vhost = argv[5];
  // A parent's blocked signals are inherited: let SIGTERM end the relay.
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_UNBLOCK, &all, NULL);
  if (argc == 8) {
    fprintf(stderr, "pipeline-c-relay: an instant agent on %s\n", argv[7]);
    serve_agent(argv[7]);
    return 0;
  }
  pthread_t threads[3];
  pthread_create(&threads[0], NULL, router, NULL);
  pthread_create(&threads[1], NULL, sender, NULL);
  pthread_create(&threads[2], NULL, agent, NULL);
  fprintf(stderr, "pipeline-c-relay: running\n");
  pthread_join(threads[0], NULL);
  return 0;
}
