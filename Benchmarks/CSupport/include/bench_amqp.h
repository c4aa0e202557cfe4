// What the C baselines share: opening a connection with one channel, and
// failing loudly. Kept tiny so each baseline still reads as a plain loop.
#ifndef BENCH_AMQP_H
#define BENCH_AMQP_H
#include <amqp.h>

/// Prints "<program>: <what> failed" and exits 1.
void bench_die(const char *program, const char *what);

/// A connection to HOST:PORT/VHOST (plain AMQP, PLAIN login, no heartbeats)
/// with channel 1 open; exits through bench_die on any failure.
amqp_connection_state_t bench_open(const char *program, const char *host, int port, const char *user,
                                   const char *password, const char *vhost);
/// Reads `count` messages from a stream consumer on `c` (channel 1), acking each.
void bench_read_stream(const char *program, amqp_connection_state_t c, int count);
#endif
