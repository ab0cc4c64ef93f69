/*
 * ratewise.Engine and ratewise.Transfer: HTTP transfers on one libcurl multi
 * handle.
 *
 * The engine never sleeps on its own account and never calls Lua from a
 * libcurl callback: the callbacks only append to C buffers owned by the
 * transfer, or record what libcurl wants to wait for, and everything Lua
 * sees is built after libcurl has returned.
 *
 * The engine is pollable, as cqueues calls it: libcurl's socket interface
 * (CURLMOPT_SOCKETFUNCTION, CURLMOPT_TIMERFUNCTION) tells it which sockets
 * to watch, which it keeps in its poller's set (src/poller.c), and when to
 * call back. So a host waits on one descriptor (engine:pollfd(), readable
 * when any socket is ready; none with the poll(2) backend) and one
 * deadline (engine:timeout()), then lets the engine act on what is ready
 * (engine:poll(0), which never blocks). engine:poll(t)
 * waits on that descriptor itself, at most t seconds: the one place the
 * engine blocks, and only when asked to.
 * Connections live in the multi handle's cache, so they are reused across
 * transfers. A transfer's record (its easy handle, its buffers, its error
 * text) lives in C memory and is recycled through a small pool, so that a
 * request leaves almost nothing for the Lua collector: the Lua object is a
 * box holding a pointer. Under a steady load that matters twice: less work
 * for the collector, and a heap that does not grow and shrink at its top
 * every cycle (with glibc that means page faults, which cost more here than
 * the rest of a request).
 */
/* POLLRDHUP (Linux, as epoll is): a peer that closed its side. The name is
 * glibc's feature macro, reserved for just this. */
#define _GNU_SOURCE /* NOLINT(bugprone-reserved-identifier,cert-dcl37-c,cert-dcl51-cpp) */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <poll.h>

#include "poller.h"
#include "transfer.h"

#define ENGINE_MT "ratewise.Engine"
#define TRANSFER_MT "ratewise.Transfer"
#define ENGINE_POOL_MAX 64
/* Engine user values: 1, the boxes of transfers until poll reports them;
 * ENGINE_UV_KEYS, the request fields' names (rw_request_push_keys) and,
 * after them at KEYS_TRANSFER_MT, the transfers' metatable: at hand for
 * engine:start, where luaL_setmetatable's look-up by name in the registry
 * cost LuaJIT some 200 instructions a request. */
#define ENGINE_UV_KEYS 2
#define KEYS_TRANSFER_MT (RF_COUNT + 1)
/* ENGINE_UV_SPARE: transfer boxes closed by a caller that kept no other
 * reference (transfer:result's recycle), for engine:start to hand out
 * again: a box per request is a userdata with a finalizer (and, under Lua
 * 5.1 and LuaJIT, a table for its user values), all of it work for the
 * collector. At most ENGINE_SPARE_MAX, in an array made at that size, so
 * that keeping one never allocates. */
#define ENGINE_UV_SPARE 3
#define ENGINE_NUV 3
#define ENGINE_SPARE_MAX 64

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

/* libcurl's receive buffer: its own default (CURL_MAX_WRITE_SIZE) at most,
 * and down to its minimum when the responses are small; see
 * engine_buffer_size. */
#define ENGINE_RECV_MAX 16384L
#define ENGINE_RECV_MIN 1024L
/* At most this many sockets for libcurl to be given them all at once when
 * they are multiplexed, and at most this many passes over them after one
 * event (engine_drive). */
#define ENGINE_ALL_SOCKETS 16
#define ENGINE_ALL_PASSES 8

/* A pooled record keeps its body buffer for the next response, so that a
 * steady stream of large responses does not allocate (and, past glibc's
 * thresholds, map and fault in) a fresh buffer for each one: a buffer up to
 * ENGINE_KEEP_BUFFER (a 1 MiB body and the byte after it), while the
 * engine's kept buffers stay under ENGINE_KEEP_TOTAL. engine:trim (at the
 * end of rw.run) lets go of all but the small ones. */
#define ENGINE_KEEP_BUFFER (1024 * 1024 + 1)
#define ENGINE_KEEP_TOTAL (32 * 1024 * 1024)
#define ENGINE_KEEP_SMALL (16 * 1024)
/* A header block kept with a pooled record: up to 64 KiB. */
#define ENGINE_KEEP_HEAD (64 * 1024)


typedef struct engine_list {
    transfer *head, *tail;
    int n;
} engine_list;

/* What the engine knows of an https origin's protocol (engine_gate_hold).
 * Not libcurl's CURLOPT_PIPEWAIT: libcurl 7.88 lets the transfers that
 * wait for a first connection go one at a time as transfers end, and a
 * burst to an HTTP/1.1 server went out one request after another on one
 * connection. */
#define ENGINE_GATES 64
enum gate_state { GATE_FREE, GATE_PROBING, GATE_KNOWN };
typedef struct engine_gate {
    unsigned long long key;
    enum gate_state state;
    transfer *held, *held_tail; /* waiting for the probe's answer, in order */
    int sockets;                /* of this origin's connections, open (rw_engine_socket_opened) */
    double last_start;          /* when a transfer last went through this known gate */
} engine_gate;

/* A known origin whose last transfer went through more than this long ago
 * has its idle connections looked at before the next one goes through
 * (engine_gate_stale). */
#define ENGINE_GATE_RECHECK 1.0

/* A held transfer waits for its probe's answer at most this share of its
 * timeout (and of its first_byte_timeout), then goes on without it, on a
 * connection of its own: a probe the server is slow to answer must not end
 * the transfers behind it unsent, and what is left of their time is theirs
 * to be answered in (engine_expiry). */
#define ENGINE_HOLD_SHARE 0.5

typedef struct engine {
    CURLM *multi;
    engine_list running;  /* on the multi handle (running or queued by libcurl) */
    engine_list finished; /* finished, and not yet reported by poll */
    transfer *news;       /* streamed transfers with news for a waiting reader (news_next) */
    engine_gate gates[ENGINE_GATES];
    int gates_answered;   /* a probe's headers came: held transfers go on (engine_gates_release) */
    int gate_next;        /* where the search for a known gate to forget starts (engine_gate_hold) */
    unsigned long long *socket_origin; /* by descriptor: the gate key of its origin (0: none) */
    size_t nsocket_origin;
    transfer *pool[ENGINE_POOL_MAX];
    int npool;
    int nspare; /* boxes in the ENGINE_UV_SPARE array */
    size_t kept; /* bytes of body buffer the pooled records keep */
    double response_bytes; /* moving average of a response's size */
    double next_expiry;    /* no running transfer expires before this (HUGE_VAL: none) */
    long max_connections, max_idle;
    long cache_size; /* CURLMOPT_MAXCONNECTS as last set (engine_size_cache) */
    int renew; /* replace the multi handle once nothing runs (engine_shed) */
    poller poller;   /* the sockets libcurl waits on (open while multi is) */
    unsigned char *watch; /* by descriptor: WATCH_* (see engine_on_watch) */
    size_t nwatch;
    double timer_at; /* when libcurl asked to be called back (HUGE_VAL: it did not) */
    int *fired;      /* descriptors of engine:watch that became ready, not yet reported */
    int nfired, capfired;
    int nwatching;   /* descriptors of engine:watch armed and not yet ready */
    int nwanted;     /* descriptors libcurl waits on now (WATCH_WANTED) */
    unsigned long delivered; /* callbacks that delivered a response's bytes (rw_engine_delivered) */
    int all_again;           /* the last pass over every socket delivered: pass again (engine_drive_all) */
#ifdef RW_FAULTS
    CURLMcode fail_next; /* RW_FAULTS builds: the next drive fails with this */
#endif
} engine;

/* ---- buffers ---- */

