/*
 * ratewise.Engine and ratewise.Transfer: HTTP transfers on one libcurl multi
 * handle.
 *
 * The engine never sleeps on its own account and never calls Lua from a
 * libcurl callback: the callbacks only append to C buffers owned by the
 * transfer, and everything Lua sees is built after libcurl has returned.
 * engine:poll(timeout) is the one place that waits, for socket activity or
 * the timeout, whichever comes first; the Lua layer decides when to call it.
 * Connections live in the multi handle's cache, so they are reused across
 * transfers. A transfer's record (its easy handle, its buffers, its error
 * text) lives in C memory and is recycled through a small pool, so that a
 * request leaves almost nothing for the Lua collector: the Lua object is a
 * box holding a pointer. Under a steady load that matters twice: less work
 * for the collector, and a heap that does not grow and shrink at its top
 * every cycle (with glibc that means page faults, which cost more here than
 * the rest of a request).
 */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "lauxlib.h"
#include "ratewise.h"

#define ENGINE_MT "ratewise.Engine"
#define TRANSFER_MT "ratewise.Transfer"
#define ENGINE_POOL_MAX 64
#define ENGINE_MAX_HEADER_BYTES (256 * 1024) /* under libcurl's own 300 KiB */
#define ENGINE_DEFAULT_MAX_BODY (64.0 * 1024 * 1024)

/* Connections (core.engine's options, engine:configure). At most
 * max_connections are open at once; transfers beyond that wait in
 * libcurl's queue for one to be free, so that any number of transfers in
 * flight fits in a process's descriptors (the usual limit is 1,024). While
 * transfers run, each keeps its connection for the next; once they are
 * done, at most max_idle_connections stay open for reuse (none after more
 * ran at once: see engine_shed). 64 idle: the throughput benchmark's 64
 * transfers to one host keep their connections. */
#define ENGINE_DEFAULT_MAX_CONNECTIONS 256L
#define ENGINE_DEFAULT_MAX_IDLE 64L
#define ENGINE_MAX_LIMIT 1000000L

/* libcurl never times out a transfer that waits in its queue for a
 * connection (its clock only runs once it has one); the engine ends such a
 * transfer itself this long after its timeout, by which time libcurl would
 * have ended it, had it been running. */
#define ENGINE_EXPIRY_GRACE 0.05

/* Redirects are followed by the engine, not by libcurl, which would send
 * every header the caller gave (x-api-key, say) to any host a redirect
 * names: libcurl knows only Authorization and Cookie for secrets. */
#define ENGINE_MAX_REDIRECTS 10L

/* libcurl refuses a request line and headers over 1 MiB, and servers answer
 * 431 long before that: a request's header lines are capped at this. */
#define ENGINE_MAX_REQUEST_HEADER_BYTES (256 * 1024)

/* Request fields whose values are credentials: the engine never sends them
 * to another origin (scheme, host, port) after a redirect, and the Lua
 * layer keeps them out of every message (core.secret_header_names). A
 * request adds names of its own (request.secret_headers). */
static const char *const engine_secret_names[] = {
    "authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-goog-api-key",
    "x-auth-token", "x-access-token", "x-amz-security-token", "private-token", "x-csrf-token", NULL
};

/* Fields libcurl writes itself: a caller's Content-Length or
 * Transfer-Encoding would override the real framing, and the body would be
 * read as a second, smuggled request on a pooled connection
 * (core.transport_header_names). */
static const char *const engine_transport_names[] = {
    "content-length", "transfer-encoding", "host", "connection", "upgrade", "te", "expect", NULL
};

/* The method of a request, for what a redirect makes of it. */
enum transfer_method { METHOD_GET, METHOD_HEAD, METHOD_POST, METHOD_OTHER };

/* Options a request may move away from libcurl's defaults; a recycled
 * handle gets back only those the last request on it changed. */
#define DIRTY_BODY 1u       /* POSTFIELDS (and the POST it implies) */
#define DIRTY_METHOD 2u     /* NOBODY, POST or CUSTOMREQUEST */
#define DIRTY_TIMEOUT 4u
#define DIRTY_FRESH 8u
#define DIRTY_NOVERIFY 16u

/* libcurl's receive buffer: its own default (CURL_MAX_WRITE_SIZE) at most,
 * and down to its minimum when the responses are small; see
 * engine_buffer_size. */
#define ENGINE_RECV_MAX 16384L
#define ENGINE_RECV_MIN 1024L

/* Buffers above this are not kept with a pooled record. */
#define ENGINE_KEEP_BUFFER (64 * 1024)

/* Transfer user values */
#define TRANSFER_UV_ENGINE 1 /* keeps the engine alive while the transfer is */
#define TRANSFER_UV_BODY 2   /* keeps the request body alive while curl reads it */

typedef struct engine_buf {
    char *data;
    size_t len, cap;
} engine_buf;

enum transfer_state { TRANSFER_RUNNING, TRANSFER_DONE, TRANSFER_CLOSED };
/* Why a transfer ended that libcurl did not end itself. */
enum transfer_abort { ABORT_NONE, ABORT_CANCELLED, ABORT_ENGINE_CLOSED, ABORT_MULTI_FAILED };

struct engine;

/* A transfer's record: malloc'd, and pooled by its engine once closed. */
typedef struct transfer {
    struct engine *engine; /* set while running, and while finished but not yet reported by poll */
    CURL *easy;            /* the record's own, for its whole life */
    unsigned dirty;        /* DIRTY_* options the request set */
    long recv_buffer;      /* CURLOPT_BUFFERSIZE of the handle */
    int ref;               /* its box in the engine's table, until poll reports it */
    /* The request's header lines: those without secrets first, then the
     * secret ones (from secret_headers on), so that cutting the list after
     * public_tail leaves the lines another origin may see. public_tail is
     * NULL when no line comes before the secret ones. */
    struct curl_slist *headers, *secret_headers, *public_tail, *proxy_headers;
    int follow;                  /* follow redirects (the engine does: engine_follow) */
    enum transfer_method method; /* as sent on the last hop */
    char *origin;                /* the first URL's origin, from the first redirect on */
    int headers_done; /* the blank line after the last response's headers came */
    size_t head_end;  /* head[0..head_end) is that header block, trailers follow; 0 until it ends */
    engine_buf body, head;
    size_t max_body;
    int body_too_large, headers_too_large, out_of_memory;
    enum transfer_state state;
    enum transfer_abort aborted;
    CURLcode code;
    CURLMcode multi_code; /* ABORT_MULTI_FAILED: what the multi handle reported */
    char errbuf[CURL_ERROR_SIZE];
    /* monotonic: when it started; when the engine ends it if libcurl has
     * not (0: no timeout), see ENGINE_EXPIRY_GRACE */
    double timeout, started, expires;
    /* gathered from the easy handle when the transfer ends */
    long status, request_size, redirects;
    double total_time;
    char *effective_url;
    struct transfer *prev, *next; /* in its engine's running or finished list */
} transfer;

typedef struct engine_list {
    transfer *head, *tail;
    int n;
} engine_list;

typedef struct engine {
    CURLM *multi;
    engine_list running;  /* on the multi handle (running or queued by libcurl) */
    engine_list finished; /* finished, and not yet reported by poll */
    transfer *pool[ENGINE_POOL_MAX];
    int npool;
    double response_bytes; /* moving average of a response's size */
    double next_expiry;    /* no running transfer expires before this (HUGE_VAL: none) */
    long max_connections, max_idle;
    long cache_size; /* CURLMOPT_MAXCONNECTS as last set (engine_size_cache) */
    int renew; /* replace the multi handle once nothing runs (engine_shed) */
} engine;

/* ---- buffers ---- */

