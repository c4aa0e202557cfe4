#include "CMicroHTTPD.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/// One open connection, for the sweeper: libmicrohttpd's timeout is an idle
/// timeout, which a client dripping a byte a second never reaches.
struct fd_conn {
    int fd;
    /// When it opened, or last finished a response: how long it has been reading a request.
    struct timespec started;
    /// Between a complete request and the end of its response the age limit does not apply
    /// (a request may wait for an event, a stream lasts as long as the client reads it).
    int responding;
    int suspended;
    struct MHD_Connection *connection;
    int shut;
    /// The path of the request being read, as sent (before libmicrohttpd
    /// decodes it): `a%2Fb` is one segment, not two.
    char *raw_path;
    struct fd_conn *prev, *next;
};

struct fd_http_server {
    struct MHD_Daemon *daemon;
    fd_async_handler async_handler;
    fd_head_check head_check;
    /// Refuse a request without exactly one Host (set at start, never changed).
    int require_host;
    /// Every stream whose response is alive, and the memory their buffers
    /// hold together; over `stream_budget` (0: none), the stream that has
    /// waited longest for its client is cut.
    struct fd_stream *streams;
    size_t stream_bytes, stream_budget;
    size_t max_body;
    void *context;
    uint16_t port;
    unsigned max_age_s;
    pthread_mutex_t lock;
    struct fd_conn *conns;
    pthread_t sweeper;
    int sweeping;
    int stopping;
    /// The owner's, and one for each request and stream alive: answers may
    /// come (and be dropped) after the server stopped.
    int refs;
};

static void server_unref(fd_http_server *server) {
    pthread_mutex_lock(&server->lock);
    int left = --server->refs;
    pthread_mutex_unlock(&server->lock);
    if (left > 0) return;
    pthread_mutex_destroy(&server->lock);
    free(server);
}

static double seconds_since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

/// Notes each connection as it opens and forgets it as it closes (before its
/// descriptor is closed, so the sweeper never touches a reused one).
static void on_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    fd_http_server *server = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct fd_conn *c = calloc(1, sizeof *c);
        if (c == NULL || info == NULL) {
            free(c);
            return;
        }
        c->fd = info->connect_fd;
        c->connection = connection;
        clock_gettime(CLOCK_MONOTONIC, &c->started);
        pthread_mutex_lock(&server->lock);
        c->next = server->conns;
        if (server->conns) server->conns->prev = c;
        server->conns = c;
        pthread_mutex_unlock(&server->lock);
        *socket_context = c;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct fd_conn *c = *socket_context;
        if (c == NULL) return;
        pthread_mutex_lock(&server->lock);
        if (c->prev) c->prev->next = c->next; else server->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        pthread_mutex_unlock(&server->lock);
        free(c->raw_path);
        free(c);
        *socket_context = NULL;
    }
}

/// Every half second: a connection that has been reading a request for
/// longer than `max_age_s` (since it opened, or since its last response) is
/// shut down, whatever it sends; libmicrohttpd then sees it end and closes it.
static void *sweep(void *arg) {
    fd_http_server *server = arg;
    for (;;) {
        struct timespec pause = {0, 500 * 1000 * 1000};
        nanosleep(&pause, NULL);
        pthread_mutex_lock(&server->lock);
        if (server->stopping) {
            pthread_mutex_unlock(&server->lock);
            return NULL;
        }
        for (struct fd_conn *c = server->conns; c != NULL; c = c->next) {
            if (!c->shut && !c->responding && seconds_since(&c->started) > (double)server->max_age_s) {
                shutdown(c->fd, SHUT_RDWR);
                c->shut = 1;
            }
        }
        pthread_mutex_unlock(&server->lock);
    }
}

// MARK: Asynchronous requests and streams
//
// Every field below that two threads touch is guarded by the server's lock:
// a request or stream is answered or written from any thread, while the
// server's thread reads it, suspends and resumes its connection.

/// REQUEST_OVERSIZED: a body without a Content-Length grew past the limit.
/// libmicrohttpd takes a response only before the body or after all of it,
/// so the rest is read and dropped (up to `oversized_cap`), then 413.
enum { REQUEST_READING, REQUEST_OVERSIZED, REQUEST_WAITING, REQUEST_ANSWERED, REQUEST_QUEUED };

/// The most of an oversized body read past the limit before the connection
/// is dropped without an answer: a client that never ends its body gets no 413.
static size_t oversized_cap(const fd_http_server *server) { return server->max_body + 1024 * 1024; }

