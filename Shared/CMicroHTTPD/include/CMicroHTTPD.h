#ifndef C_MICROHTTPD_SHIM_H
#define C_MICROHTTPD_SHIM_H

#include <stddef.h>
#include <stdint.h>

/// An HTTP server on libmicrohttpd: its own polling thread (epoll), every
/// connection handled concurrently, idle ones closed after `timeout_s`
/// (the probes and the gateway).
typedef struct fd_http_server fd_http_server;

uint16_t fd_http_port(const fd_http_server *server);

/// The most memory all streams' buffers may hold together (0: no limit, the
/// default): over it, the stream whose client has taken nothing for longest
/// is cut off (its buffer freed), so clients that stop reading cannot take
/// together the memory each alone may not.
void fd_http_set_stream_budget(fd_http_server *server, size_t bytes);

/// The memory all streams' buffers hold now (what waits for their clients
/// beyond what the kernel holds, in buffers grown by doubling).
size_t fd_http_stream_bytes(fd_http_server *server);

/// Stops the server: no handler runs after it returns.
void fd_http_stop(fd_http_server *server);

/// Requests are answered asynchronously: the handler is called on the
/// server's thread once a request (with its body) is complete, copies what it
/// needs, and answers later from any thread; the connection is suspended
/// meanwhile, so a request that waits holds no thread and delays no other.
typedef struct fd_request fd_request;

/// A response written piece by piece (server-sent events), from any thread.
typedef struct fd_stream fd_stream;

typedef void (*fd_async_handler)(void *context, fd_request *request);

/// An answer decided from a request's head: its status, JSON body
/// (`body_length` bytes) and one more header (each malloc'd, freed by the
/// server; the header's name and value may be NULL).
typedef struct fd_refusal {
    unsigned status;
    char *body;
    size_t body_length;
    char *header_name, *header_value;
} fd_refusal;

/// Asked, on the server's thread, about each request's head (method, path,
/// headers; no body) as soon as it is in: 1 with `refusal` filled to answer
/// that instead of the handler (a request without its credentials) once its
/// body is read, or at once with a body over the limit instead of the 413;
/// 0 to go on. Must not block.
typedef int (*fd_head_check)(void *context, fd_request *request, fd_refusal *refusal);

/// Starts serving on host:port (port 0: any free one; read it back with
/// fd_http_port); NULL on failure, with a reason in `error`. Bodies over `max_body` are answered 413 at
/// once, without the handler (or as `head_check` says, when given). A connection still reading a request
/// `max_age_s` after it opened, or after its last response, is closed.
/// `memory_limit`: each connection's pool, which a request head must fit in. `require_host`: a request
/// without exactly one Host header (HTTP/1.0 may have none) that the head check let through is answered
/// 400 `invalid_request`.
fd_http_server *fd_http_start_async(const char *host, uint16_t port, unsigned timeout_s, unsigned max_age_s,
                                    unsigned max_connections, size_t max_body, size_t memory_limit,
                                    fd_async_handler handler, fd_head_check head_check, int require_host,
                                    void *context, char *error, size_t error_len);

/// What the handler may read, on the server's thread, during its call only.
const char *fd_request_method(const fd_request *request);
const char *fd_request_path(const fd_request *request);
/// A header's value, or NULL.
const char *fd_request_header(fd_request *request, const char *name);
/// A query argument, decoded, or NULL; its length in `length` (a "%00" in it is a NUL, not its end).
const char *fd_request_query(fd_request *request, const char *name, size_t *length);
const void *fd_request_body(const fd_request *request, size_t *length);

/// Answers once (copies the body). `extra` is one more header line's name
/// and value, or NULLs. From any thread.
void fd_request_answer(fd_request *request, unsigned status, const char *content_type, const void *body, size_t length,
                       const char *extra_name, const char *extra_value);

/// Answers with a stream; write to it with fd_stream_write. NULL if the
/// client is gone. The caller releases the stream with fd_stream_release.
fd_stream *fd_request_answer_stream(fd_request *request, unsigned status, const char *content_type);

/// The caller's reference to the request, given up after answering.
void fd_request_release(fd_request *request);

/// Appends to the stream (and ends it when `end`); 0 when the client is gone
/// or reads too slowly (more than `limit` bytes waiting): stop writing then.
int fd_stream_write(fd_stream *stream, const void *bytes, size_t length, int end, size_t limit);

/// 1 when the stream's client has closed its side (or the stream is over):
/// the stream is then ended. A stream's client sends nothing after its
/// request, so a FIN or a reset waiting on the socket says it went; a
/// suspended connection is not read by libmicrohttpd, which would otherwise
/// notice only at the next write.
int fd_stream_client_gone(fd_stream *stream);

void fd_stream_release(fd_stream *stream);

#endif