static int engine_buf_append(engine_buf *b, const char *p, size_t n)
{
    if (n > (size_t)-1 - b->len - 1) return 0;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        char *data;
        while (cap < b->len + n + 1) cap = cap > (size_t)-1 / 2 ? b->len + n + 1 : cap * 2;
        data = (char *)realloc(b->data, cap);
        if (!data) return 0;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 1;
}

static void engine_buf_free(engine_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

static long engine_ms(double seconds)
{
    double ms = ceil(seconds * 1000.0);
    if (ms < 1) ms = 1;
    return ms > (double)LONG_MAX / 2 ? LONG_MAX / 2 : (long)ms;
}

static int engine_lower(int c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* ---- libcurl callbacks: C only, no Lua ---- */

static size_t engine_on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    transfer *t = (transfer *)ud;
    size_t n = size * nmemb;
    if (n > t->max_body || t->body.len > t->max_body - n) {
        t->body_too_large = 1;
        return 0; /* aborts the transfer: nothing is buffered past the limit */
    }
    if (!engine_buf_append(&t->body, ptr, n)) {
        t->out_of_memory = 1;
        return 0;
    }
    return n;
}

static size_t engine_on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
    transfer *t = (transfer *)ud;
    size_t n = size * nmemb;
    /* Each response (interim 1xx, every redirect hop) starts with its status
     * line; keep only the headers of the last one. */
    if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0) {
        t->head.len = 0;
        t->head_end = 0;
        t->headers_done = 0;
    }
    if (t->head.len + n > ENGINE_MAX_HEADER_BYTES) {
        t->headers_too_large = 1;
        return 0;
    }
    if (!engine_buf_append(&t->head, ptr, n)) {
        t->out_of_memory = 1;
        return 0;
    }
    /* libcurl hands a chunked body's trailer lines over after the body, as
     * more header lines: what follows the blank line is kept apart, so that
     * a trailer cannot pass for a header (a Retry-After steering a wait). */
    if ((n == 2 && ptr[0] == '\r') || (n == 1 && ptr[0] == '\n')) {
        if (!t->headers_done) t->head_end = t->head.len;
        t->headers_done = 1;
    }
    return n;
}

/* libcurl's sockets are inheritable: every program the process starts
 * (os.execute, io.popen) would get a copy of each connection, holding it
 * open past its close and using up the child's descriptors (a child run
 * under a low limit could not even load its libraries). Not inherited, as
 * Go's and Python's sockets are not. */
static int engine_on_socket(void *ud, curl_socket_t fd, curlsocktype purpose)
{
    (void)ud;
    (void)purpose;
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    return CURL_SOCKOPT_OK;
}

/* Never reads anything: see engine_configure. */
static size_t engine_on_read(char *ptr, size_t size, size_t nmemb, void *ud)
{
    (void)ptr;
    (void)size;
    (void)nmemb;
    (void)ud;
    return 0;
}

/* ---- engine internals ---- */

/* A pooled record's handle keeps the options that every transfer sets
 * alike; *fresh says whether they still have to be set. NULL: out of memory. */
static transfer *engine_take(engine *e, int *fresh)
{
    transfer *t;
    *fresh = e->npool == 0;
    if (e->npool > 0) return e->pool[--e->npool];
    t = (transfer *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->easy = curl_easy_init();
    if (!t->easy) {
        free(t);
        return NULL;
    }
    t->state = TRANSFER_CLOSED;
    t->ref = LUA_NOREF;
    t->recv_buffer = ENGINE_RECV_MAX;
    return t;
}

/* libcurl mallocs its receive buffer when a transfer starts and frees it
 * when the transfer ends. At libcurl's 16 KiB, amid the Lua heap's own
 * churn, glibc seldom finds a free block that size: it grows the heap for
 * the buffer, and gives the memory back when the buffer is freed, so under
 * a steady load the heap's top grows and shrinks every few requests, each
 * time with fresh page faults (with 64 transfers in flight, that cost more
 * than all the rest of a request). A buffer of about half the usual
 * response keeps the recv calls per response at two or three and the heap
 * still: the size follows a moving average of the responses seen, from
 * libcurl's minimum (1 KiB) up to its default, never above. */
static long engine_buffer_size(const engine *e)
{
    long size = ENGINE_RECV_MIN;
    while (size < ENGINE_RECV_MAX && (double)size * 2 < e->response_bytes) size *= 2;
    return size;
}

static void engine_destroy(transfer *t)
{
    curl_easy_cleanup(t->easy);
    engine_buf_free(&t->body);
    engine_buf_free(&t->head);
    free(t);
}

/* Frees the request's header lines, whether their two parts are joined,
 * cut apart by a redirect, or never joined (a request that raised). */
static void engine_free_headers(transfer *t)
{
    if (t->public_tail) t->public_tail->next = NULL;
    if (t->headers != t->secret_headers) curl_slist_free_all(t->headers);
    curl_slist_free_all(t->secret_headers);
    curl_slist_free_all(t->proxy_headers);
    t->headers = t->secret_headers = t->public_tail = t->proxy_headers = NULL;
}

/* Back to the pool of engine e (NULL, or closed: freed instead), with what
 * the last request left behind let go of. */
static void engine_give(engine *e, transfer *t)
{
    engine_free_headers(t);
    free(t->effective_url);
    free(t->origin);
    t->effective_url = t->origin = NULL;
    if (!e || !e->multi || e->npool >= ENGINE_POOL_MAX) {
        engine_destroy(t);
        return;
    }
    if (t->body.cap > ENGINE_KEEP_BUFFER) engine_buf_free(&t->body);
    if (t->head.cap > ENGINE_KEEP_BUFFER) engine_buf_free(&t->head);
    t->body.len = t->head.len = t->head_end = 0;
    t->headers_done = t->body_too_large = t->headers_too_large = t->out_of_memory = 0;
    t->aborted = ABORT_NONE;
    t->code = CURLE_OK;
    t->multi_code = CURLM_OK;
    t->errbuf[0] = '\0';
    t->timeout = t->started = t->expires = 0;
    t->status = t->request_size = t->redirects = 0;
    t->total_time = 0;
    t->state = TRANSFER_CLOSED;
    t->ref = LUA_NOREF;
    e->pool[e->npool++] = t;
}

static void engine_list_add(engine_list *l, transfer *t)
{
    t->next = NULL;
    t->prev = l->tail;
    if (l->tail) l->tail->next = t;
    else l->head = t;
    l->tail = t;
    l->n++;
}

static void engine_list_remove(engine_list *l, transfer *t)
{
    if (t->prev) t->prev->next = t->next;
    else l->head = t->next;
    if (t->next) t->next->prev = t->prev;
    else l->tail = t->prev;
    t->prev = t->next = NULL;
    l->n--;
}

/* libcurl's connection cache counts the connections in use with the idle
 * ones: whenever a transfer ends with more than CURLMOPT_MAXCONNECTS
 * connections open, it closes the oldest idle one, which is then most often
 * the one just given back. Set to max_idle, that would make every transfer
 * reconnect whenever more than max_idle run at once (measured: 100 at once,
 * 1,280 requests, 1,280 connections). So the cache is as large as the
 * transfers on the multi handle, and never under max_idle: as those drop,
 * the connections they gave back are closed, one perform behind. */
static void engine_size_cache(engine *e)
{
    long size = e->running.n > e->max_idle ? (long)e->running.n : e->max_idle;
    if (size == e->cache_size) return;
    e->cache_size = size;
    if (size > e->max_idle) e->renew = 1;
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, size);
}

static void engine_apply_limits(engine *e)
{
    curl_multi_setopt(e->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, e->max_connections);
    e->cache_size = -1;
    engine_size_cache(e);
}

/* The last transfers of a burst end together, in one perform, and keep
 * their connections (the cache was sized for them): up to max_connections
 * left open, where a fast server answered. Once nothing runs after more
 * than max_idle did, the engine swaps its multi handle for a fresh one,
 * which closes every connection the old one held; the next transfers
 * connect anew. A run that stays within max_idle never comes here. Nor is
 * a multi handle that failed used again. */