struct fd_request {
    fd_http_server *server;
    struct MHD_Connection *connection;
    struct fd_conn *conn;
    char *method, *path;
    char *body;
    size_t length, capacity;
    int state;
    /// The response libmicrohttpd ended (the connection closed or the daemon stopped).
    int closed;
    /// One for libmicrohttpd (until completed), one for the handler (until released).
    int refs;
    unsigned status;
    struct MHD_Response *response;
    /// The owner's answer to its head (`head_check`), given once its body is
    /// read (or at once, with a body over the limit) instead of the handler's.
    int refused;
    fd_refusal refusal;
};

struct fd_stream {
    fd_http_server *server;
    struct MHD_Connection *connection;
    struct fd_conn *conn;
    char *buffer;
    size_t length, offset, capacity;
    int ended;
    int closed;
    int refs;
    /// On the server's list while its response is alive (for the budget).
    int listed;
    struct fd_stream *prev, *next;
    /// Since when its client has taken nothing of what waits for it (set when
    /// its queue goes from empty to not, and at each piece the client takes).
    struct timespec waiting_since;
};

static struct fd_conn *conn_of(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info != NULL ? (struct fd_conn *)info->socket_context : NULL;
}

/// Under the lock: the connection's handling stops until `resume`.
static void suspend(struct fd_conn *c, struct MHD_Connection *connection) {
    if (c != NULL) c->suspended = 1;
    MHD_suspend_connection(connection);
}

/// Under the lock: resumes the connection if it is suspended (never twice).
static void resume(fd_http_server *server, struct fd_conn *c) {
    if (c != NULL && c->suspended && !server->stopping) {
        c->suspended = 0;
        MHD_resume_connection(c->connection);
    }
}

static void refusal_free(fd_refusal *refusal) {
    free(refusal->body);
    free(refusal->header_name);
    free(refusal->header_value);
}

static void request_unref(fd_request *request) {
    fd_http_server *server = request->server;
    pthread_mutex_lock(&server->lock);
    int left = --request->refs;
    pthread_mutex_unlock(&server->lock);
    if (left > 0) return;
    if (request->response != NULL) MHD_destroy_response(request->response);
    free(request->method);
    free(request->path);
    free(request->body);
    refusal_free(&request->refusal);
    free(request);
    server_unref(server);
}

static void stream_unref(fd_stream *stream) {
    fd_http_server *server = stream->server;
    pthread_mutex_lock(&server->lock);
    int left = --stream->refs;
    pthread_mutex_unlock(&server->lock);
    if (left > 0) return;
    free(stream->buffer);
    free(stream);
    server_unref(server);
}

static void server_ref(fd_http_server *server) {
    pthread_mutex_lock(&server->lock);
    server->refs += 1;
    pthread_mutex_unlock(&server->lock);
}

static const char too_large_body[] = "{\"error\":{\"code\":\"too_large\",\"message\":\"the body is over the limit\"}}";

static enum MHD_Result queue_too_large(struct MHD_Connection *connection) {
    struct MHD_Response *response =
        MHD_create_response_from_buffer(sizeof too_large_body - 1, (void *)too_large_body, MHD_RESPMEM_PERSISTENT);
    if (response == NULL) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result queued = MHD_queue_response(connection, 413, response);
    MHD_destroy_response(response);
    return queued;
}

static const char host_body[] =
    "{\"error\":{\"code\":\"invalid_request\",\"message\":\"a request needs one Host header (HTTP/1.0: at most one)\"}}";

static int is_http10(const char *version) { return version != NULL && strcmp(version, MHD_HTTP_VERSION_1_0) == 0; }

static enum MHD_Result count_host(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    (void)value;
    if (key == NULL) return MHD_YES;
    // Not pedantic, libmicrohttpd keeps "Host : x" as the name "Host ": a proxy that trims it sees a Host too.
    size_t length = strlen(key);
    while (length > 0 && (key[length - 1] == ' ' || key[length - 1] == '\t')) length -= 1;
    if (length == 4 && strncasecmp(key, MHD_HTTP_HEADER_HOST, 4) == 0) *(unsigned *)cls += 1;
    return MHD_YES;
}