static void engine_buf_free(engine_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- engine internals ---- */

/* A pooled record's handle keeps the options that every transfer sets
 * alike; *fresh says whether they still have to be set. NULL: out of memory. */
static int engine_on_close(void *userp, curl_socket_t s);

/* What a handle of engine e has before any request's options, new or
 * reset: libcurl's receive buffer, and the engine's own callback on closed
 * sockets (the record stays with this engine for its whole life,
 * engine_give). */
static void engine_handle_init(engine *e, transfer *t)
{
    t->recv_buffer = ENGINE_RECV_MAX; /* libcurl's default */
    curl_easy_setopt(t->easy, CURLOPT_CLOSESOCKETFUNCTION, engine_on_close);
    curl_easy_setopt(t->easy, CURLOPT_CLOSESOCKETDATA, e);
}

static transfer *engine_take(engine *e, int *fresh)
{
    transfer *t;
    *fresh = e->npool == 0;
    if (e->npool > 0) {
        t = e->pool[--e->npool];
        e->kept -= t->body.cap;
        return t;
    }
    t = (transfer *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->easy = curl_easy_init();
    if (!t->easy) {
        free(t);
        return NULL;
    }
    t->state = TRANSFER_CLOSED;
    t->ref = LUA_NOREF;
    engine_handle_init(e, t);
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

/* Options libcurl cannot put back one by one (TLS files, a pin, a proxy)
 * change from one request on the handle to the next (rw_request_configure):
 * every option is forgotten, and the handle is set up as new, the engine's
 * own callback on closed sockets included. */
void rw_engine_reset(engine *e, transfer *t)
{
    curl_easy_reset(t->easy);
    t->dirty = 0;
    t->timeout_ms = t->connect_timeout_ms = 0;
    t->url_ok = t->lists_set = 0; /* the handle has neither any more */
    engine_handle_init(e, t);
}

static void engine_destroy(transfer *t)
{
    curl_easy_cleanup(t->easy);
    curl_url_cleanup(t->uh); /* the handle used it until now */
    rw_request_free_headers(t);
    engine_buf_free(&t->lines);
    engine_buf_free(&t->url);
    engine_buf_free(&t->reset_sig);
    engine_buf_free(&t->reset_next);
    engine_buf_free(&t->body);
    engine_buf_free(&t->head);
    rwd_free(t->decoder);
    free(t);
}

/* Back to the pool of engine e (NULL, or closed: freed instead), with what
 * the last request left behind let go of. */
static void engine_news_drop(engine *e, transfer *t)
{
    transfer **p;
    if (!e || !t->in_news) return;
    for (p = &e->news; *p; p = &(*p)->news_next) {
        if (*p == t) {
            *p = t->news_next;
            break;
        }
    }
    t->in_news = 0;
    t->news_next = NULL;
}

static void engine_give(engine *e, transfer *t)
{
    engine_news_drop(e, t);
    /* Its header lists stay with it, for a next request with the same
     * lines (rw_request_configure). */
    free(t->effective_url);
    free(t->origin);
    t->effective_url = t->origin = NULL;
    if (!e || !e->multi || e->npool >= ENGINE_POOL_MAX) {
        engine_destroy(t);
        return;
    }
    if (t->body.cap > ENGINE_KEEP_BUFFER || e->kept + t->body.cap > ENGINE_KEEP_TOTAL) engine_buf_free(&t->body);
    e->kept += t->body.cap;
    if (t->head.cap > ENGINE_KEEP_HEAD) engine_buf_free(&t->head);
    t->body.len = t->head.len = t->head_end = 0;
    t->headers_done = t->body_too_large = t->headers_too_large = t->out_of_memory = 0;
    t->aborted = ABORT_NONE;
    t->code = CURLE_OK;
    t->multi_code = CURLM_OK;
    t->errbuf[0] = '\0';
    t->timeout = t->started = t->expires = 0;
    t->head_ready = t->stream = t->paused = t->notify = 0;
    t->gate_key = 0;
    t->gate_slot = t->gate_probe = t->held = 0;
    t->held_next = NULL;
    t->delivered = t->skipped = 0;
    t->bounded = 0;
    t->encoded = t->decoding = t->decode_failed = 0;
    t->decode_taken = 0;
    if (t->decoder) rwd_reset(t->decoder); /* what a coding holds (a window of MiBs) is not kept */
    t->no_replay = t->replay_refused = t->prereq_asked = 0;
    t->first_byte_timeout = t->idle_timeout = t->last_byte = 0;
    t->status = t->request_size = t->redirects = t->http_version = 0;
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
 * 1,280 requests, 1,280 connections). So the cache grows with the most
 * transfers on the multi handle at once, never under max_idle, and never
 * shrinks as they end: a burst's connections stay for its next wave (a
 * cache shrinking as transfers ended closed the connections of the first
 * to end whenever a wave ended over several performs), until the caller
 * says the burst is over (engine:trim, see engine_shed). */
static void engine_size_cache(engine *e)
{
    long size = e->running.n > e->max_idle ? (long)e->running.n : e->max_idle;
    if (size <= e->cache_size) return;
    e->cache_size = size;
    if (size > e->max_idle) e->renew = 1;
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, size);
}

/* What the poller's set holds for a descriptor (engine.watch[fd]). libcurl
 * stops watching a connection each time a transfer on it ends and watches
 * it again for the next one, which reuses it: taking it out of the set and
 * putting it back would cost two or three system calls a request (a
 * quarter more CPU in the concurrent benchmark). So a connection libcurl
 * no longer wants stays in the set, marked unwanted, until it reports an
 * event (then it leaves: an idle connection the server closes would stay
 * readable for ever) or is closed (engine_on_close; closing takes it out of
 * the set). */
#define WATCH_IN 1u
#define WATCH_OUT 2u
#define WATCH_IN_SET 4u
#define WATCH_WANTED 8u
/* A descriptor the Lua layer watches (engine:watch: a Redis connection),
 * not libcurl: armed once (POLLER_ONESHOT), reported by poll when ready. */
#define WATCH_FOREIGN 16u
#define WATCH_ARMED 32u

/* table (*n entries of `size` bytes, by descriptor) grown to reach
 * descriptor s, the new entries zero: the table to use from now on, or NULL
 * when out of memory (the old one is then as it was). */
static void *engine_fd_table(void *table, size_t *n, size_t size, curl_socket_t s)
{
    size_t want = *n ? *n : 64;
    char *grown;
    if ((size_t)s < *n) return table;
    while (want <= (size_t)s) want *= 2;
    grown = (char *)realloc(table, want * size);
    if (!grown) return NULL;
    memset(grown + *n * size, 0, (want - *n) * size);
    *n = want;
    return grown;
}

static unsigned char *engine_watch_slot(engine *e, curl_socket_t s)
{
    unsigned char *watch;
    if (s < 0 || !(watch = (unsigned char *)engine_fd_table(e->watch, &e->nwatch, 1, s))) return NULL;
    e->watch = watch;
    return &e->watch[s];
}

/* Sets a descriptor's WATCH_* bits, counting those libcurl waits on. */
static void engine_watch_put(engine *e, unsigned char *slot, unsigned char bits)
{
    e->nwanted += ((bits & WATCH_WANTED) != 0) - ((*slot & WATCH_WANTED) != 0);
    *slot = bits;
}

/* libcurl says which sockets it waits on, and for what: the engine keeps
 * them in its poller's set. C only. */
static int engine_on_watch(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    engine *e = (engine *)userp;
    unsigned char *slot = engine_watch_slot(e, s), want;
    (void)easy;
    (void)socketp;
    if (!slot) return -1; /* out of memory: libcurl gives the multi handle up (engine_drive) */
    if (what == CURL_POLL_REMOVE) {
        engine_watch_put(e, slot, (unsigned char)(*slot & ~WATCH_WANTED));
        return 0;
    }
    want = (unsigned char)(((what & CURL_POLL_IN) ? WATCH_IN : 0u) | ((what & CURL_POLL_OUT) ? WATCH_OUT : 0u));
    if ((*slot & WATCH_IN_SET) && (*slot & (WATCH_IN | WATCH_OUT)) == want) {
        engine_watch_put(e, slot, (unsigned char)(*slot | WATCH_WANTED));
        return 0;
    }
    if (poller_set(&e->poller, s, ((want & WATCH_IN) ? POLLER_IN : 0u) | ((want & WATCH_OUT) ? POLLER_OUT : 0u),
                   (*slot & WATCH_IN_SET) != 0)
        != 0)
        return -1; /* out of memory: libcurl gives the multi handle up (engine_drive) */
    engine_watch_put(e, slot, (unsigned char)(want | WATCH_IN_SET | WATCH_WANTED));
    return 0;
}

static engine_gate *engine_gate_find(engine *e, unsigned long long key)
{
    int i;
    for (i = 0; i < ENGINE_GATES; i++)
        if (e->gates[i].state != GATE_FREE && e->gates[i].key == key) return &e->gates[i];
    return NULL;
}

void rw_engine_socket_opened(transfer *t, int fd)
{
    engine *e = t->engine;
    unsigned long long *origins;
    engine_gate *g;
    if (!e || !t->gate_key || fd < 0) return;
    origins = (unsigned long long *)engine_fd_table(e->socket_origin, &e->nsocket_origin, sizeof *origins, fd);
    if (!origins) return; /* not counted: the origin is only forgotten later */
    e->socket_origin = origins;
    g = engine_gate_find(e, t->gate_key);
    if (!g) return;
    e->socket_origin[fd] = t->gate_key;
    g->sockets++;
}

/* Socket fd of a counted origin is closed, or was found closed by its peer
 * while idle: the last one gone, a known origin is forgotten. */
static void engine_socket_gone(engine *e, int fd)
{
    engine_gate *g;
    if (fd < 0 || (size_t)fd >= e->nsocket_origin || !e->socket_origin[fd]) return;
    g = engine_gate_find(e, e->socket_origin[fd]);
    e->socket_origin[fd] = 0;
    if (g && g->sockets > 0 && --g->sockets == 0 && g->state == GATE_KNOWN && !g->held) g->state = GATE_FREE;
}

/* libcurl closes a socket: it leaves the poller's set with it. The last of an
 * origin's connections closed, the engine forgets what it knew of it: a
 * server that closed its idle connection (an HTTP/2 server's idle timeout,
 * minutes at most) would otherwise see the next burst open a connection
 * for each request, as libcurl forgets too that the origin multiplexes; and
 * another server may answer on that port next. C only. */
static int engine_on_close(void *userp, curl_socket_t s)
{
    engine *e = (engine *)userp;
    if (s < 0) return 0;
    if ((size_t)s < e->nwatch) engine_watch_put(e, &e->watch[s], 0);
    poller_closing(&e->poller, s);
    engine_socket_gone(e, s);
    return close(s);
}

/* libcurl says when to call it back (0: at once; -1: never). C only. */
static int engine_on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    engine *e = (engine *)userp;
    (void)multi;
    e->timer_at = timeout_ms < 0 ? HUGE_VAL : rw_clock_monotonic() + (double)timeout_ms / 1000.0;
    return 0;
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
 * a multi handle that failed used again. Only the caller knows when a
 * burst is over: a poll that finds every transfer finished may be a moment
 * between two waves of a steady stream, whose next transfers would then
 * all reconnect. So it happens when the scheduler says nothing it runs
 * needs a transfer (engine:trim()), or after a failure. */
/* A multi handle that reports to engine e; NULL: out of memory. */
static CURLM *engine_new_multi(engine *e)
{
    CURLM *multi = curl_multi_init();
    if (!multi) return NULL;
    curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, engine_on_watch);
    curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, e);
    curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, engine_on_timer);
    curl_multi_setopt(multi, CURLMOPT_TIMERDATA, e);
    return multi;
}