static void engine_shed(engine *e)
{
    CURLM *fresh;
    if (!e->renew || e->running.head) return;
    fresh = curl_multi_init();
    if (!fresh) return; /* out of memory: the old one does */
    curl_multi_cleanup(e->multi);
    e->multi = fresh;
    e->renew = 0;
    engine_apply_limits(e);
}

/* Takes a running transfer off the multi handle, keeping what libcurl knows
 * about its outcome. Its engine forgets it: see engine_queue. */
static void engine_finish(transfer *t, CURLcode code, enum transfer_abort aborted)
{
    engine *e = t->engine;
    CURL *easy = t->easy;
    double hop_time = 0;
    if (!e) return;
    t->code = code;
    t->aborted = aborted;
    /* Only whole responses say what size the responses are. */
    if (code == CURLE_OK && aborted == ABORT_NONE)
        e->response_bytes += ((double)(t->head.len + t->body.len) - e->response_bytes) / 8;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &t->status);
    curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &t->request_size);
    if (curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME, &hop_time) == CURLE_OK) t->total_time += hop_time;
    /* Removing a transfer that has not completed closes its connection
     * instead of returning it to the cache, which is what an abort needs. */
    curl_multi_remove_handle(e->multi, easy);
    engine_list_remove(&e->running, t);
    engine_size_cache(e);
    t->engine = NULL;
    t->state = TRANSFER_DONE;
}

/* A finished transfer waits in its engine's finished list until poll has
 * put it in the caller's table: a transfer libcurl reported is never lost,
 * whatever fails in between. */
static void engine_queue(engine *e, transfer *t)
{
    engine_list_add(&e->finished, t);
    t->engine = e;
}

/* Drops a finished transfer from the list of those poll is to report. */
static void engine_unqueue(transfer *t)
{
    if (t->state != TRANSFER_DONE || !t->engine) return;
    engine_list_remove(&t->engine->finished, t);
    t->engine = NULL;
}

/* Ends every running transfer after the multi handle failed (out of
 * memory, a failed poll(2)...): each reports the error, so that nothing
 * waits for a transfer that libcurl will never finish. */
static void engine_fail_all(engine *e, CURLMcode mc)
{
    e->renew = 1;
    while (e->running.head) {
        transfer *t = e->running.head;
        t->multi_code = mc;
        engine_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_MULTI_FAILED);
        engine_queue(e, t);
    }
}

/* Ends the transfers whose timeout has passed while libcurl kept them
 * queued for a connection (it has no timer for those). Scans the running
 * list only once the earliest expiry is due. */
static void engine_expire(engine *e)
{
    double now, next = HUGE_VAL;
    transfer *t, *after;
    if (!e->running.head) {
        e->next_expiry = HUGE_VAL;
        return;
    }
    now = rw_clock_monotonic();
    if (now < e->next_expiry) return;
    for (t = e->running.head; t; t = after) {
        after = t->next;
        if (t->expires <= 0) continue;
        if (now < t->expires) {
            if (t->expires < next) next = t->expires;
            continue;
        }
        engine_finish(t, CURLE_OPERATION_TIMEDOUT, ABORT_NONE);
        if (t->request_size == 0)
            (void)snprintf(t->errbuf, sizeof t->errbuf,
                           "Operation timed out after %.0f milliseconds waiting for a connection "
                           "(all %ld in use: max_connections)", (now - t->started) * 1000, e->max_connections);
        else
            (void)snprintf(t->errbuf, sizeof t->errbuf, "Operation timed out after %.0f milliseconds",
                           (now - t->started) * 1000);
        engine_queue(e, t);
    }
    e->next_expiry = next;
}

/* A copy of s, or NULL (out of memory). */
static char *engine_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *copy = (char *)malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

/* "scheme://host:port" of a URL, lower-case, the port filled in (malloc'd),
 * or NULL when it does not parse. */
static char *engine_origin(const char *url)
{
    CURLU *u = curl_url();
    char *scheme = NULL, *host = NULL, *port = NULL, *out = NULL;
    if (!u) return NULL;
    if (curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK
        && curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK
        && curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK
        && curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        size_t n = strlen(scheme) + strlen(host) + strlen(port) + 5;
        out = (char *)malloc(n);
        if (out) {
            size_t i;
            (void)snprintf(out, n, "%s://%s:%s", scheme, host, port);
            for (i = 0; out[i]; i++) out[i] = (char)engine_lower((unsigned char)out[i]);
        }
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return out;
}

/* A transfer libcurl completed with a redirect the request follows: puts
 * it back on the multi handle for the next URL and answers 1. Answers 0
 * when the response is the final one, or when the redirect cannot be
 * followed, with *code and the error text saying why. As a browser, curl
 * and Go do: a 303 (and a 301 or 302 to a POST) becomes a GET without a
 * body; 307 and 308 keep the method and body; the secret header lines go
 * only to the first URL's origin; the per-attempt timeout spans every hop. */
static int engine_follow(engine *e, transfer *t, CURLcode *code)
{
    long status = 0;
    char *location = NULL, *next_url, *next_origin;
    double hop_time = 0, left = 0;
    int same_origin;
    CURLMcode mc;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 301 && status != 302 && status != 303 && status != 307 && status != 308) return 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_REDIRECT_URL, &location) != CURLE_OK || !location) return 0;
    if (t->redirects >= ENGINE_MAX_REDIRECTS) {
        *code = CURLE_TOO_MANY_REDIRECTS;
        (void)snprintf(t->errbuf, sizeof t->errbuf, "Maximum (%ld) redirects followed", ENGINE_MAX_REDIRECTS);
        return 0;
    }
    if (strncasecmp(location, "http://", 7) != 0 && strncasecmp(location, "https://", 8) != 0) {
        size_t scheme = strspn(location, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");
        *code = CURLE_UNSUPPORTED_PROTOCOL;
        (void)snprintf(t->errbuf, sizeof t->errbuf, "a redirect to a \"%.*s\" URL was refused (only http "
                       "and https are followed)", (int)(scheme < 32 ? scheme : 32), location);
        return 0;
    }
    if (t->timeout > 0) {
        left = t->timeout - (rw_clock_monotonic() - t->started);
        if (left <= 0) {
            *code = CURLE_OPERATION_TIMEDOUT;
            (void)snprintf(t->errbuf, sizeof t->errbuf, "Operation timed out after %.0f milliseconds",
                           t->timeout * 1000);
            return 0;
        }
    }
    if (!t->origin) { /* the first hop: the URL the request named */
        char *first = NULL;
        if (curl_easy_getinfo(t->easy, CURLINFO_EFFECTIVE_URL, &first) == CURLE_OK && first)
            t->origin = engine_origin(first);
    }
    next_origin = engine_origin(location);
    same_origin = t->origin && next_origin && strcmp(t->origin, next_origin) == 0;
    free(next_origin);
    next_url = engine_strdup(location); /* location is the handle's, gone once it is removed */
    if (!next_url) {
        *code = CURLE_OUT_OF_MEMORY;
        t->out_of_memory = 1;
        return 0;
    }
    if (curl_easy_getinfo(t->easy, CURLINFO_TOTAL_TIME, &hop_time) == CURLE_OK) t->total_time += hop_time;
    curl_multi_remove_handle(e->multi, t->easy); /* a completed transfer: its connection is kept */
    if ((status == 303 && t->method != METHOD_HEAD) || ((status == 301 || status == 302) && t->method == METHOD_POST)) {
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, (char *)NULL);
        curl_easy_setopt(t->easy, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(t->easy, CURLOPT_CUSTOMREQUEST, (char *)NULL);
        t->dirty |= DIRTY_BODY | DIRTY_METHOD;
        t->method = METHOD_GET;
    }
    if (t->secret_headers) {
        if (t->public_tail) t->public_tail->next = same_origin ? t->secret_headers : NULL;
        curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, same_origin || t->public_tail ? t->headers : NULL);
    }
    curl_easy_setopt(t->easy, CURLOPT_URL, next_url); /* copied */
    free(t->effective_url);
    t->effective_url = next_url;
    if (t->timeout > 0) curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, engine_ms(left));
    t->body.len = 0; /* the redirect's own body is not the answer */
    t->redirects++;
    mc = curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        *code = CURLE_OUT_OF_MEMORY;
        (void)snprintf(t->errbuf, sizeof t->errbuf, "libcurl could not follow the redirect (%s)",
                       curl_multi_strerror(mc));
        return 0;
    }
    return 1;
}