/// RFC 9112 §3.2 (when the server requires it): a request with more than
/// one Host header, or an HTTP/1.1 request with none, is answered 400, and its connection closed
/// (libmicrohttpd serves it unless pedantic, and then answers in HTML). Any
/// HTTP/1.x but 1.0 counts as 1.1, as libmicrohttpd serves it. 1 when it was
/// refused, -1 out of memory.
static int refuse_bad_host(fd_request *request, const char *version) {
    unsigned hosts = 0;
    MHD_get_connection_values(request->connection, MHD_HEADER_KIND, count_host, &hosts);
    int http11 = version != NULL && strncmp(version, "HTTP/1.", 7) == 0 && !is_http10(version);
    if (hosts == 1 || (hosts == 0 && !http11)) return 0;
    char *body = strdup(host_body), *name = strdup(MHD_HTTP_HEADER_CONNECTION), *value = strdup("close");
    if (body == NULL || name == NULL || value == NULL) {
        free(body);
        free(name);
        free(value);
        return -1;
    }
    request->refused = 1;
    request->refusal = (fd_refusal){400, body, sizeof host_body - 1, name, value};
    return 1;
}

/// Asks the owner about the request's head (on its first call): a refusal
/// (say, a 401 for a request without a valid token) is kept for the answer.
static void check_head(fd_request *request) {
    fd_http_server *server = request->server;
    if (server->head_check == NULL) return;
    fd_refusal refusal = {0, NULL, 0, NULL, NULL};
    if (server->head_check(server->context, request, &refusal) == 1) {
        request->refused = 1;
        request->refusal = refusal;  // freed with the request
    } else {
        refusal_free(&refusal);
    }
}

/// A whole answer (body copied) with the headers every answer carries, and one more when given.
static struct MHD_Response *answer_response(const char *content_type, const void *body, size_t length, const char *extra_name,
                                            const char *extra_value) {
    struct MHD_Response *response = MHD_create_response_from_buffer(length, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (response != NULL) {
        if (content_type != NULL) MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
        MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
        if (extra_name != NULL && extra_value != NULL) MHD_add_response_header(response, extra_name, extra_value);
    }
    return response;
}

/// Queues the kept refusal. `unread`: the body was not (all) read, so the
/// connection closes after it.
static enum MHD_Result queue_refusal(fd_request *request, int unread) {
    const fd_refusal *refusal = &request->refusal;
    unsigned status = refusal->status >= 400 && refusal->status <= 599 ? refusal->status : 500;
    struct MHD_Response *response =
        answer_response("application/json", refusal->body != NULL ? refusal->body : "", refusal->body != NULL ? refusal->body_length : 0,
                        refusal->header_name, refusal->header_value);
    if (response == NULL) return MHD_NO;
    int closes = refusal->header_name != NULL && strcasecmp(refusal->header_name, MHD_HTTP_HEADER_CONNECTION) == 0;
    if (unread && !closes) MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result queued = MHD_queue_response(request->connection, status, response);
    MHD_destroy_response(response);
    return queued;
}

/// A body over the limit: the owner's refusal if it has one for this head
/// (a request without its credentials gets the answer any other would),
/// else 413. The connection closes: the rest of the body is not read.
static enum MHD_Result queue_over_limit(fd_request *request) {
    request->state = REQUEST_QUEUED;
    return request->refused ? queue_refusal(request, 1) : queue_too_large(request->connection);
}

/// Called with each request's URI as sent, before it is decoded: its path
/// is kept for the request (on the connection's thread, like the handler).
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *connection) {
    (void)cls;
    struct fd_conn *c = conn_of(connection);
    if (c != NULL && uri != NULL) {
        free(c->raw_path);
        c->raw_path = strndup(uri, strcspn(uri, "?"));
    }
    return NULL;
}