static void engine_shed(engine *e)
{
    CURLM *fresh;
    if (!e->renew || e->running.head) return;
    fresh = engine_new_multi(e);
    if (!fresh) return; /* out of memory: the old one does */
    /* Closing its connections also takes them out of the poller's set. */
    curl_multi_cleanup(e->multi);
    e->multi = fresh;
    e->renew = 0;
    /* Its connections are gone: what the gates knew of each origin goes
     * with them (nothing runs, so nothing is held). */
    memset(e->gates, 0, sizeof e->gates);
    e->timer_at = HUGE_VAL;
    engine_apply_limits(e);
}

/* The bytes of request the handle sent on its last hop. A transfer's
 * request_size counts every hop: a POST a redirect took elsewhere reached
 * the server, even if the next hop could not connect. */
static long engine_sent(transfer *t)
{
    long sent = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_REQUEST_SIZE, &sent) != CURLE_OK || sent < 0) return 0;
    return sent;
}

static void engine_finish(transfer *t, CURLcode code, enum transfer_abort aborted);
static void engine_queue(engine *e, transfer *t);

/* ---- the gate: one probe per https origin not yet known ---- */

/* Whether known gate g's origin has no connection left: when no transfer
 * went through it for ENGINE_GATE_RECHECK, its connections libcurl keeps
 * idle are looked at (one poll), and those the server closed (an HTTP/2
 * GOAWAY and a FIN, say) no longer count; one that only has something to
 * say (an HTTP/2 PING) still does.
 * libcurl itself finds them dead only as the next transfer looks for a
 * connection, after the engine has let the whole burst go; without this,
 * a burst after an idle timeout opened a connection for each request. An
 * origin without a connection is forgotten (the gate is then free). */
static int engine_gate_stale(engine *e, engine_gate *g)
{
    struct pollfd fds[64];
    double now = rw_clock_monotonic();
    size_t fd = 0;
    int n, i;
    if (now - g->last_start <= ENGINE_GATE_RECHECK) {
        g->last_start = now;
        return 0;
    }
    g->last_start = now;
    while (fd < e->nsocket_origin && g->state == GATE_KNOWN) {
        for (n = 0; fd < e->nsocket_origin && n < 64; fd++) {
            if (e->socket_origin[fd] != g->key) continue;
            if (fd < e->nwatch && (e->watch[fd] & WATCH_WANTED)) continue; /* a transfer's: in use */
            fds[n].fd = (int)fd;
            fds[n].events = POLLRDHUP;
            fds[n].revents = 0;
            n++;
        }
        if (n == 0 || poll(fds, (nfds_t)n, 0) <= 0) continue;
        for (i = 0; i < n; i++)
            if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) engine_socket_gone(e, fds[i].fd);
    }
    if (g->state == GATE_KNOWN && g->sockets == 0 && !g->held) g->state = GATE_FREE;
    return g->state == GATE_FREE;
}

/* Whether t is to wait for its origin's first answer. The first transfer
 * to an https origin the engine knows nothing of is its probe and goes on;
 * those that come while it has not answered are held (not yet on the multi
 * handle) until its final headers say whether the connection multiplexes:
 * then they all go at once, and share that connection if it is HTTP/2, or
 * open their own if not. Answers 1 when t is held. */
static int engine_gate_hold(engine *e, transfer *t)
{
    int i, free_slot = -1;
    engine_gate *g;
    t->gate_slot = t->gate_probe = t->held = 0;
    t->held_next = NULL;
    if (!t->gate_key) return 0;
    g = engine_gate_find(e, t->gate_key);
    if (g && g->state == GATE_KNOWN && !engine_gate_stale(e, g)) return 0;
    if (g && g->state == GATE_PROBING) {
        t->gate_slot = (int)(g - e->gates) + 1;
        t->held = 1;
        if (g->held_tail) g->held_tail->held_next = t;
        else g->held = t;
        g->held_tail = t;
        return 1;
    }
    if (g) free_slot = (int)(g - e->gates); /* forgotten just now: t probes it again */
    for (i = 0; i < ENGINE_GATES && free_slot < 0; i++)
        if (e->gates[i].state == GATE_FREE) free_slot = i;
    if (free_slot < 0) {
        /* Every gate in use: a known origin is forgotten, taken in turn
         * (its next burst is probed again), so that a program that has
         * talked to more origins than there are gates still gates a new
         * one. A known gate holds nothing once engine_gates_release ran. */
        for (i = 0; i < ENGINE_GATES && free_slot < 0; i++) {
            int j = (e->gate_next + i) % ENGINE_GATES;
            if (e->gates[j].state == GATE_KNOWN && !e->gates[j].held) free_slot = j;
        }
        if (free_slot < 0) return 0; /* every gate probing: no gate */
        e->gate_next = (free_slot + 1) % ENGINE_GATES;
    }
    g = &e->gates[free_slot];
    g->key = t->gate_key;
    g->state = GATE_PROBING;
    g->held = g->held_tail = NULL;
    g->sockets = 0;
    g->last_start = rw_clock_monotonic();
    t->gate_slot = free_slot + 1;
    t->gate_probe = 1;
    return 0;
}

