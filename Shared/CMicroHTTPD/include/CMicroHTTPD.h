#ifndef C_MICROHTTPD_SHIM_H
#define C_MICROHTTPD_SHIM_H

#include <stddef.h>
#include <stdint.h>

/// An HTTP server on libmicrohttpd: its own polling thread (epoll), every
/// connection handled concurrently, idle ones closed after `timeout_s`.
typedef struct fd_http_server fd_http_server;

/// What the handler answers; set once with fd_http_answer_set.
typedef struct fd_http_answer fd_http_answer;

/// Called on the server's thread for each complete request. It must not block.
typedef void (*fd_http_handler)(void *context, const char *method, const char *path, fd_http_answer *answer);

/// Starts serving on host:port (port 0: any free one; read it back with
/// fd_http_port). A connection idle for `timeout_s`, or open longer than
/// `max_age_s` whatever it sends, is closed. NULL on failure, with a reason
/// in `error`.
fd_http_server *fd_http_start(const char *host, uint16_t port, unsigned timeout_s, unsigned max_age_s, unsigned max_connections,
                              fd_http_handler handler, void *context, char *error, size_t error_len);

uint16_t fd_http_port(const fd_http_server *server);

/// Stops the server: no handler runs after it returns.
void fd_http_stop(fd_http_server *server);

/// The answer: status, content type and body (copied).
void fd_http_answer_set(fd_http_answer *answer, unsigned status, const char *content_type, const void *body, size_t length);

#endif