static enum MHD_Result on_async_request(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                                        const char *version, const char *upload_data, size_t *upload_data_size,
                                        void **con_cls) {
    fd_http_server *server = cls;
    fd_request *request = *con_cls;
    if (request == NULL) {
        request = calloc(1, sizeof *request);
        if (request == NULL) return MHD_NO;
        request->server = server;
        request->connection = connection;
        request->conn = conn_of(connection);
        request->method = strdup(method);
        // The path as sent: segments are decoded by the handler, one by one (never the decoded `url`:
        // decoded twice, %252F would become a '/'; without it, the request is refused below).
        (void)url;
        request->path = request->conn != NULL && request->conn->raw_path != NULL ? strdup(request->conn->raw_path) : NULL;
        request->refs = 1;
        server_ref(server);
        *con_cls = request;
        // An untracked connection (out of memory when it opened) could never be resumed: refused.
        if (request->method == NULL || request->path == NULL || request->conn == NULL) return MHD_NO;
        // The owner's refusal (a 401) first: its answers do not depend on how the head is written.
        check_head(request);
        if (!request->refused && server->require_host && refuse_bad_host(request, version) < 0) return MHD_NO;
        // A client that waits for "100 Continue" before its body gets the refusal instead, at once:
        // no body is sent to be read and dropped. (Not HTTP/1.0: no 100 is sent to it, so it does not wait.)
        if (request->refused && !is_http10(version)) {
            const char *expect = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
            if (expect != NULL && strcasecmp(expect, "100-continue") == 0) {
                request->state = REQUEST_QUEUED;
                return queue_refusal(request, 1);
            }
        }
        const char *declared = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (declared != NULL && strtoull(declared, NULL, 10) > server->max_body) return queue_over_limit(request);
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        size_t size = *upload_data_size;
        *upload_data_size = 0;
        if (request->state == REQUEST_OVERSIZED) {
            request->length += size;
            return request->length > oversized_cap(server) ? MHD_NO : MHD_YES;
        }
        if (request->state != REQUEST_READING) return MHD_YES;  // answered already: the rest is dropped
        if (request->refused) {  // its answer is known: the body is only counted, never kept
            request->length += size;
            if (request->length > server->max_body) request->state = REQUEST_OVERSIZED;
            return MHD_YES;
        }
        if (request->length + size > server->max_body) {
            request->state = REQUEST_OVERSIZED;
            request->length += size;
            free(request->body);
            request->body = NULL;
            request->capacity = 0;
            return MHD_YES;
        }
        if (request->length + size > request->capacity) {
            size_t capacity = request->capacity ? request->capacity : 1024;
            while (capacity < request->length + size) capacity *= 2;
            char *grown = realloc(request->body, capacity);
            if (grown == NULL) return MHD_NO;
            request->body = grown;
            request->capacity = capacity;
        }
        memcpy(request->body + request->length, upload_data, size);
        request->length += size;
        return MHD_YES;
    }
    if (request->state == REQUEST_OVERSIZED) return queue_over_limit(request);  // the whole body is in: now the answer can go
    if (request->refused && request->state == REQUEST_READING) {  // read whole: answered without the handler
        request->state = REQUEST_QUEUED;
        return queue_refusal(request, 0);
    }
    pthread_mutex_lock(&server->lock);
    if (server->stopping) {
        pthread_mutex_unlock(&server->lock);
        return MHD_NO;
    }
    if (request->state == REQUEST_READING) {
        request->state = REQUEST_WAITING;
        request->refs += 1;  // the handler's, until fd_request_release
        if (request->conn != NULL) request->conn->responding = 1;
        pthread_mutex_unlock(&server->lock);
        server->async_handler(server->context, request);
        pthread_mutex_lock(&server->lock);
    }
    if (request->state == REQUEST_ANSWERED) {
        struct MHD_Response *response = request->response;
        request->response = NULL;
        request->state = REQUEST_QUEUED;
        pthread_mutex_unlock(&server->lock);
        enum MHD_Result queued = MHD_queue_response(connection, request->status, response);
        MHD_destroy_response(response);
        return queued;
    }
    if (request->state == REQUEST_WAITING) {
        if (server->stopping) {  // fd_http_stop has resumed what was suspended: suspend nothing more
            pthread_mutex_unlock(&server->lock);
            return MHD_NO;
        }
        suspend(request->conn, connection);
        pthread_mutex_unlock(&server->lock);
        return MHD_YES;
    }
    pthread_mutex_unlock(&server->lock);
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    fd_http_server *server = cls;
    fd_request *request = *con_cls;
    *con_cls = NULL;
    struct fd_conn *c = conn_of(connection);
    pthread_mutex_lock(&server->lock);
    if (c != NULL) {
        c->responding = 0;  // reading the next request, if any: the age limit counts again
        clock_gettime(CLOCK_MONOTONIC, &c->started);
    }
    if (request != NULL) request->closed = 1;
    pthread_mutex_unlock(&server->lock);
    if (request != NULL) request_unref(request);
}

const char *fd_request_method(const fd_request *request) { return request->method; }
const char *fd_request_path(const fd_request *request) { return request->path; }