/* Moves what libcurl finished to the finished list. C only: nothing here
 * can raise, and a message read is a message kept. */
static void engine_drain(engine *e)
{
    CURLMsg *msg;
    CURLcode code;
    int left;
    while ((msg = curl_multi_info_read(e->multi, &left)) != NULL) {
        transfer *t = NULL;
        if (msg->msg != CURLMSG_DONE) continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
        if (!t || t->state != TRANSFER_RUNNING) continue;
        code = msg->data.result; /* msg is invalid once the handle is removed */
        if (code == CURLE_OK && t->follow && engine_follow(e, t, &code)) continue;
        engine_finish(t, code, ABORT_NONE);
        engine_queue(e, t);
    }
}

/* Lets libcurl work on every transfer, then gathers what finished. */
static void engine_drive(engine *e)
{
    int running;
    CURLMcode mc = curl_multi_perform(e->multi, &running);
    engine_drain(e);
    if (mc != CURLM_OK) engine_fail_all(e, mc);
    else engine_expire(e);
    engine_shed(e);
}

static engine *engine_check(lua_State *L)
{
    engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
    if (!e->multi) luaL_argerror(L, 1, "engine is closed");
    return e;
}

/* ---- request options ---- */

/* Pushes request option `name` and returns 1, or pushes nothing and
 * returns 0 when it is nil. */
static int engine_opt_field(lua_State *L, int req, const char *name, int type, const char *what)
{
    RW_STACK_MARK(L, mark);
    int t = lua_getfield(L, req, name);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        RW_STACK_EXPECT(L, mark, 0);
        return 0;
    }
    if (t != type)
        luaL_error(L, "request option '%s' must be %s (got %s)", name, what, luaL_typename(L, -1));
    RW_STACK_EXPECT(L, mark, 1);
    return 1;
}

static double engine_opt_seconds(lua_State *L, int req, const char *name)
{
    RW_STACK_MARK(L, mark);
    double v;
    if (!engine_opt_field(L, req, name, LUA_TNUMBER, "a number of seconds")) return -1;
    v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (!(v > 0) || isnan(v)) luaL_error(L, "request option '%s' must be positive", name);
    RW_STACK_EXPECT(L, mark, 0);
    return v;
}

/* Whether s[0..n) holds a control character or a space (RFC 3986 allows
 * neither in a URL; RFC 9110 none in a method). */
static int engine_has_ctl(const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 32 || (unsigned char)s[i] == 127) return 1;
    return 0;
}

/* Whether the request table at index req has a non-nil field name. */
static int engine_has_field(lua_State *L, int req, const char *name)
{
    int present = lua_getfield(L, req, name) != LUA_TNIL;
    lua_pop(L, 1);
    return present;
}

/* Whether name[0..n) is one of list's (lower-case) names, in any case. */
static int engine_in_list(const char *const *list, const char *name, size_t n)
{
    for (; *list; list++)
        if (strlen(*list) == n && strncasecmp(*list, name, n) == 0) return 1;
    return 0;
}

/* Whether name[0..n) is one of the strings of the array at index idx. */
static int engine_in_names(lua_State *L, int idx, const char *name, size_t n)
{
    lua_Integer i, count = (lua_Integer)lua_rawlen(L, idx);
    for (i = 1; i <= count; i++) {
        size_t len;
        const char *s;
        lua_rawgeti(L, idx, i);
        s = lua_tolstring(L, -1, &len);
        lua_pop(L, 1);
        if (len == n && strncasecmp(s, name, n) == 0) return 1;
    }
    return 0;
}

/* request.secret_headers: an array of names. */
static void engine_check_names(lua_State *L, int idx)
{
    lua_Integer i, count = (lua_Integer)lua_rawlen(L, idx);
    for (i = 1; i <= count; i++) {
        if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
            luaL_error(L, "request option 'secret_headers' must be an array of header names");
        lua_pop(L, 1);
    }
}

/* Checks header line i ("Name: value", or "Name;" for an empty value) and
 * returns the length of its name. Control characters other than HTAB are
 * refused (CR and LF would start another field), and so are the fields
 * libcurl owns. */
static size_t engine_check_line(lua_State *L, const char *line, size_t len, int i)
{
    size_t k, name_len = 0;
    while (name_len < len && line[name_len] != ':' && line[name_len] != ';' && line[name_len] != ' ') name_len++;
    if (name_len == 0 || name_len == len) luaL_error(L, "request header %d is not \"Name: value\"", i);
    for (k = 0; k < len; k++) {
        unsigned char c = (unsigned char)line[k];
        if ((c < 32 && c != '\t') || c == 127)
            luaL_error(L, "request header %d contains a control character (CR, LF, NUL or another)", i);
    }
    if (engine_in_list(engine_transport_names, line, name_len))
        luaL_error(L, "request header %d (%s) is set by libcurl, not by the caller", i,
                   lua_pushlstring(L, line, name_len));
    return name_len;
}