/* Held transfer t, out of its gate's line, goes on: onto the multi
 * handle. Not from a libcurl callback: curl_multi_add_handle refuses to run
 * inside one. */
static void engine_gate_go(engine *e, transfer *t)
{
    CURLMcode mc;
    t->held = 0;
    t->gate_slot = 0;
    t->held_next = NULL;
    mc = curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        engine_finish(t, CURLE_OUT_OF_MEMORY, ABORT_NONE);
        (void)snprintf(t->errbuf, sizeof t->errbuf, "libcurl could not start the transfer (%s)",
                       curl_multi_strerror(mc));
        engine_queue(e, t);
    }
}

/* The transfers a gate held go on, in order. */
static void engine_gate_open(engine *e, engine_gate *g)
{
    transfer *t = g->held;
    g->held = g->held_tail = NULL;
    while (t) {
        transfer *next = t->held_next;
        engine_gate_go(e, t);
        t = next;
    }
}

/* Held transfer t leaves its gate's line. */
static void engine_gate_unlink(engine_gate *g, transfer *t)
{
    transfer **p, *prev = NULL;
    for (p = &g->held; *p; prev = *p, p = &(*p)->held_next) {
        if (*p == t) {
            *p = t->held_next;
            if (g->held_tail == t) g->held_tail = prev;
            break;
        }
    }
    t->held = 0;
}

void rw_engine_delivered(transfer *t)
{
    if (t->engine) t->engine->delivered++;
}

void rw_engine_answered(transfer *t)
{
    engine *e = t->engine;
    if (!e || !t->gate_probe || !t->gate_slot) return;
    e->gates[t->gate_slot - 1].state = GATE_KNOWN;
    t->gate_probe = 0;
    t->gate_slot = 0;
    e->gates_answered = 1;
}

/* After libcurl returns: the gates whose probe answered let their
 * transfers go. */
static void engine_gates_release(engine *e)
{
    int i;
    if (!e->gates_answered) return;
    e->gates_answered = 0;
    for (i = 0; i < ENGINE_GATES; i++)
        if (e->gates[i].state == GATE_KNOWN && e->gates[i].held) engine_gate_open(e, &e->gates[i]);
}

/* A transfer that ends while its gate still counts on it: a held one
 * leaves the line; a probe that ends before an answer leaves its origin
 * unknown, and those it held go on without a gate. */
static void engine_gate_leave(engine *e, transfer *t)
{
    engine_gate *g = &e->gates[t->gate_slot - 1];
    if (t->held) {
        engine_gate_unlink(g, t);
    } else if (t->gate_probe) {
        t->gate_probe = 0;
        if (g->state == GATE_PROBING) {
            g->state = GATE_FREE;
            t->gate_slot = 0;
            engine_gate_open(e, g);
        }
    }
    t->gate_slot = 0;
    t->held_next = NULL;
}

/* Takes a running transfer off the multi handle, keeping what libcurl knows
 * about its outcome. Its engine forgets it: see engine_queue. */
static void engine_finish(transfer *t, CURLcode code, enum transfer_abort aborted)
{
    engine *e = t->engine;
    CURL *easy = t->easy;
    double hop_time = 0;
    int held;
    if (!e) return;
    held = t->held;
    if (t->gate_slot) engine_gate_leave(e, t);
    engine_news_drop(e, t); /* finished, it is reported once, as such */
    if (aborted == ABORT_NONE && !held) code = rw_response_end(t, code);
    t->code = code;
    t->aborted = aborted;
    /* Only whole responses say what size the responses are. */
    if (code == CURLE_OK && aborted == ABORT_NONE)
        e->response_bytes += ((double)(t->head.len + t->body.len) - e->response_bytes) / 8;
    /* A held transfer never ran, and was never added: what the handle
     * knows is its last request's (a status, bytes sent), not this one's. */
    if (!held) {
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &t->status);
        curl_easy_getinfo(easy, CURLINFO_HTTP_VERSION, &t->http_version);
        t->request_size += engine_sent(t);
        if (curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME, &hop_time) == CURLE_OK) t->total_time += hop_time;
        /* Removing a transfer that has not completed closes its
         * connection instead of returning it to the cache, which is what
         * an abort needs. */
        curl_multi_remove_handle(e->multi, easy);
    }
    engine_list_remove(&e->running, t);
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

/* What the engine ends a transfer for, libcurl having no timer for it. */
enum engine_expiry_kind { EXPIRY_NONE, EXPIRY_TIMEOUT, EXPIRY_FIRST_BYTE, EXPIRY_IDLE, EXPIRY_HOLD };

/* When the engine ends a running transfer if libcurl has not: its timeout
 * (libcurl's own, but not for a transfer queued for a connection: see
 * ENGINE_EXPIRY_GRACE); until its final headers are in, its
 * first_byte_timeout; then, while the reader keeps up (not paused), its
 * idle_timeout after the last body bytes. A held transfer is not ended but
 * let go unheld, at its share of those (ENGINE_HOLD_SHARE). HUGE_VAL:
 * never. */
static double engine_expiry(const transfer *t, enum engine_expiry_kind *kind)
{
    double at = HUGE_VAL;
    *kind = EXPIRY_NONE;
    /* A stream's timeout bounds it until a 2xx's headers are in; an answer
     * read whole (any other) stays under it to its end. */
    if (t->expires > 0 && !(t->stream && t->head_ready && !t->bounded)) {
        at = t->expires;
        *kind = EXPIRY_TIMEOUT;
    }
    if (t->first_byte_timeout > 0 && !t->head_ready && t->started + t->first_byte_timeout < at) {
        at = t->started + t->first_byte_timeout;
        *kind = EXPIRY_FIRST_BYTE;
    }
    if (t->idle_timeout > 0 && t->head_ready && !t->paused && t->last_byte + t->idle_timeout < at) {
        at = t->last_byte + t->idle_timeout;
        *kind = EXPIRY_IDLE;
    }
    if (t->held && at != HUGE_VAL) {
        at = t->started + (at - t->started) * ENGINE_HOLD_SHARE;
        *kind = EXPIRY_HOLD;
    }
    return at;
}

void rw_engine_progress(transfer *t)
{
    engine *e = t->engine;
    enum engine_expiry_kind kind;
    double at;
    if (!e || t->state != TRANSFER_RUNNING) return;
    if (t->notify && !t->in_news) {
        t->notify = 0;
        t->in_news = 1;
        t->news_next = e->news;
        e->news = t;
    }
    at = engine_expiry(t, &kind);
    if (at < e->next_expiry) e->next_expiry = at;
}