const char *fd_request_header(fd_request *request, const char *name) {
    return MHD_lookup_connection_value(request->connection, MHD_HEADER_KIND, name);
}

const char *fd_request_query(fd_request *request, const char *name, size_t *length) {
    const char *value = NULL;
    size_t size = 0;
    if (MHD_lookup_connection_value_n(request->connection, MHD_GET_ARGUMENT_KIND, name, strlen(name), &value, &size) != MHD_YES) return NULL;
    *length = value ? size : 0;
    return value ? value : "";
}

const void *fd_request_body(const fd_request *request, size_t *length) {
    // None kept (an oversized body is dropped as it comes, its length still counted): nothing to read.
    *length = request->body != NULL ? request->length : 0;
    return request->body != NULL ? request->body : "";
}

/// Under the lock: hands `response` to the request and wakes its connection.
/// 0 if the request cannot take it: the caller destroys it, outside the lock
/// (a stream's free callback takes the lock).
static int answer_with(fd_request *request, unsigned status, struct MHD_Response *response) {
    if (request->closed || request->state != REQUEST_WAITING || response == NULL) return 0;
    request->status = status;
    request->response = response;
    request->state = REQUEST_ANSWERED;
    resume(request->server, request->conn);
    return 1;
}

void fd_request_answer(fd_request *request, unsigned status, const char *content_type, const void *body, size_t length,
                       const char *extra_name, const char *extra_value) {
    struct MHD_Response *response = answer_response(content_type, body, length, extra_name, extra_value);
    pthread_mutex_lock(&request->server->lock);
    int taken = answer_with(request, status, response);
    pthread_mutex_unlock(&request->server->lock);
    if (!taken && response != NULL) MHD_destroy_response(response);
}

/// Under the lock: the stream's buffer becomes `capacity` bytes (0: freed),
/// keeping what waits in it (which must fit), and the server's count follows.
/// 0 when memory is short (nothing changed).
static int stream_resize(fd_http_server *server, fd_stream *stream, size_t capacity) {
    if (stream->offset > 0 && stream->length > stream->offset) {
        memmove(stream->buffer, stream->buffer + stream->offset, stream->length - stream->offset);
    }
    stream->length -= stream->offset;
    stream->offset = 0;
    char *buffer = NULL;
    if (capacity > 0) {
        buffer = realloc(stream->buffer, capacity);
        if (buffer == NULL) return 0;
    } else {
        free(stream->buffer);
    }
    if (stream->listed) {
        server->stream_bytes -= stream->capacity;
        server->stream_bytes += capacity;
    }
    stream->buffer = buffer;
    stream->capacity = capacity;
    return 1;
}

