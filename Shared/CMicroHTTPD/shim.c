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
#include <time.h>

/// One open connection, for the sweeper: libmicrohttpd's timeout is an idle
/// timeout, which a client dripping a byte a second never reaches.
struct fd_conn {
    int fd;
    struct timespec started;
    int shut;
    struct fd_conn *prev, *next;
};

struct fd_http_server {
    struct MHD_Daemon *daemon;
    fd_http_handler handler;
    void *context;
    uint16_t port;
    unsigned max_age_s;
    pthread_mutex_t lock;
    struct fd_conn *conns;
    pthread_t sweeper;
    int sweeping;
    int stopping;
};

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
        free(c);
        *socket_context = NULL;
    }
}

/// Every half second: a connection open longer than `max_age_s` is shut
/// down, whatever it sends; libmicrohttpd then sees it end and closes it.
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
            if (!c->shut && seconds_since(&c->started) > (double)server->max_age_s) {
                shutdown(c->fd, SHUT_RDWR);
                c->shut = 1;
            }
        }
        pthread_mutex_unlock(&server->lock);
    }
}

struct fd_http_answer {
    unsigned status;
    struct MHD_Response *response;
};

/// Requests to the probes carry no body: a marker for "headers seen".
static int request_started;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)version;
    (void)upload_data;
    fd_http_server *server = cls;
    if (*con_cls == NULL) {
        *con_cls = &request_started;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {  // a body is not read: skip it
        *upload_data_size = 0;
        return MHD_YES;
    }
    fd_http_answer answer = {0, NULL};
    server->handler(server->context, method, url, &answer);
    if (answer.response == NULL) {
        answer.status = 500;
        answer.response = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (answer.response == NULL) return MHD_NO;
    }
    enum MHD_Result queued = MHD_queue_response(connection, answer.status, answer.response);
    MHD_destroy_response(answer.response);
    return queued;
}

void fd_http_answer_set(fd_http_answer *answer, unsigned status, const char *content_type, const void *body, size_t length) {
    if (answer->response != NULL) MHD_destroy_response(answer->response);
    answer->status = status;
    answer->response = MHD_create_response_from_buffer(length, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (answer->response != NULL) {
        MHD_add_response_header(answer->response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        MHD_add_response_header(answer->response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    }
}

fd_http_server *fd_http_start(const char *host, uint16_t port, unsigned timeout_s, unsigned max_age_s, unsigned max_connections,
                              fd_http_handler handler, void *context, char *error, size_t error_len) {
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
    server->handler = handler;
    server->context = context;
    server->max_age_s = max_age_s;
    pthread_mutex_init(&server->lock, NULL);
    server->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_TURBO, port, NULL, NULL, on_request, server,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)max_connections,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)16384,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, server,
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

void fd_http_stop(fd_http_server *server) {
    if (server == NULL) return;
    pthread_mutex_lock(&server->lock);
    server->stopping = 1;
    pthread_mutex_unlock(&server->lock);
    if (server->sweeping) pthread_join(server->sweeper, NULL);
    MHD_stop_daemon(server->daemon);  // closes what is open, through on_connection
    pthread_mutex_destroy(&server->lock);
    free(server);
}