/* Sets up t->easy from the request table at index req. Misuse raises. */
static void engine_configure(lua_State *L, transfer *t, int req, int tidx, int fresh)
{
    RW_STACK_MARK(L, mark);
    CURL *easy = t->easy;
    const char *method;
    size_t len;
    double seconds;
    int post = 0, get = 0, extra_secrets = 0;
    size_t header_bytes = 0;
    const char *url;

    if (fresh) {
        /* Only http and https (libcurl itself never follows a redirect
         * here: engine_follow does). */
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
        curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
        curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(easy, CURLOPT_HEADEROPT, CURLHEADER_SEPARATE);
        curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, engine_on_body);
        curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, engine_on_header);
        /* The record and its handle stay together for good. */
        curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, t->errbuf);
        curl_easy_setopt(easy, CURLOPT_WRITEDATA, t);
        curl_easy_setopt(easy, CURLOPT_HEADERDATA, t);
        curl_easy_setopt(easy, CURLOPT_PRIVATE, t);
        /* libcurl's default read callback is fread(stdin): a request whose
         * body libcurl would have to read (a POST without POSTFIELDS, an
         * upload) would send the process's standard input. Every body is
         * POSTFIELDS, so the read callback only ever says "no more". */
        curl_easy_setopt(easy, CURLOPT_READFUNCTION, engine_on_read);
        curl_easy_setopt(easy, CURLOPT_SOCKOPTFUNCTION, engine_on_socket);
    } else if (t->dirty) {
        /* Back to the defaults of what the last request changed, which costs
         * far less than curl_easy_reset. POSTFIELDS first: setting it turns
         * the method to POST, which HTTPGET then undoes. */
        if (t->dirty & DIRTY_BODY) {
            curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
            curl_easy_setopt(easy, CURLOPT_POSTFIELDS, (char *)NULL);
        }
        if (t->dirty & (DIRTY_BODY | DIRTY_METHOD)) {
            curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
            curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, (char *)NULL);
        }
        if (t->dirty & DIRTY_TIMEOUT) curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 0L);
        if (t->dirty & DIRTY_FRESH) curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 0L);
        if (t->dirty & DIRTY_NOVERIFY) {
            curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
            curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
        }
    }
    t->dirty = 0;

    engine_opt_field(L, req, "url", LUA_TSTRING, "a string");
    url = lua_tolstring(L, -1, &len);
    if (!url) {
        luaL_error(L, "request option 'url' is required");
        return; /* not reached; lauxlib.h does not tell the analyzer so */
    }
    if (engine_has_ctl(url, len)) luaL_error(L, "request url contains a space or a control character");
    curl_easy_setopt(easy, CURLOPT_URL, url); /* copied by libcurl */
    lua_pop(L, 1);

    /* No method: GET, or POST when there is a body (libcurl's way). */
    t->method = METHOD_GET;
    if (engine_opt_field(L, req, "method", LUA_TSTRING, "a string")) {
        method = lua_tolstring(L, -1, &len);
        if (len == 0 || engine_has_ctl(method, len))
            luaL_error(L, "request method is not a valid HTTP method");
        if (strcmp(method, "GET") != 0) {
            t->dirty |= DIRTY_METHOD;
            if (strcmp(method, "HEAD") == 0) {
                t->method = METHOD_HEAD;
                curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
            } else if (strcmp(method, "POST") == 0) {
                t->method = METHOD_POST;
                post = 1; /* the body options below make it a POST */
            } else {
                t->method = METHOD_OTHER;
                curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, method); /* copied */
            }
        } else {
            /* libcurl would send a GET with a body as a POST, while the
             * caller decided replay safety on GET. */
            get = 1;
        }
        lua_pop(L, 1);
    }
    if ((get || t->method == METHOD_HEAD) && engine_has_field(L, req, "body"))
        luaL_error(L, "request with method %s cannot carry a body", t->method == METHOD_HEAD ? "HEAD" : "GET");

    if (engine_opt_field(L, req, "body", LUA_TSTRING, "a string")) {
        if (t->method == METHOD_GET) t->method = METHOD_POST;
        const char *body = lua_tolstring(L, -1, &len);
        lua_setiuservalue(L, tidx, TRANSFER_UV_BODY); /* libcurl does not copy it */
        t->dirty |= DIRTY_BODY;
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
    } else if (engine_opt_field(L, req, "empty_body", LUA_TBOOLEAN, "a boolean")) {
        /* Sends "Content-Length: 0", as servers expect of a POST or PUT. */
        if (lua_toboolean(L, -1)) {
            t->dirty |= DIRTY_BODY;
            curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
            curl_easy_setopt(easy, CURLOPT_POSTFIELDS, "");
        }
        lua_pop(L, 1);
    }
    if (post && !(t->dirty & DIRTY_BODY)) {
        /* A POST without a body sends "Content-Length: 0" (CURLOPT_POST
         * alone would make libcurl read the body from stdin). */
        t->dirty |= DIRTY_BODY;
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, "");
    }

    if (engine_opt_field(L, req, "secret_headers", LUA_TTABLE, "a table of header names")) {
        extra_secrets = lua_gettop(L);
        engine_check_names(L, extra_secrets);
    }
    if (engine_opt_field(L, req, "headers", LUA_TTABLE, "a table")) {
        lua_Integer i, n = luaL_len(L, -1);
        for (i = 1; i <= n; i++) {
            struct curl_slist **list, *next;
            const char *line;
            size_t name_len;
            if (lua_geti(L, -1, i) != LUA_TSTRING)
                luaL_error(L, "request header %d must be a string", (int)i);
            line = lua_tolstring(L, -1, &len);
            name_len = engine_check_line(L, line, len, (int)i);
            header_bytes += len + 2;
            if (header_bytes > ENGINE_MAX_REQUEST_HEADER_BYTES)
                luaL_error(L, "request headers too large (over %d KiB)", ENGINE_MAX_REQUEST_HEADER_BYTES / 1024);
            /* Proxy-Authorization goes to a proxy only, never to an origin
             * (libcurl would hand it to every host a redirect leads to). */
            if (name_len == 19 && strncasecmp(line, "proxy-authorization", 19) == 0)
                list = &t->proxy_headers;
            else if (engine_in_list(engine_secret_names, line, name_len)
                     || (extra_secrets && engine_in_names(L, extra_secrets, line, name_len)))
                list = &t->secret_headers;
            else
                list = &t->headers;
            next = curl_slist_append(*list, line); /* copied */
            if (!next) luaL_error(L, "out of memory building request headers");
            *list = next;
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    if (extra_secrets) lua_pop(L, 1);
    if (t->dirty & DIRTY_BODY) {
        /* Without this, libcurl waits up to a second for "100 Continue"
         * before sending a large body. */
        struct curl_slist *next = curl_slist_append(t->headers, "Expect:");
        if (!next) luaL_error(L, "out of memory building request headers");
        t->headers = next;
    }
    if (t->secret_headers) { /* the secret lines after the others: see transfer */
        struct curl_slist *tail = t->headers;
        while (tail && tail->next) tail = tail->next;
        t->public_tail = tail;
        if (tail) tail->next = t->secret_headers;
        else t->headers = t->secret_headers;
    }
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, t->headers);
    curl_easy_setopt(easy, CURLOPT_PROXYHEADER, t->proxy_headers);

    t->timeout = 0;
    if ((seconds = engine_opt_seconds(L, req, "timeout")) > 0) {
        t->dirty |= DIRTY_TIMEOUT;
        t->timeout = seconds;
        curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, engine_ms(seconds));
    }

    t->follow = 1;
    if (engine_opt_field(L, req, "follow_redirects", LUA_TBOOLEAN, "a boolean")) {
        t->follow = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }

    t->max_body = (size_t)ENGINE_DEFAULT_MAX_BODY;
    if (engine_opt_field(L, req, "max_body", LUA_TNUMBER, "a number of bytes")) {
        lua_Number mb = lua_tonumber(L, -1);
        /* The integer half of SIZE_MAX, then as a float: meant. */
        if (!(mb >= 0) || mb > (lua_Number)((size_t)-1 / 2)) /* NOLINT(bugprone-integer-division) */
            luaL_error(L, "request option 'max_body' must be a non-negative number of bytes");
        t->max_body = (size_t)mb;
        lua_pop(L, 1);
    }

    /* libcurl silently re-sends a request whose reused connection turns out
     * to be dead, even one the server may have acted on; a request that must
     * not be replayed asks for a connection of its own. */
    if (engine_opt_field(L, req, "fresh_connect", LUA_TBOOLEAN, "a boolean")) {
        if (lua_toboolean(L, -1)) {
            t->dirty |= DIRTY_FRESH;
            curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 1L);
        }
        lua_pop(L, 1);
    }

    if (engine_opt_field(L, req, "verify_tls", LUA_TBOOLEAN, "a boolean")) {
        if (!lua_toboolean(L, -1)) {
            t->dirty |= DIRTY_NOVERIFY;
            curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L);
            curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L);
        }
        lua_pop(L, 1);
    }
    RW_STACK_EXPECT(L, mark, 0);
}

/* ---- Engine methods ---- */

/* The Lua object of a transfer: a box, so that the record can go back to
 * its engine's pool when the transfer is closed. NULL once closed. */
typedef struct transfer_box {
    transfer *t;
} transfer_box;

/* Reads the connection options of the table at index idx into *conns and
 * *idle (options left out keep their value). Misuse raises, naming the
 * option. */