/* Ends the transfers whose time is up by engine_expiry. Scans the running
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
        enum engine_expiry_kind kind;
        double at = engine_expiry(t, &kind);
        after = t->next;
        if (now < at) {
            if (at < next) next = at;
            continue;
        }
        if (kind == EXPIRY_HOLD) {
            engine_gate_unlink(&e->gates[t->gate_slot - 1], t);
            engine_gate_go(e, t);
            if (t->state == TRANSFER_RUNNING) {
                at = engine_expiry(t, &kind);
                if (at < next) next = at;
            }
            continue;
        }
        engine_finish(t, CURLE_OPERATION_TIMEDOUT, ABORT_NONE);
        if (kind == EXPIRY_FIRST_BYTE)
            (void)snprintf(t->errbuf, sizeof t->errbuf,
                           "no response headers within %.0f milliseconds (first_byte_timeout)",
                           t->first_byte_timeout * 1000);
        else if (kind == EXPIRY_IDLE)
            (void)snprintf(t->errbuf, sizeof t->errbuf,
                           "no body bytes for %.0f milliseconds (idle_timeout)", t->idle_timeout * 1000);
        else if (t->request_size == 0)
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
            for (i = 0; out[i]; i++) out[i] = (char)transfer_lower((unsigned char)out[i]);
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
    t->request_size += engine_sent(t);
    curl_multi_remove_handle(e->multi, t->easy); /* a completed transfer: its connection is kept */
    if ((status == 303 && t->method != METHOD_HEAD) || ((status == 301 || status == 302) && t->method == METHOD_POST)) {
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, (char *)NULL);
        curl_easy_setopt(t->easy, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(t->easy, CURLOPT_CUSTOMREQUEST, (char *)NULL);
        t->dirty |= DIRTY_BODY | DIRTY_METHOD;
        t->method = METHOD_GET;
    }
    t->lines_ok = 0; /* the lists below may be cut: built afresh for the next request */
    t->url_ok = 0;   /* the handle goes elsewhere */
    if (t->secret_headers) {
        if (t->public_tail) t->public_tail->next = same_origin ? t->secret_headers : NULL;
        curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, same_origin || t->public_tail ? t->headers : NULL);
    }
    curl_easy_setopt(t->easy, CURLOPT_CURLU, (CURLU *)NULL); /* it would take precedence */
    curl_easy_setopt(t->easy, CURLOPT_URL, next_url);        /* copied */
    free(t->effective_url);
    t->effective_url = next_url;
    if (t->timeout > 0 && !t->stream) { /* a stream's is the engine's (engine_expiry) */
        t->timeout_ms = transfer_ms(left);
        curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, t->timeout_ms);
    }
    t->body.len = 0; /* the redirect's own body is not the answer */
    t->prereq_asked = 0; /* a new hop: its first sending is its own (request_on_prereq) */
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

#define ENGINE_EVENTS 64

/* A watched descriptor is ready: it is reported by the next poll. Its slot
 * in `fired` was made when it was armed, so this cannot fail. */
static void engine_fire(engine *e, int fd)
{
    if (!(e->watch[fd] & WATCH_ARMED)) return;
    e->watch[fd] &= (unsigned char)~WATCH_ARMED;
    e->nwatching--;
    e->fired[e->nfired++] = fd;
}

/* libcurl is given every socket at once (engine_drive), pass after pass
 * while a pass delivered anything: a pass runs each transfer once, and
 * bytes that a later transfer's read brought in for one whose turn had
 * passed stay in libcurl's buffers, with no timer set and the socket
 * drained (such a transfer waited for the next event: a second, until the
 * server's idle timeout closed the connection, and the next burst opened
 * another). Past the last pass or the budget, the next drive passes again
 * without waiting (all_again). */
static CURLMcode engine_drive_all(engine *e, double until, int *running)
{
    CURLMcode mc;
    int passes = 0;
    unsigned long before;
    do {
        before = e->delivered;
        /* curl_multi_socket_all: deprecated for curl_multi_socket_action,
         * which has no form for "every socket" but this one (libcurl keeps it) */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
        /* cppcheck-suppress curl_multi_socket_allCalled */
        mc = curl_multi_socket_all(e->multi, running);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    } while (mc == CURLM_OK && e->delivered != before && ++passes < ENGINE_ALL_PASSES
             && !(until > 0 && rw_clock_monotonic() >= until));
    e->all_again = mc == CURLM_OK && e->delivered != before;
    return mc;
}

/* Waits at most `seconds` (0: not at all) for a socket libcurl watches, lets
 * libcurl act on the sockets that are ready and on its timer if it is due,
 * then gathers what finished. With a `budget` (seconds; 0: none), libcurl
 * is given no more sockets once that much time has passed after the wait:
 * the sockets left stay ready in the poller's set (level-triggered) and its
 * timer stays due, so the next drive takes them up, and a frame loop's step
 * stays short however many transfers move at once. A failure of the multi
 * handle (or of the OS wait) ends every running transfer with it. */
static void engine_drive(engine *e, double seconds, double budget)
{
    poller_event ev[ENGINE_EVENTS];
    CURLMcode mc = CURLM_OK;
    int n, i, running, spent = 0; /* spent: the budget is, and the clock need not be read again */
    /* Multiplexed connections (HTTP/2: two transfers a socket or more, on
     * a few sockets): an event on a socket makes libcurl 7.88 run every
     * transfer on it, drive after drive, each after the first polling the
     * socket again (more than twice the plain multi's polls for a 64 KiB
     * response: bench/http2.lua h2_64k). Then libcurl is given every socket
     * at once, one pass over the transfers as curl_multi_perform makes,
     * which is what the plain contender does.
     * Not with many sockets (a pass would poll each connection that has
     * nothing to read), and with a budget (a frame's step, OpenResty's
     * driver) only on one socket, where a pass is no longer than that
     * socket's own turn: socket by socket there, so that a step can stop
     * between them. */
    int all = e->nwanted > 0 && e->nwanted <= (budget > 0 ? 1 : ENGINE_ALL_SOCKETS)
              && e->running.n >= 2 * e->nwanted,
        any = 0;
    double until;
    n = poller_wait(&e->poller, ev, ENGINE_EVENTS, seconds);
    until = budget > 0 ? rw_clock_monotonic() + budget : 0;
    if (n < 0) {
        n = 0;
        if (errno != EINTR) mc = CURLM_UNRECOVERABLE_POLL;
    }
    for (i = 0; i < n && mc == CURLM_OK; i++) {
        int fd = ev[i].fd;
        int flags = ((ev[i].events & POLLER_IN) ? CURL_CSELECT_IN : 0) | ((ev[i].events & POLLER_OUT) ? CURL_CSELECT_OUT : 0)
                    | ((ev[i].events & POLLER_ERR) ? CURL_CSELECT_ERR : 0);
        if (fd >= 0 && (size_t)fd < e->nwatch && (e->watch[fd] & WATCH_FOREIGN)) {
            engine_fire(e, fd);
            continue;
        }
        if (fd >= 0 && (size_t)fd < e->nwatch && !(e->watch[fd] & WATCH_WANTED)) {
            /* a connection libcurl no longer watches (see WATCH_IN) */
            poller_del(&e->poller, fd);
            e->watch[fd] = 0;
            continue;
        }
        if (!spent && until > 0 && rw_clock_monotonic() >= until) spent = 1;
        if (spent) continue; /* watched descriptors still fire */
        if (all) {
            any = 1;
            continue;
        }
        mc = curl_multi_socket_action(e->multi, fd, flags, &running);
    }
    if ((any || e->all_again) && mc == CURLM_OK) mc = engine_drive_all(e, until, &running);
    if (mc == CURLM_OK && !spent && e->timer_at != HUGE_VAL) {
        double now = rw_clock_monotonic();
        if (now >= e->timer_at && !(until > 0 && now >= until)) {
            e->timer_at = HUGE_VAL; /* libcurl sets the next one */
            mc = curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        }
    }
#ifdef RW_FAULTS
    if (e->fail_next != CURLM_OK) {
        mc = e->fail_next;
        e->fail_next = CURLM_OK;
    }
#endif
    if (mc == CURLM_OK) engine_gates_release(e);
    engine_drain(e);
    if (mc != CURLM_OK) {
        engine_fail_all(e, mc);
        engine_shed(e);
    } else {
        engine_expire(e);
    }
}

/* Seconds until the engine has something to do without a socket becoming
 * ready: libcurl's timer, a queued transfer's expiry, or now when finished
 * transfers wait to be reported. Negative: nothing (no deadline). */
static double engine_deadline(const engine *e)
{
    double at = e->timer_at < e->next_expiry ? e->timer_at : e->next_expiry, left;
    if (e->finished.head || e->nfired || e->news || e->all_again) return 0;
    if (at == HUGE_VAL) return -1;
    left = at - rw_clock_monotonic();
    return left > 0 ? left : 0;
}

