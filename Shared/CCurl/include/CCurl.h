#ifndef C_CURL_SHIM_H
#define C_CURL_SHIM_H

#include <stddef.h>
#include <stdint.h>

/// An HTTP/2 client on libcurl (nghttp2): one thread of its own runs a
/// multi handle; requests to one host share one kept-alive connection as
/// multiplexed streams. TLS verifies the peer and host name against the
/// system's trust store, or `ca_file` when given.
typedef struct fd_h2_client fd_h2_client;

/// Called on the client's thread when a request ends: the HTTP status (0 when
/// none came), the response body, the seconds of the answer's `Retry-After`
/// (a number or an HTTP date; 0 when none or unreadable), or an error (then
/// status 0).
typedef void (*fd_h2_done)(void *context, uint64_t request_id, long status, const char *body, size_t body_length,
                           int64_t retry_after_s, const char *error);

fd_h2_client *fd_h2_start(const char *ca_file, fd_h2_done done, void *context, char *error, size_t error_len);

/// Queues a POST (copies everything). `headers`: "Name: value" lines. 0 when the client is stopped.
int fd_h2_post(fd_h2_client *client, uint64_t request_id, const char *url, const char *const *headers, size_t header_count,
               const void *body, size_t body_length, long timeout_ms);

/// Stops the thread; requests not finished end with an error first.
void fd_h2_stop(fd_h2_client *client);

#endif