static void engine_read_limits(lua_State *L, int idx, long *conns, long *idle)
{
    RW_STACK_MARK(L, mark);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        const char *key = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        long *slot = NULL;
        lua_Integer v;
        int isint = 0;
        if (key && strcmp(key, "max_connections") == 0) slot = conns;
        else if (key && strcmp(key, "max_idle_connections") == 0) slot = idle;
        if (!slot) {
            luaL_error(L, "engine: unknown option '%s' (expected max_connections, max_idle_connections)",
                       luaL_tolstring(L, -2, NULL));
            return; /* not reached; lauxlib.h does not tell the analyzer so */
        }
        v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
        if (!isint || v < 1 || v > ENGINE_MAX_LIMIT)
            luaL_error(L, "engine: option '%s' must be an integer from 1 to %d (got %s)", key,
                       (int)ENGINE_MAX_LIMIT,
                       lua_type(L, -1) == LUA_TNUMBER ? luaL_tolstring(L, -1, NULL) : luaL_typename(L, -1));
        *slot = (long)v;
        lua_pop(L, 1);
    }
    RW_STACK_EXPECT(L, mark, 0);
}

/* core.engine([{max_connections = n, max_idle_connections = n}]) -> engine
 * | nil, err. See ENGINE_DEFAULT_MAX_CONNECTIONS for the options. */
static int engine_l_new(lua_State *L)
{
    long conns = ENGINE_DEFAULT_MAX_CONNECTIONS, idle = ENGINE_DEFAULT_MAX_IDLE;
    engine *e;
    if (!lua_isnoneornil(L, 1)) {
        luaL_checktype(L, 1, LUA_TTABLE);
        engine_read_limits(L, 1, &conns, &idle);
    }
    e = (engine *)lua_newuserdatauv(L, sizeof(engine), 1);
    memset(e, 0, sizeof *e); /* closed until the multi handle exists */
    e->response_bytes = (double)ENGINE_RECV_MAX * 2; /* libcurl's default until responses are seen */
    e->next_expiry = HUGE_VAL;
    e->max_connections = conns;
    e->max_idle = idle;
    luaL_setmetatable(L, ENGINE_MT);
    /* The boxes of transfers until poll reports them (luaL_ref), which also
     * keeps them alive. */
    lua_createtable(L, ENGINE_POOL_MAX, 0);
    lua_setiuservalue(L, -2, 1);
    e->multi = curl_multi_init();
    if (!e->multi) {
        lua_pop(L, 1);
        lua_pushnil(L);
        lua_pushliteral(L, "libcurl could not create a multi handle");
        return 2;
    }
    engine_apply_limits(e);
    return 1;
}

/* engine:configure{max_connections = n, max_idle_connections = n}: new
 * limits for a running engine (options left out keep their value). A lower
 * cap applies to the connections made from now on; transfers libcurl has
 * queued start as connections free up. */
static int engine_l_configure(lua_State *L)
{
    engine *e = engine_check(L);
    long conns = e->max_connections, idle = e->max_idle;
    luaL_checktype(L, 2, LUA_TTABLE);
    engine_read_limits(L, 2, &conns, &idle); /* all checked before any is applied */
    e->max_connections = conns;
    e->max_idle = idle;
    engine_apply_limits(e);
    return 0;
}

/* engine:start(request) -> transfer. Misuse raises; a transfer that cannot
 * be started gives nil, err. */
static int engine_l_start(lua_State *L)
{
    engine *e = engine_check(L);
    transfer_box *box;
    transfer *t;
    CURLMcode mc;
    long recv_buffer;
    int fresh, tidx;
    luaL_checktype(L, 2, LUA_TTABLE);
    box = (transfer_box *)lua_newuserdatauv(L, sizeof(transfer_box), 2);
    tidx = lua_gettop(L);
    box->t = NULL;
    luaL_setmetatable(L, TRANSFER_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, tidx, TRANSFER_UV_ENGINE);

    t = engine_take(e, &fresh);
    if (!t) {
        lua_pop(L, 1);
        lua_pushnil(L);
        lua_pushliteral(L, "libcurl could not create an easy handle");
        return 2;
    }
    box->t = t; /* from here on __gc gives the record back, whatever happens */
    t->state = TRANSFER_DONE;
    engine_configure(L, t, 2, tidx, fresh); /* may raise */
    recv_buffer = engine_buffer_size(e);
    if (t->recv_buffer != recv_buffer) {
        t->recv_buffer = recv_buffer;
        curl_easy_setopt(t->easy, CURLOPT_BUFFERSIZE, recv_buffer);
    }
    /* The reference first: it is the one step that can raise (out of
     * memory), and a transfer on the multi handle must have one. */
    lua_getiuservalue(L, 1, 1);
    lua_pushvalue(L, tidx);
    t->ref = luaL_ref(L, -2);
    mc = curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        luaL_unref(L, -1, t->ref);
        t->ref = LUA_NOREF;
        box->t = NULL;
        engine_give(e, t);
        lua_pop(L, 2);
        lua_pushnil(L);
        lua_pushstring(L, curl_multi_strerror(mc));
        return 2;
    }
    lua_pop(L, 1);
    t->state = TRANSFER_RUNNING;
    t->engine = e;
    engine_list_add(&e->running, t);
    engine_size_cache(e);
    t->started = rw_clock_monotonic();
    if (t->timeout > 0) {
        t->expires = t->started + t->timeout + ENGINE_EXPIRY_GRACE;
        if (t->expires < e->next_expiry) e->next_expiry = t->expires;
    }
    return 1;
}

/* Puts the finished transfers in the table at index out, from out[1] on,
 * and returns how many. Each leaves the finished list (and the engine's
 * table of references) only once it is in out: when a Lua allocation fails
 * halfway, the rest are still there for the next poll. */
static int engine_report(lua_State *L, engine *e, int out)
{
    RW_STACK_MARK(L, mark);
    int n = 0;
    lua_getiuservalue(L, 1, 1);
    while (e->finished.head) {
        transfer *t = e->finished.head;
        lua_rawgeti(L, -1, t->ref);
        lua_rawseti(L, out, n + 1); /* may raise: out of memory */
        n++;
        engine_unqueue(t);
        luaL_unref(L, -1, t->ref);
        t->ref = LUA_NOREF;
    }
    lua_pop(L, 1);
    RW_STACK_EXPECT(L, mark, 0);
    return n;
}

/* engine:poll([timeout [, out]]) -> out, n. Drives every running transfer;
 * when none has finished, waits at most timeout seconds (default 0) for
 * socket activity or a libcurl timer. The transfers that finished are
 * out[1..n]: out is the caller's table to fill, or a new one. Entries past
 * n are left as they were. When libcurl's multi handle fails, every
 * running transfer ends with that error (error.multi), and is reported
 * here like any other. */
static int engine_l_poll(lua_State *L)
{
    engine *e = engine_check(L);
    lua_Number timeout = luaL_optnumber(L, 2, 0);
    int out, n;
    luaL_argcheck(L, timeout >= 0, 2, "timeout must be a non-negative number of seconds");
    if (lua_isnoneornil(L, 3)) {
        lua_newtable(L);
    } else {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_pushvalue(L, 3);
    }
    out = lua_gettop(L);
    engine_drive(e);
    if (!e->finished.head && timeout > 0) {
        long curl_ms = -1, ms = engine_ms(timeout);
        CURLMcode mc;
        if (ms > INT_MAX) ms = INT_MAX;
        if (e->running.head) {
            if (curl_multi_timeout(e->multi, &curl_ms) == CURLM_OK && curl_ms >= 0 && curl_ms < ms)
                ms = curl_ms;
            if (e->next_expiry < HUGE_VAL) { /* libcurl's timers leave queued transfers out */
                double until = e->next_expiry - rw_clock_monotonic();
                long expiry_ms = until > 0 ? engine_ms(until) : 0;
                if (expiry_ms < ms) ms = expiry_ms;
            }
        }
        mc = curl_multi_poll(e->multi, NULL, 0, (int)ms, NULL);
        if (mc != CURLM_OK) {
            engine_fail_all(e, mc);
            engine_shed(e);
        } else {
            engine_drive(e);
        }
    }
    n = engine_report(L, e, out);
    lua_pushinteger(L, n);
    return 2;
}