static engine *engine_check(lua_State *L)
{
    engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
    if (!e->multi) luaL_argerror(L, 1, "engine is closed");
    return e;
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
    e = (engine *)lua_newuserdatauv(L, sizeof(engine), ENGINE_NUV);
    memset(e, 0, sizeof *e); /* closed until the multi handle exists */
    e->response_bytes = (double)ENGINE_RECV_MAX * 2; /* libcurl's default until responses are seen */
    e->next_expiry = HUGE_VAL;
    e->timer_at = HUGE_VAL;
    e->max_connections = conns;
    e->max_idle = idle;
    luaL_setmetatable(L, ENGINE_MT);
    /* The boxes of transfers until poll reports them (luaL_ref), which also
     * keeps them alive. */
    lua_createtable(L, ENGINE_POOL_MAX, 0);
    lua_setiuservalue(L, -2, 1);
    rw_request_push_keys(L); /* the request fields' names, made once */
    luaL_getmetatable(L, TRANSFER_MT);
    lua_rawseti(L, -2, KEYS_TRANSFER_MT);
    lua_setiuservalue(L, -2, ENGINE_UV_KEYS);
    lua_createtable(L, ENGINE_SPARE_MAX, 0);
    lua_setiuservalue(L, -2, ENGINE_UV_SPARE);
    if (poller_open(&e->poller) != 0) {
        int err = errno;
        lua_pop(L, 1);
        lua_pushnil(L);
        lua_pushfstring(L, "the engine cannot wait on sockets (" POLLER_NAME "): %s", strerror(err));
        return 2;
    }
    e->multi = engine_new_multi(e);
    if (!e->multi) {
        poller_close(&e->poller);
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

/* engine:start(request [, owner]) -> transfer. Misuse raises; a transfer
 * that cannot be started gives nil, err. owner (any value but nil: the task
 * waiting for the transfer) is kept with the transfer, and the poll that
 * reports it finished names it in its owners table (transfer:set_owner). */
static int engine_l_start(lua_State *L)
{
    engine *e = engine_check(L);
    transfer_box *box;
    transfer *t;
    CURLMcode mc;
    long recv_buffer;
    int fresh, tidx, keys, owned;
    luaL_checktype(L, 2, LUA_TTABLE);
    owned = !lua_isnoneornil(L, 3); /* read before the names go on the stack */
    lua_getiuservalue(L, 1, ENGINE_UV_KEYS);
    keys = lua_gettop(L);
    tidx = keys + 1;
    if (e->nspare > 0) {
        /* a box transfer:result recycled: its metatable and engine are
         * set, its body and owner cleared */
        lua_getiuservalue(L, 1, ENGINE_UV_SPARE);
        lua_rawgeti(L, -1, e->nspare);
        lua_pushnil(L);
        lua_rawseti(L, -3, e->nspare);
        e->nspare--;
        lua_remove(L, tidx);
        box = (transfer_box *)lua_touserdata(L, tidx);
    } else {
        box = (transfer_box *)lua_newuserdatauv(L, sizeof(transfer_box), TRANSFER_NUV);
        box->t = NULL;
        lua_rawgeti(L, keys, KEYS_TRANSFER_MT);
        lua_setmetatable(L, tidx);
        lua_pushvalue(L, 1);
        lua_setiuservalue(L, tidx, TRANSFER_UV_ENGINE);
    }
    if (owned) {
        lua_pushvalue(L, 3);
        lua_setiuservalue(L, tidx, TRANSFER_UV_OWNER);
    }

    t = engine_take(e, &fresh);
    if (!t) {
        lua_settop(L, keys - 1);
        lua_pushnil(L);
        lua_pushliteral(L, "libcurl could not create an easy handle");
        return 2;
    }
    box->t = t; /* from here on __gc gives the record back, whatever happens */
    t->state = TRANSFER_DONE;
    rw_request_configure(L, e, t, 2, keys, tidx, fresh); /* may raise */
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
    t->engine = e; /* for the gate's lists */
    mc = engine_gate_hold(e, t) ? CURLM_OK : curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        if (t->gate_probe) { /* no probe after all: the origin stays unknown */
            e->gates[t->gate_slot - 1].state = GATE_FREE;
            t->gate_probe = t->gate_slot = 0;
        }
        t->engine = NULL;
        luaL_unref(L, -1, t->ref);
        t->ref = LUA_NOREF;
        box->t = NULL;
        engine_give(e, t);
        lua_settop(L, keys - 1);
        lua_pushnil(L);
        lua_pushstring(L, curl_multi_strerror(mc));
        return 2;
    }
    lua_pop(L, 1);
    lua_replace(L, keys); /* the box, in the names' place */
    t->state = TRANSFER_RUNNING;
    t->engine = e;
    engine_list_add(&e->running, t);
    engine_size_cache(e);
    t->started = rw_clock_monotonic();
    if (t->timeout > 0) t->expires = t->started + t->timeout + ENGINE_EXPIRY_GRACE;
    {
        enum engine_expiry_kind kind;
        double at = engine_expiry(t, &kind);
        if (at < e->next_expiry) e->next_expiry = at;
    }
    return 1;
}

/* owners[n] (when the caller gave that table): false, for an entry of out
 * that has no owner (news of a stream, a descriptor). */
static void engine_no_owner(lua_State *L, int owners, int n)
{
    if (!owners) return;
    lua_pushboolean(L, 0);
    lua_rawseti(L, owners, n); /* may raise: out of memory */
}

/* Puts the finished transfers in the table at index out, from out[1] on,
 * and returns how many; with owners (an index, or 0), owners[i] is the
 * owner engine:start gave out[i], or false. Each leaves the finished list
 * (and the engine's table of references) only once it is in out: when a
 * Lua allocation fails halfway, the rest are still there for the next
 * poll. */
static int engine_report(lua_State *L, engine *e, int out, int owners)
{
    RW_STACK_MARK(L, mark);
    int n = 0;
    lua_getiuservalue(L, 1, 1);
    /* Streamed transfers with news first: a finished one's reference goes
     * below. They stay running (their references stay). Their news wakes
     * whoever waits for it, not an owner. */
    while (e->news) {
        transfer *t = e->news;
        if (t->ref != LUA_NOREF) {
            engine_no_owner(L, owners, n + 1);
            lua_rawgeti(L, -1, t->ref);
            lua_rawseti(L, out, n + 1); /* may raise: out of memory */
            n++;
        }
        e->news = t->news_next;
        t->news_next = NULL;
        t->in_news = 0;
    }
    while (e->finished.head) {
        transfer *t = e->finished.head;
        lua_rawgeti(L, -1, t->ref);
        if (owners) {
            if (lua_getiuservalue(L, -1, TRANSFER_UV_OWNER) == LUA_TNIL) {
                lua_pop(L, 1);
                lua_pushboolean(L, 0);
            }
            lua_rawseti(L, owners, n + 1); /* may raise: out of memory */
        }
        lua_rawseti(L, out, n + 1); /* may raise: out of memory */
        n++;
        engine_unqueue(t);
        luaL_unref(L, -1, t->ref);
        t->ref = LUA_NOREF;
    }
    lua_pop(L, 1);
    /* then the watched descriptors that are ready, as numbers */
    while (e->nfired > 0) {
        engine_no_owner(L, owners, n + 1);
        lua_pushinteger(L, e->fired[e->nfired - 1]);
        lua_rawseti(L, out, n + 1); /* may raise: out of memory */
        n++;
        e->nfired--;
    }
    RW_STACK_EXPECT(L, mark, 0);
    return n;
}

/* engine:poll([timeout [, out [, budget [, owners]]]]) -> out, n. Drives
 * every running transfer (with a budget, for about that many seconds of
 * libcurl's work: see engine_drive); when none has finished, waits at most
 * timeout seconds (default 0) for socket activity or a libcurl timer. The
 * transfers that finished are out[1..n]: out is the caller's table to
 * fill, or a new one. Entries past n are left as they were. With owners (a
 * table), owners[i] is the owner engine:start (or transfer:set_owner) gave
 * out[i], or false: the caller finds whom to wake without a table keyed by
 * transfers (whose keys, new with each transfer, had LuaJIT rehash it at
 * nearly every insert). When libcurl's multi handle fails, every running
 * transfer ends with that error (error.multi), and is reported here like
 * any other. */
static int engine_l_poll(lua_State *L)
{
    engine *e = engine_check(L);
    lua_Number timeout = luaL_optnumber(L, 2, 0);
    lua_Number budget = luaL_optnumber(L, 4, 0);
    int out, owners = 0, n;
    luaL_argcheck(L, timeout >= 0, 2, "timeout must be a non-negative number of seconds");
    luaL_argcheck(L, budget >= 0 && budget <= RW_MAX_SECONDS, 4,
                  "budget must be a non-negative number of seconds (0: none)");
    if (!lua_isnoneornil(L, 5)) {
        luaL_checktype(L, 5, LUA_TTABLE);
        owners = 5;
    }
    if (lua_isnoneornil(L, 3)) {
        lua_newtable(L);
    } else {
        luaL_checktype(L, 3, LUA_TTABLE);
        lua_pushvalue(L, 3);
    }
    out = lua_gettop(L);
    engine_drive(e, 0, budget);
    if (!e->finished.head && !e->nfired && !e->news && timeout > 0) {
        double until = engine_deadline(e);
        if (until >= 0 && until < timeout) timeout = until > 0 ? until : 0;
        engine_drive(e, timeout, budget);
    }
    n = engine_report(L, e, out, owners);
    lua_pushinteger(L, n);
    return 2;
}

/* engine:pollfd() -> the descriptor that is readable when a socket of a
 * transfer is ready: a host waits on it (and on engine:timeout()), then
 * calls engine:poll(0). It stays the same for the engine's whole life.
 * nil with the poll(2) backend, which has none: engine:timeout() then
 * says when to look again while sockets may move. */
static int engine_l_pollfd(lua_State *L)
{
    int fd = poller_fd(&engine_check(L)->poller);
    if (fd < 0) lua_pushnil(L);
    else lua_pushinteger(L, fd);
    return 1;
}

/* engine:watch(fd, "r" | "w"): the next poll that finds fd ready to read
 * (or write) reports it, once, as the number fd among the finished
 * transfers; waits on the engine (its pollfd, a blocking poll) wake for it.
 * For descriptors the Lua layer reads itself (a Redis connection), so that
 * they are waited on with the transfers, through the same seam. */
static int engine_l_watch(lua_State *L)
{
    engine *e = engine_check(L);
    lua_Integer fd = luaL_checkinteger(L, 2);
    const char *mode = luaL_checkstring(L, 3);
    unsigned char *slot;
    luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 2, "not a descriptor");
    luaL_argcheck(L, (mode[0] == 'r' || mode[0] == 'w') && mode[1] == '\0', 3, "mode must be \"r\" or \"w\"");
    slot = engine_watch_slot(e, (curl_socket_t)fd);
    if (!slot) return luaL_error(L, "out of memory");
    luaL_argcheck(L, !(*slot & (WATCH_IN_SET | WATCH_WANTED)) || (*slot & WATCH_FOREIGN), 2,
                  "a descriptor of a transfer");
    if (*slot & WATCH_ARMED) {
        e->nwatching--; /* re-armed below, for the new mode */
        *slot &= (unsigned char)~WATCH_ARMED;
    }
    if (e->nfired + e->nwatching + 1 > e->capfired) {
        int cap = e->capfired ? e->capfired * 2 : 8;
        int *grown = (int *)realloc(e->fired, (size_t)cap * sizeof *grown);
        if (!grown) return luaL_error(L, "out of memory");
        e->fired = grown;
        e->capfired = cap;
    }
    if (poller_set(&e->poller, (int)fd, (mode[0] == 'r' ? POLLER_IN : POLLER_OUT) | POLLER_ONESHOT,
                   (*slot & WATCH_FOREIGN) != 0)
        != 0) {
        int err = errno;
        lua_pushnil(L);
        lua_pushfstring(L, "cannot watch descriptor %d: %s", (int)fd, strerror(err));
        return 2;
    }
    *slot = (unsigned char)(WATCH_FOREIGN | WATCH_ARMED);
    e->nwatching++;
    lua_pushboolean(L, 1);
    return 1;
}

