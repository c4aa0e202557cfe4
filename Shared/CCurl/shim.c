#include "CCurl.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/// One request: queued by fd_h2_post, then an easy handle on the multi.
struct request {
    uint64_t id;
    char *url;
    struct curl_slist *headers;
    char *body;
    size_t body_length;
    long timeout_ms;
    char *response;
    size_t response_length;
    char error[CURL_ERROR_SIZE];
    CURL *easy;
    struct request *next;
    struct request *prev_active, *next_active;  // on the multi
};

struct fd_h2_client {
    CURLM *multi;
    char *ca_file;
    fd_h2_done done;
    void *context;
    pthread_t thread;
    pthread_mutex_t lock;
    struct request *queued;  // FIFO, under lock
    struct request *queued_tail;
    int stopping;            // under lock
    struct request *active;  // the client thread's only
};

static size_t on_body(char *data, size_t size, size_t count, void *user) {
    struct request *r = user;
    size_t n = size * count;
    if (r->response_length + n > (1 << 20)) return 0;  // an answer over 1 MiB is no APNs answer
    char *grown = realloc(r->response, r->response_length + n + 1);
    if (grown == NULL) return 0;
    r->response = grown;
    memcpy(r->response + r->response_length, data, n);
    r->response_length += n;
    r->response[r->response_length] = 0;
    return n;
}

static void request_free(struct request *r) {
    if (r == NULL) return;
    curl_slist_free_all(r->headers);
    free(r->url);
    free(r->body);
    free(r->response);
    free(r);
}

static void start_request(fd_h2_client *c, struct request *r) {
    CURL *easy = curl_easy_init();
    if (easy == NULL) {
        c->done(c->context, r->id, 0, NULL, 0, 0, "cannot create a transfer");
        request_free(r);
        return;
    }
    r->easy = easy;
    curl_easy_setopt(easy, CURLOPT_URL, r->url);
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);  // wait to multiplex on the open connection
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long)r->body_length);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, r->error);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, r->timeout_ms);
    curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    // A connection that died without a word (a NAT's idle drop) is noticed, not waited on.
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 10L);
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "https,http");
    if (c->ca_file != NULL) curl_easy_setopt(easy, CURLOPT_CAINFO, c->ca_file);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, r);
    if (curl_multi_add_handle(c->multi, easy) != CURLM_OK) {
        curl_easy_cleanup(easy);
        c->done(c->context, r->id, 0, NULL, 0, 0, "cannot start the transfer");
        request_free(r);
        return;
    }
    r->next_active = c->active;
    if (c->active) c->active->prev_active = r;
    c->active = r;
}

static void finish(fd_h2_client *c, CURL *easy, CURLcode result) {
    struct request *r = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&r);
    long status = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
    curl_off_t retry_after = 0;  // libcurl reads both forms, and gives 0 for none or a malformed one
    if (curl_easy_getinfo(easy, CURLINFO_RETRY_AFTER, &retry_after) != CURLE_OK || retry_after < 0) retry_after = 0;
    curl_multi_remove_handle(c->multi, easy);
    curl_easy_cleanup(easy);
    if (r == NULL) return;
    if (r->prev_active) r->prev_active->next_active = r->next_active; else c->active = r->next_active;
    if (r->next_active) r->next_active->prev_active = r->prev_active;
    if (result == CURLE_OK) {
        c->done(c->context, r->id, status, r->response, r->response_length, (int64_t)retry_after, NULL);
    } else {
        const char *why = r->error[0] ? r->error : curl_easy_strerror(result);
        c->done(c->context, r->id, 0, NULL, 0, 0, why);
    }
    request_free(r);
}

static void *run(void *arg) {
    fd_h2_client *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        struct request *batch = c->queued;
        c->queued = c->queued_tail = NULL;
        int stopping = c->stopping;
        pthread_mutex_unlock(&c->lock);
        while (batch != NULL) {
            struct request *next = batch->next;
            batch->next = NULL;
            if (stopping) {
                c->done(c->context, batch->id, 0, NULL, 0, 0, "the client stopped");
                request_free(batch);
            } else {
                start_request(c, batch);
            }
            batch = next;
        }
        int running = 0;
        curl_multi_perform(c->multi, &running);
        CURLMsg *message;
        int left;
        while ((message = curl_multi_info_read(c->multi, &left)) != NULL) {
            if (message->msg == CURLMSG_DONE) finish(c, message->easy_handle, message->data.result);
        }
        if (stopping) {
            // What is still running ends with an error.
            while (c->active != NULL) finish(c, c->active->easy, CURLE_ABORTED_BY_CALLBACK);
            return NULL;
        }
        curl_multi_poll(c->multi, NULL, 0, 1000, NULL);
    }
}

static void global_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

fd_h2_client *fd_h2_start(const char *ca_file, fd_h2_done done, void *context, char *error, size_t error_len) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, global_init);
    curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    if (info == NULL || !(info->features & CURL_VERSION_HTTP2)) {
        snprintf(error, error_len, "this libcurl has no HTTP/2 (nghttp2)");
        return NULL;
    }
    fd_h2_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(error, error_len, "out of memory");
        return NULL;
    }
    c->multi = curl_multi_init();
    if (c->multi == NULL) {
        free(c);
        snprintf(error, error_len, "cannot create a multi handle");
        return NULL;
    }
    curl_multi_setopt(c->multi, CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
    curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 1L);  // one connection per host: APNs prefers few, long-lived
    c->ca_file = ca_file != NULL && ca_file[0] ? strdup(ca_file) : NULL;
    c->done = done;
    c->context = context;
    pthread_mutex_init(&c->lock, NULL);
    if (pthread_create(&c->thread, NULL, run, c) != 0) {
        curl_multi_cleanup(c->multi);
        pthread_mutex_destroy(&c->lock);
        free(c->ca_file);
        free(c);
        snprintf(error, error_len, "cannot start the client's thread");
        return NULL;
    }
    return c;
}

int fd_h2_post(fd_h2_client *c, uint64_t request_id, const char *url, const char *const *headers, size_t header_count,
               const void *body, size_t body_length, long timeout_ms) {
    struct request *r = calloc(1, sizeof *r);
    if (r == NULL) return 0;
    r->id = request_id;
    r->url = strdup(url);
    r->body = malloc(body_length + 1);
    r->body_length = body_length;
    r->timeout_ms = timeout_ms;
    if (r->url == NULL || r->body == NULL) {
        request_free(r);
        return 0;
    }
    memcpy(r->body, body, body_length);
    for (size_t i = 0; i < header_count; i++) {
        struct curl_slist *grown = curl_slist_append(r->headers, headers[i]);
        if (grown == NULL) {
            request_free(r);
            return 0;
        }
        r->headers = grown;
    }
    pthread_mutex_lock(&c->lock);
    if (c->stopping) {
        pthread_mutex_unlock(&c->lock);
        request_free(r);
        return 0;
    }
    if (c->queued_tail) c->queued_tail->next = r; else c->queued = r;
    c->queued_tail = r;
    pthread_mutex_unlock(&c->lock);
    curl_multi_wakeup(c->multi);
    return 1;
}

void fd_h2_stop(fd_h2_client *c) {
    if (c == NULL) return;
    pthread_mutex_lock(&c->lock);
    c->stopping = 1;
    pthread_mutex_unlock(&c->lock);
    curl_multi_wakeup(c->multi);
    pthread_join(c->thread, NULL);
    curl_multi_cleanup(c->multi);
    pthread_mutex_destroy(&c->lock);
    free(c->ca_file);
    free(c);
}