/* engine:running() -> number of transfers in flight (queued for a
 * connection or not), and finished ones poll has yet to report: while it is
 * above 0, there is something to poll for. */
static int engine_l_running(lua_State *L)
{
    engine *e = engine_check(L);
    lua_pushinteger(L, e->running.n + e->finished.n);
    return 1;
}

/* Idempotent; __gc, __close and engine:close() all come here. Transfers
 * still running end as aborted; finished ones are no longer reported. */
static int engine_l_close(lua_State *L)
{
    engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
    if (!e->multi) return 0;
    while (e->running.head) engine_finish(e->running.head, CURLE_ABORTED_BY_CALLBACK, ABORT_ENGINE_CLOSED);
    while (e->finished.head) engine_unqueue(e->finished.head);
    while (e->npool > 0) engine_destroy(e->pool[--e->npool]);
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    return 0;
}

/* ---- Transfer methods ---- */

static transfer *transfer_check(lua_State *L)
{
    transfer_box *box = (transfer_box *)luaL_checkudata(L, 1, TRANSFER_MT);
    if (!box->t) luaL_argerror(L, 1, "transfer is closed");
    return box->t;
}

static int transfer_l_done(lua_State *L)
{
    lua_pushboolean(L, transfer_check(L)->state == TRANSFER_DONE);
    return 1;
}

/* Drops the transfer at index 1 from its engine's table of references
 * (if it is there), and returns that engine. The stack is left as it was. */
static engine *transfer_detach(lua_State *L, transfer *t)
{
    RW_STACK_MARK(L, mark);
    engine *e = NULL;
    if (lua_getiuservalue(L, 1, TRANSFER_UV_ENGINE) == LUA_TUSERDATA) {
        e = (engine *)lua_touserdata(L, -1);
        if (t->ref != LUA_NOREF) {
            if (lua_getiuservalue(L, -1, 1) == LUA_TTABLE) luaL_unref(L, -1, t->ref);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    t->ref = LUA_NOREF;
    RW_STACK_EXPECT(L, mark, 0);
    return e;
}

/* transfer:cancel(): aborts a running transfer and closes its connection. */
static int transfer_l_cancel(lua_State *L)
{
    transfer *t = transfer_check(L);
    if (t->state == TRANSFER_RUNNING) {
        transfer_detach(L, t);
        engine_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_CANCELLED);
    }
    return 0;
}

/* Idempotent; transfer:close(), __close and __gc. A running transfer is
 * aborted; a finished one is no longer reported by poll. The record goes
 * back to the engine's pool. */
static int transfer_l_close(lua_State *L)
{
    transfer_box *box = (transfer_box *)luaL_checkudata(L, 1, TRANSFER_MT);
    transfer *t = box->t;
    engine *e;
    if (!t) return 0;
    box->t = NULL;
    e = transfer_detach(L, t);
    if (t->state == TRANSFER_RUNNING) engine_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_CANCELLED);
    else engine_unqueue(t);
    engine_give(e, t);
    return 0;
}

/* Pushes the field name name[0..n) lower-cased. */
static void engine_push_name(lua_State *L, const char *name, size_t n)
{
    char small[128]; /* field names are short: lower-cased on the C stack */
    luaL_Buffer big;
    char *dst = small;
    size_t i;
    if (n > sizeof small) {
        luaL_buffinit(L, &big);
        dst = luaL_prepbuffsize(&big, n);
    }
    for (i = 0; i < n; i++) dst[i] = (char)engine_lower((unsigned char)name[i]);
    if (dst == small) {
        lua_pushlstring(L, small, n);
    } else {
        luaL_addsize(&big, n);
        luaL_pushresult(&big);
    }
}

/* Sets fields[name] = value for the first field of a name. A repeated one
 * goes to lists[name] = {v1, v2, ...} instead, the lists table replacing
 * the nil at index lists at the first repeat: joining there and then,
 * value by value, would copy the joined value once per repeat, which is
 * quadratic. Expects name and value on the stack; pops both. */
static void transfer_add_field(lua_State *L, int fields, int lists)
{
    if (lua_type(L, lists) == LUA_TTABLE) {
        lua_pushvalue(L, -2);
        if (lua_rawget(L, lists) == LUA_TTABLE) { /* name, value, list */
            lua_insert(L, -2);
            lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
            lua_pop(L, 2);
            return;
        }
        lua_pop(L, 1);
    }
    lua_pushvalue(L, -2);
    if (lua_rawget(L, fields) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_rawset(L, fields);
        return;
    }
    if (lua_type(L, lists) != LUA_TTABLE) { /* the block's first repeat */
        lua_createtable(L, 0, 1);
        lua_replace(L, lists);
    }
    lua_createtable(L, 4, 0); /* name, value, first, list */
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 2);
    lua_rawset(L, lists);
}

/* Pushes a table of the fields of block[0..len) (see rwp_header_next):
 * lower-case names, repeated fields joined with ", ", obs-fold lines joined
 * to their field with a space; then, when a name came more than once, a
 * table of every value of each such name in order, or else nil.
 * other_lines: the lines of the block that are no fields (status line,
 * blank line), for sizing the table. */
static void transfer_push_fields(lua_State *L, const char *block, size_t len, size_t other_lines)
{
    rwp_header_field f, next;
    size_t pos = 0, lines = 0;
    const char *q, *end = block ? block + len : NULL;
    int fields, lists, have;
    for (q = block; q && (q = (const char *)memchr(q, '\n', (size_t)(end - q))) != NULL; q++) lines++;
    lua_createtable(L, 0, lines > other_lines ? (int)(lines - other_lines) : 0);
    fields = lua_gettop(L);
    lua_pushnil(L); /* no repeats so far: nothing allocated for them */
    lists = fields + 1;
    have = block && rwp_header_next(block, len, &pos, &f);
    while (have) {
        have = rwp_header_next(block, len, &pos, &next);
        if (f.continuation) { /* not reported before a field; ignored if it were */
            f = next;
            continue;
        }
        engine_push_name(L, f.name, f.name_len);
        if (have && next.continuation) {
            luaL_Buffer b;
            int nonempty = f.value_len > 0;
            luaL_buffinit(L, &b);
            luaL_addlstring(&b, f.value, f.value_len);
            do {
                if (nonempty) luaL_addchar(&b, ' ');
                luaL_addlstring(&b, next.value, next.value_len);
                nonempty = 1;
                have = rwp_header_next(block, len, &pos, &next);
            } while (have && next.continuation);
            luaL_pushresult(&b);
        } else {
            lua_pushlstring(L, f.value, f.value_len);
        }
        transfer_add_field(L, fields, lists);
        f = next;
    }
    if (lua_type(L, lists) == LUA_TTABLE) { /* fields[name]: its values joined once */
        lua_pushnil(L);
        while (lua_next(L, lists)) {
            luaL_Buffer b;
            int list = lua_gettop(L);
            lua_Integer i, n = (lua_Integer)lua_rawlen(L, list);
            lua_pushvalue(L, -2);
            luaL_buffinit(L, &b);
            for (i = 1; i <= n; i++) {
                if (i > 1) luaL_addlstring(&b, ", ", 2);
                lua_rawgeti(L, list, i);
                luaL_addvalue(&b);
            }
            luaL_pushresult(&b);
            lua_rawset(L, fields);
            lua_pop(L, 1);
        }
    }
}

/* Sets res.headers (and res.header_lists, when a name repeats) from the
 * final response's header block, and res.trailers from the lines that came
 * after it, if any is a field, in the table at the top of the stack. */