/* engine:unwatch(fd): fd is watched no more (call it before closing fd). A
 * readiness not yet reported is forgotten. */
static int engine_l_unwatch(lua_State *L)
{
    engine *e = engine_check(L);
    lua_Integer fd = luaL_checkinteger(L, 2);
    int i;
    if (fd < 0 || (size_t)fd >= e->nwatch || !(e->watch[fd] & WATCH_FOREIGN)) return 0;
    if (e->watch[fd] & WATCH_ARMED) e->nwatching--;
    e->watch[fd] = 0;
    poller_del(&e->poller, (int)fd);
    for (i = 0; i < e->nfired; i++) {
        if (e->fired[i] == (int)fd) e->fired[i--] = e->fired[--e->nfired];
    }
    return 0;
}

/* engine:events() -> "r": what to wait for on engine:pollfd(). */
static int engine_l_events(lua_State *L)
{
    engine_check(L);
    lua_pushliteral(L, "r");
    return 1;
}

/* engine:timeout() -> seconds until the engine must be polled even though
 * its descriptor stayed quiet (0: now), or nil when nothing is due. */
static int engine_l_timeout(lua_State *L)
{
    engine *e = engine_check(L);
    double left = engine_deadline(e);
    if (e->running.head || e->nwatching) left = poller_nap(&e->poller, left);
    if (left < 0) lua_pushnil(L);
    else lua_pushnumber(L, left);
    return 1;
}

#ifdef RW_FAULTS
/* RW_FAULTS builds (specs only): engine:fail_next() makes the next drive
 * fail as if libcurl's multi handle had (CURLM_UNRECOVERABLE_POLL). */
static int engine_l_fail_next(lua_State *L)
{
    engine_check(L)->fail_next = CURLM_UNRECOVERABLE_POLL;
    return 0;
}
#endif

/* engine:trim(): once nothing runs, closes the connections kept from a
 * burst of more than max_idle_connections transfers (see engine_shed), and
 * lets go of the large body buffers the pooled records keep. */
static int engine_l_trim(lua_State *L)
{
    engine *e = engine_check(L);
    int i;
    engine_shed(e);
    for (i = 0; i < e->npool; i++) {
        transfer *t = e->pool[i];
        if (t->body.cap > ENGINE_KEEP_SMALL) {
            e->kept -= t->body.cap;
            engine_buf_free(&t->body);
        }
    }
    return 0;
}

/* engine:running() -> number of transfers in flight (queued for a
 * connection or not), finished ones poll has yet to report, and watched
 * descriptors (armed or ready): while it is above 0, there is something to
 * poll for. */
static int engine_l_running(lua_State *L)
{
    engine *e = engine_check(L);
    lua_pushinteger(L, e->running.n + e->finished.n + e->nwatching + e->nfired);
    return 1;
}

/* Idempotent; __gc, __close and engine:close() all come here. Transfers
 * still running end as aborted; finished ones are no longer reported. */