static int earlier(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/// Under the lock: the client is cut off and what waited for it dropped,
/// its buffer freed at once; the response ends.
static void stream_cut(fd_http_server *server, fd_stream *stream) {
    if (stream->conn != NULL && !stream->conn->shut) {
        shutdown(stream->conn->fd, SHUT_RDWR);
        stream->conn->shut = 1;
    }
    stream->offset = stream->length = 0;
    stream_resize(server, stream, 0);
    stream->ended = 1;
    resume(server, stream->conn);
}

/// Under the lock: while the streams' buffers hold more than the budget,
/// the stream whose client has taken nothing for longest (one that stopped
/// reading, not one that is being sent a long history) is cut.
static void enforce_budget(fd_http_server *server) {
    if (server->stream_budget == 0 || server->stream_bytes <= server->stream_budget) return;
    // First what no client waits for: idle buffers (4 KiB at most each) are freed, no stream cut.
    for (fd_stream *t = server->streams; t != NULL; t = t->next) {
        if (t->length == t->offset && t->capacity > 0) stream_resize(server, t, 0);
    }
    while (server->stream_bytes > server->stream_budget) {
        fd_stream *oldest = NULL;
        for (fd_stream *t = server->streams; t != NULL; t = t->next) {
            if (t->length > t->offset && (oldest == NULL || earlier(&t->waiting_since, &oldest->waiting_since))) oldest = t;
        }
        if (oldest == NULL) return;
        stream_cut(server, oldest);
    }
}

static ssize_t stream_read(void *cls, uint64_t position, char *out, size_t max) {
    (void)position;
    fd_stream *stream = cls;
    fd_http_server *server = stream->server;
    pthread_mutex_lock(&server->lock);
    if (server->stopping) {
        pthread_mutex_unlock(&server->lock);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (stream->offset < stream->length) {
        size_t n = stream->length - stream->offset;
        if (n > max) n = max;
        memcpy(out, stream->buffer + stream->offset, n);
        stream->offset += n;
        clock_gettime(CLOCK_MONOTONIC, &stream->waiting_since);  // the client takes: it is not the one to cut
        size_t left = stream->length - stream->offset;
        if (left == 0) stream->offset = stream->length = 0;
        // All sent: the buffer is kept only if small (a stream mostly waits idle, and idle buffers
        // count against the budget too). Mostly sent: not kept at its largest.
        if (left == 0 && stream->capacity > (4u << 10)) {
            stream_resize(server, stream, 0);
        } else if (stream->capacity > (64u << 10) && left <= stream->capacity / 4) {
            stream_resize(server, stream, stream->capacity / 2);
        }
        pthread_mutex_unlock(&server->lock);
        return (ssize_t)n;
    }
    if (stream->ended) {
        pthread_mutex_unlock(&server->lock);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    suspend(stream->conn, stream->connection);  // until the next write
    pthread_mutex_unlock(&server->lock);
    return 0;
}

static void stream_closed(void *cls) {
    fd_stream *stream = cls;
    fd_http_server *server = stream->server;
    pthread_mutex_lock(&server->lock);
    stream->closed = 1;
    stream->offset = stream->length = 0;
    stream_resize(server, stream, 0);  // nothing more is read or written
    if (stream->listed) {
        if (stream->prev) stream->prev->next = stream->next; else server->streams = stream->next;
        if (stream->next) stream->next->prev = stream->prev;
        stream->prev = stream->next = NULL;
        stream->listed = 0;
    }
    pthread_mutex_unlock(&server->lock);
    stream_unref(stream);
}

fd_stream *fd_request_answer_stream(fd_request *request, unsigned status, const char *content_type) {
    fd_stream *stream = calloc(1, sizeof *stream);
    if (stream == NULL) return NULL;
    stream->server = request->server;
    stream->connection = request->connection;
    stream->conn = request->conn;
    stream->refs = 2;  // the response's and the caller's
    server_ref(stream->server);
    struct MHD_Response *response = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, stream, stream_closed);
    if (response == NULL) {
        free(stream);
        server_unref(request->server);
        return NULL;
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(response, "X-Accel-Buffering", "no");
    fd_http_server *server = request->server;
    pthread_mutex_lock(&server->lock);
    int taken = answer_with(request, status, response);
    if (taken) {
        stream->listed = 1;
        stream->next = server->streams;
        if (server->streams) server->streams->prev = stream;
        server->streams = stream;
    }
    pthread_mutex_unlock(&server->lock);
    if (!taken) {
        MHD_destroy_response(response);  // its callback drops the response's reference
        fd_stream_release(stream);
        return NULL;
    }
    return stream;
}

void fd_request_release(fd_request *request) { request_unref(request); }

int fd_stream_write(fd_stream *stream, const void *bytes, size_t length, int end, size_t limit) {
    fd_http_server *server = stream->server;
    pthread_mutex_lock(&server->lock);
    // Ended (cut off, or its last write made): nothing more goes.
    if (stream->closed || server->stopping || stream->ended) {
        pthread_mutex_unlock(&server->lock);
        return 0;
    }
    if (stream->length - stream->offset + length > limit) {
        // A client that does not read: it is cut off, the others go on.
        stream_cut(server, stream);
        pthread_mutex_unlock(&server->lock);
        return 0;
    }
    if (stream->length + length > stream->capacity) {
        size_t waiting = stream->length - stream->offset;
        size_t capacity = stream->capacity ? stream->capacity : 1024;
        while (capacity < waiting + length) capacity *= 2;
        if (!stream_resize(server, stream, capacity)) {
            // Memory short: end it; what is queued goes out, then the connection closes.
            stream->ended = 1;
            resume(server, stream->conn);
            pthread_mutex_unlock(&server->lock);
            return 0;
        }
    }
    if (length > 0) {
        if (stream->length == stream->offset) clock_gettime(CLOCK_MONOTONIC, &stream->waiting_since);
        memcpy(stream->buffer + stream->length, bytes, length);
        stream->length += length;
    }
    if (stream->listed) {
        enforce_budget(server);
        if (stream->ended) {  // cut for the budget just now
            pthread_mutex_unlock(&server->lock);
            return 0;
        }
    }
    if (end) stream->ended = 1;
    resume(server, stream->conn);
    pthread_mutex_unlock(&server->lock);
    return 1;
}

int fd_stream_client_gone(fd_stream *stream) {
    fd_http_server *server = stream->server;
    pthread_mutex_lock(&server->lock);
    int gone = stream->closed || stream->ended || server->stopping || stream->conn == NULL || stream->conn->shut;
    if (!gone) {
        char byte;
        ssize_t n = recv(stream->conn->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        if (gone) {  // closed here: libmicrohttpd lets the connection go when it resumes
            shutdown(stream->conn->fd, SHUT_RDWR);
            stream->conn->shut = 1;
            stream->ended = 1;
            resume(server, stream->conn);
        }
    }
    pthread_mutex_unlock(&server->lock);
    return gone;
}

void fd_stream_release(fd_stream *stream) {
    if (stream != NULL) stream_unref(stream);
}

fd_http_server *fd_http_start_async(const char *host, uint16_t port, unsigned timeout_s, unsigned max_age_s,
                                    unsigned max_connections, size_t max_body, size_t memory_limit,
                                    fd_async_handler async_handler, fd_head_check head_check, int require_host,
                                    void *context, char *error, size_t error_len) {
    struct sockaddr_in address;
    memset(&address, 0, sizeof address);
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    if (inet_pton(AF_INET, host, &address.sin_addr) != 1) {
        snprintf(error, error_len, "'%s' is not an IPv4 address", host);
        return NULL;
    }
    // The listening socket is made here, with SO_REUSEADDR only: a port
    // whose last connections linger in TIME_WAIT (a service restarted) can
    // be bound again, and a second server can still not share it.
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(error, error_len, "cannot create a socket: %s", strerror(errno));
        return NULL;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0 || listen(fd, 256) != 0) {
        snprintf(error, error_len, "cannot listen on %s:%u: %s", host, (unsigned)port, strerror(errno));
        close(fd);
        return NULL;
    }
    fd_http_server *server = calloc(1, sizeof *server);
    if (server == NULL) {
        snprintf(error, error_len, "out of memory");
        close(fd);
        return NULL;
    }
    server->async_handler = async_handler;
    server->head_check = head_check;
    server->require_host = require_host;
    server->max_body = max_body;
    server->context = context;
    server->max_age_s = max_age_s;
    server->refs = 1;
    pthread_mutex_init(&server->lock, NULL);
    server->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO | MHD_ALLOW_SUSPEND_RESUME, port, NULL, NULL,
        on_async_request, server,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)max_connections,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, memory_limit < 4096 ? (size_t)4096 : memory_limit,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, server,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, server,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, server,
        MHD_OPTION_END);
    if (server->daemon == NULL) {
        snprintf(error, error_len, "cannot serve on %s:%u", host, (unsigned)port);
        if (fcntl(fd, F_GETFD) != -1) close(fd);  // unless libmicrohttpd closed it already
        pthread_mutex_destroy(&server->lock);
        free(server);
        return NULL;
    }
    server->sweeping = pthread_create(&server->sweeper, NULL, sweep, server) == 0;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(server->daemon, MHD_DAEMON_INFO_BIND_PORT);
    server->port = info != NULL ? info->port : port;
    return server;
}

uint16_t fd_http_port(const fd_http_server *server) { return server->port; }

size_t fd_http_stream_bytes(fd_http_server *server) {
    pthread_mutex_lock(&server->lock);
    size_t bytes = server->stream_bytes;
    pthread_mutex_unlock(&server->lock);
    return bytes;
}

void fd_http_set_stream_budget(fd_http_server *server, size_t bytes) {
    pthread_mutex_lock(&server->lock);
    server->stream_budget = bytes;
    pthread_mutex_unlock(&server->lock);
}

void fd_http_stop(fd_http_server *server) {
    if (server == NULL) return;
    pthread_mutex_lock(&server->lock);
    server->stopping = 1;
    // libmicrohttpd stops only once every suspended connection is resumed:
    // they then see `stopping` and close.
    for (struct fd_conn *c = server->conns; c != NULL; c = c->next) {
        if (c->suspended) {
            c->suspended = 0;
            MHD_resume_connection(c->connection);
        }
    }
    pthread_mutex_unlock(&server->lock);
    if (server->sweeping) pthread_join(server->sweeper, NULL);
    MHD_stop_daemon(server->daemon);  // closes what is open, through on_connection
    server_unref(server);
}