static void transfer_set_headers(lua_State *L, const transfer *t)
{
    size_t head = t->head_end ? t->head_end : t->head.len;
    transfer_push_fields(L, t->head.data, head, 2); /* less the status line and the blank line */
    if (lua_isnil(L, -1)) lua_pop(L, 1);
    else lua_setfield(L, -3, "header_lists");
    lua_setfield(L, -2, "headers");
    if (t->head.len > head) {
        /* Less their blank line. A trailer's repeats are only joined. */
        transfer_push_fields(L, t->head.data + head, t->head.len - head, 1);
        lua_pop(L, 1);
        lua_pushnil(L);
        if (lua_next(L, -2)) {
            lua_pop(L, 2);
            lua_setfield(L, -2, "trailers");
        } else {
            lua_pop(L, 1);
        }
    }
}

static int transfer_retryable(const transfer *t)
{
    switch (t->code) {
    case CURLE_UNSUPPORTED_PROTOCOL:
        /* With no status line, the server answered with something that is
         * not HTTP ("HTTP/0.9"); with one, a redirect pointed to a scheme
         * that is refused, which no retry will change. */
        return t->status == 0 && t->request_size > 0;
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_PROXY:
        return 1;
    default:
        return 0;
    }
}

static int transfer_tls_failure(CURLcode code)
{
    switch (code) {
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CRL_BADFILE:
        return 1;
    default:
        return 0;
    }
}

static void transfer_setfield_bool(lua_State *L, const char *k, int v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

/* transfer:result() -> response table | nil, error table */
static int transfer_l_result(lua_State *L)
{
    transfer *t = transfer_check(L);
    int line_too_long, request_too_large;
    if (t->state != TRANSFER_DONE) return luaL_argerror(L, 1, "transfer is still running");
    /* libcurl's own cap on a response's headers (300 KiB since 8.3.0, and
     * in distributions' CVE-2023-38039 backports) fails with RECV_ERROR. */
    if (t->code == CURLE_RECV_ERROR && strncmp(t->errbuf, "Too large response headers", 26) == 0)
        t->headers_too_large = 1;
    /* A response header line over CURL_MAX_HTTP_HEADER (100 KiB) fails as
     * OUT_OF_MEMORY; so does a request whose line and headers pass 1 MiB
     * (a long URL), before anything is sent. */
    request_too_large = t->code == CURLE_OUT_OF_MEMORY && !t->out_of_memory && t->request_size == 0;
    line_too_long = t->code == CURLE_OUT_OF_MEMORY && !t->out_of_memory && !t->headers_done && !request_too_large;
    if (t->code == CURLE_OK && !t->aborted) {
        lua_createtable(L, 0, 8); /* room for the two fields fetch adds */
        lua_pushinteger(L, t->status);
        lua_setfield(L, -2, "status");
        transfer_set_headers(L, t);
        lua_pushlstring(L, t->body.data ? t->body.data : "", t->body.len);
        lua_setfield(L, -2, "body");
        if (t->effective_url) {
            lua_pushstring(L, t->effective_url);
            lua_setfield(L, -2, "url");
        }
        lua_pushinteger(L, t->redirects);
        lua_setfield(L, -2, "redirects");
        lua_pushnumber(L, t->total_time);
        lua_setfield(L, -2, "time");
        return 1;
    }
    lua_pushnil(L);
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, t->code);
    lua_setfield(L, -2, "code");
    if (t->aborted == ABORT_CANCELLED) lua_pushliteral(L, "transfer cancelled");
    else if (t->aborted == ABORT_ENGINE_CLOSED) lua_pushliteral(L, "engine closed during the transfer");
    else if (t->aborted == ABORT_MULTI_FAILED)
        lua_pushfstring(L, "libcurl's multi handle failed (%s); the transfer was ended",
                        curl_multi_strerror(t->multi_code));
    else if (t->body_too_large)
        /* %I is lua_pushfstring's lua_Integer, unknown to printf checkers */
        /* cppcheck-suppress invalidLengthModifierError */
        lua_pushfstring(L, "response body too large (limit %I bytes)", (lua_Integer)t->max_body);
    else if (t->headers_too_large)
        lua_pushfstring(L, "response headers too large (limit %d bytes)", ENGINE_MAX_HEADER_BYTES);
    else if (t->out_of_memory) lua_pushliteral(L, "out of memory buffering the response");
    else if (line_too_long) lua_pushliteral(L, "a response header line too large (libcurl's limit is 100 KiB)");
    else if (request_too_large)
        lua_pushliteral(L, "the request is too large to send (libcurl's limit is 1 MiB for the request line "
                           "and headers: a long URL?)");
    else if (t->errbuf[0]) lua_pushstring(L, t->errbuf);
    else lua_pushstring(L, curl_easy_strerror(t->code));
    lua_setfield(L, -2, "message");
    lua_pushstring(L, curl_easy_strerror(t->code));
    lua_setfield(L, -2, "curl");
    transfer_setfield_bool(L, "retryable", !t->aborted && !t->body_too_large
                           && !t->headers_too_large && transfer_retryable(t));
    /* Nothing reached the server: safe to try again whatever the method. */
    transfer_setfield_bool(L, "sent", t->request_size > 0);
    transfer_setfield_bool(L, "timeout", t->code == CURLE_OPERATION_TIMEDOUT);
    transfer_setfield_bool(L, "tls", transfer_tls_failure(t->code));
    transfer_setfield_bool(L, "too_large", t->body_too_large || t->headers_too_large);
    transfer_setfield_bool(L, "cancelled", t->aborted == ABORT_CANCELLED || t->aborted == ABORT_ENGINE_CLOSED);
    if (t->aborted == ABORT_MULTI_FAILED) {
        lua_pushstring(L, curl_multi_strerror(t->multi_code));
        lua_setfield(L, -2, "multi");
    }
    if (t->status > 0) {
        lua_pushinteger(L, t->status);
        lua_setfield(L, -2, "status");
    }
    return 2;
}

static int transfer_l_tostring(lua_State *L)
{
    transfer_box *box = (transfer_box *)luaL_checkudata(L, 1, TRANSFER_MT);
    static const char *const states[] = { "running", "done", "closed" };
    lua_pushfstring(L, "ratewise.Transfer (%s)", states[box->t ? box->t->state : TRANSFER_CLOSED]);
    return 1;
}

/* Pushes a list of names as an array. */
static void engine_push_names(lua_State *L, const char *const *list)
{
    lua_Integer i = 0;
    lua_newtable(L);
    for (; *list; list++) {
        lua_pushstring(L, *list);
        lua_rawseti(L, -2, ++i);
    }
}

void rw_engine_register(lua_State *L)
{
    static const luaL_Reg engine_methods[] = {
        { "start", engine_l_start },
        { "poll", engine_l_poll },
        { "configure", engine_l_configure },
        { "running", engine_l_running },
        { "close", engine_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg engine_meta[] = {
        { "__gc", engine_l_close },
        { "__close", engine_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg transfer_methods[] = {
        { "done", transfer_l_done },
        { "result", transfer_l_result },
        { "cancel", transfer_l_cancel },
        { "close", transfer_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg transfer_meta[] = {
        { "__gc", transfer_l_close },
        { "__close", transfer_l_close },
        { "__tostring", transfer_l_tostring },
        { NULL, NULL }
    };
    luaL_newmetatable(L, ENGINE_MT);
    luaL_setfuncs(L, engine_meta, 0);
    luaL_newlib(L, engine_methods);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    luaL_newmetatable(L, TRANSFER_MT);
    luaL_setfuncs(L, transfer_meta, 0);
    luaL_newlib(L, transfer_methods);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    lua_pushcfunction(L, engine_l_new);
    lua_setfield(L, -2, "engine");
    engine_push_names(L, engine_secret_names);
    lua_setfield(L, -2, "secret_header_names");
    engine_push_names(L, engine_transport_names);
    lua_setfield(L, -2, "transport_header_names");
    lua_pushinteger(L, ENGINE_MAX_REQUEST_HEADER_BYTES);
    lua_setfield(L, -2, "max_request_header_bytes");
}