static int engine_l_close(lua_State *L)
{
    engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
    if (!e->multi) return 0;
    while (e->news) {
        transfer *t = e->news;
        e->news = t->news_next;
        t->news_next = NULL;
        t->in_news = 0;
    }
    while (e->running.head) engine_finish(e->running.head, CURLE_ABORTED_BY_CALLBACK, ABORT_ENGINE_CLOSED);
    while (e->finished.head) engine_unqueue(e->finished.head);
    while (e->npool > 0) engine_destroy(e->pool[--e->npool]);
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    poller_close(&e->poller);
    free(e->watch);
    e->watch = NULL;
    e->nwatch = 0;
    free(e->socket_origin);
    e->socket_origin = NULL;
    e->nsocket_origin = 0;
    free(e->fired);
    e->fired = NULL;
    e->nfired = e->capfired = e->nwatching = 0;
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

/* transfer:set_owner(owner): the owner the poll that reports this transfer
 * finished names with it (see engine:start); nil: none. For a transfer not
 * reported yet: set after that, it is never named. */
static int transfer_l_set_owner(lua_State *L)
{
    transfer_check(L);
    luaL_checkany(L, 2);
    lua_pushvalue(L, 2);
    lua_setiuservalue(L, 1, TRANSFER_UV_OWNER);
    return 0;
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

/* Closes the transfer whose box (at index 1) is box: a running transfer is
 * aborted; a finished one is no longer reported by poll. The record goes
 * back to the engine's pool. */
static void transfer_release(lua_State *L, transfer_box *box)
{
    transfer *t = box->t;
    engine *e;
    if (!t) return;
    box->t = NULL;
    e = transfer_detach(L, t);
    if (t->state == TRANSFER_RUNNING) engine_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_CANCELLED);
    else engine_unqueue(t);
    engine_give(e, t);
}

/* Idempotent; transfer:close(), __close and __gc. */
static int transfer_l_close(lua_State *L)
{
    transfer_release(L, (transfer_box *)luaL_checkudata(L, 1, TRANSFER_MT));
    return 0;
}

/* transfer:head() -> the final response's status and headers (a table like
 * result()'s, without body) once they are in, while the transfer runs; nil
 * before (the engine's poll then reports the transfer when they come) and
 * once it has finished (result() says how). */
static int transfer_l_head(lua_State *L)
{
    transfer *t = transfer_check(L);
    if (t->state == TRANSFER_RUNNING && t->head_ready) {
        rw_response_head(L, t);
        return 1;
    }
    if (t->state == TRANSFER_RUNNING) t->notify = 1;
    lua_pushnil(L);
    return 1;
}

/* transfer:read() -> the body bytes that arrived since the last read, as
 * one string | nil when none has come yet (the engine's poll reports the
 * transfer when some do) | false once the transfer has finished and every
 * byte was read (result() then says whether it ended well). For a request
 * made with stream = true, whose headers are in and a 2xx's (any other
 * answer is read whole, under the request's timeout and max_body, for
 * result() to give). A transfer paused because
 * its buffer filled up resumes as its buffer is taken. */
static int transfer_l_read(lua_State *L)
{
    transfer *t = transfer_check(L);
    if (!t->stream)
        return luaL_argerror(L, 1, "the transfer is not streamed (not started with stream = true, or its answer "
                                   "is not a 2xx: result() has its body)");
    if (t->body.len > 0 && (t->head_ready || t->state == TRANSFER_DONE)) {
        lua_pushlstring(L, t->body.data, t->body.len);
        t->delivered += t->body.len;
        t->body.len = 0;
        if (t->paused && t->state == TRANSFER_RUNNING) {
            engine *e = t->engine;
            enum engine_expiry_kind kind;
            double at;
            CURLcode rc;
            t->paused = 0;
            t->last_byte = rw_clock_monotonic(); /* the server was not idle: the reader was behind */
            /* libcurl hands the chunk it kept to the write callback (which
             * only buffers it) and asks its timer to run the transfer on. */
            rc = curl_easy_pause(t->easy, CURLPAUSE_CONT);
            if (rc != CURLE_OK && e) {
                /* the chunk libcurl kept was refused (max_body, out of
                 * memory): the transfer ends with why, not without it */
                engine_finish(t, rc, ABORT_NONE);
                engine_queue(e, t);
                return 1;
            }
            at = engine_expiry(t, &kind);
            if (e && at < e->next_expiry) e->next_expiry = at;
        }
        return 1;
    }
    if (t->state == TRANSFER_DONE) {
        lua_pushboolean(L, 0);
        return 1;
    }
    t->notify = 1;
    lua_pushnil(L);
    return 1;
}

/* transfer:bound(): a streamed transfer's timeout (the request's) applies
 * to its body too, as it does to a transfer not streamed: for a reader
 * that reads the whole body within a call's time. */
static int transfer_l_bound(lua_State *L)
{
    transfer *t = transfer_check(L);
    if (t->state == TRANSFER_RUNNING && t->stream && !t->bounded) {
        enum engine_expiry_kind kind;
        double at;
        t->bounded = 1;
        at = engine_expiry(t, &kind);
        if (t->engine && at < t->engine->next_expiry) t->engine->next_expiry = at;
    }
    return 0;
}

/* Keeps the closed box at index 1 for engine:start to hand out again
 * (ENGINE_UV_SPARE), unless its engine is closed or keeps enough. The stack
 * is left as it was. */
static void transfer_recycle(lua_State *L)
{
    RW_STACK_MARK(L, mark);
    if (lua_getiuservalue(L, 1, TRANSFER_UV_ENGINE) == LUA_TUSERDATA) {
        engine *e = (engine *)lua_touserdata(L, -1);
        if (e->multi && e->nspare < ENGINE_SPARE_MAX) {
            lua_pushnil(L);
            lua_setiuservalue(L, 1, TRANSFER_UV_BODY);
            lua_pushnil(L);
            lua_setiuservalue(L, 1, TRANSFER_UV_OWNER);
            lua_getiuservalue(L, -1, ENGINE_UV_SPARE);
            lua_pushvalue(L, 1);
            lua_rawseti(L, -2, ++e->nspare); /* within the array made for it: no allocation */
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    RW_STACK_EXPECT(L, mark, 0);
}

/* transfer:result([lazy [, close [, recycle [, mt]]]]) -> response table |
 * nil, error table (response.c). close: the transfer is closed once its
 * result is made, as transfer:close() would (one call less for a caller
 * that is done with it). recycle (with close): the caller holds no other
 * reference to this transfer object and drops its own, so that
 * engine:start may hand the object out again for another transfer
 * (runtime.transfer's). mt: a table made the metatable of a response (not
 * of an error), which saved fetch a Lua call and two C calls a request. */
static int transfer_l_result(lua_State *L)
{
    transfer_box *box = (transfer_box *)luaL_checkudata(L, 1, TRANSFER_MT);
    int n, close = lua_toboolean(L, 3), recycle = close && lua_toboolean(L, 4); /* read before the results go on the stack */
    int mt = !lua_isnoneornil(L, 5);
    if (mt) luaL_checktype(L, 5, LUA_TTABLE);
    if (!box->t) return luaL_argerror(L, 1, "transfer is closed");
    n = rw_response_result(L, box->t, lua_toboolean(L, 2));
    if (mt && n == 1) {
        lua_pushvalue(L, 5);
        lua_setmetatable(L, -2);
    }
    if (close) {
        transfer_release(L, box);
        if (recycle) transfer_recycle(L);
    }
    return n;
}

static int transfer_l_tostring(lua_State *L)
{
    transfer_box *box = (transfer_box *)luaL_checkudata(L, 1, TRANSFER_MT);
    static const char *const states[] = { "running", "done", "closed" };
    lua_pushfstring(L, "ratewise.Transfer (%s)", states[box->t ? box->t->state : TRANSFER_CLOSED]);
    return 1;
}

void rw_engine_register(lua_State *L)
{
    static const luaL_Reg engine_methods[] = {
        { "start", engine_l_start },
        { "poll", engine_l_poll },
        { "configure", engine_l_configure },
        { "running", engine_l_running },
        { "trim", engine_l_trim },
        { "pollfd", engine_l_pollfd },
        { "watch", engine_l_watch },
        { "unwatch", engine_l_unwatch },
        { "events", engine_l_events },
        { "timeout", engine_l_timeout },
#ifdef RW_FAULTS
        { "fail_next", engine_l_fail_next },
#endif
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
        { "set_owner", transfer_l_set_owner },
        { "result", transfer_l_result },
        { "head", transfer_l_head },
        { "read", transfer_l_read },
        { "bound", transfer_l_bound },
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
    lua_pushcfunction(L, rw_response_l_headers);
    lua_setfield(L, -2, "response_headers");
    rw_response_register(L);
    rw_request_register(L);
}
