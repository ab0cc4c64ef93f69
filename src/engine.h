/*
 * What the files of the engine share (engine.c: the multi handle, the
 * drive and ratewise.Engine; transfer.c: the transfers' records, their
 * pool and ratewise.Transfer; gate.c: the gate that holds a burst to an
 * https origin not yet known; redirect.c: the engine's own redirect
 * following; watch.c: the descriptors in the poller's set, libcurl's
 * sockets and engine:watch's). Not part of the module's interface:
 * included by those five only.
 */
#ifndef RATEWISE_ENGINE_H
#define RATEWISE_ENGINE_H

#include "poller.h"
#include "transfer.h"

#define ENGINE_MT "ratewise.Engine"
#define TRANSFER_MT "ratewise.Transfer"
#define ENGINE_POOL_MAX 64
/* Engine user values: 1, the boxes of transfers until poll reports them;
 * ENGINE_UV_KEYS, the request fields' names (rw_request_push_keys) and,
 * after them at KEYS_TRANSFER_MT, the transfers' metatable: at hand for
 * engine:start, where luaL_setmetatable's look-up by name in the registry
 * is a cost paid on every request. */
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
 * ran at once: see engine_shed). 64 idle: a program whose few dozen tasks
 * call one host keeps a connection for each. */
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
 * transfer_small_buffer (transfer.c). Only over HTTP/1: an HTTPS transfer,
 * which may be multiplexed on HTTP/2, keeps libcurl's default. With the small buffer
 * sized to small answers, libcurl 7.88 at times delivered an HTTP/2
 * stream's last bytes and then left the transfer unfinished, with no timer
 * set and nothing left to read on the socket: it waited for its timeout
 * whenever no other stream on that connection brought another event. */
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

/* What the engine knows of an https origin's protocol (rw_gate_hold).
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
    int sockets;                /* of this origin's connections, open (rw_gate_socket_opened) */
    double last_start;          /* when a transfer last went through this known gate */
    int multiplexes;            /* its probe was answered over HTTP/2 (rw_gate_answered) */
    int pacing;                 /* its held transfers go on one at a time (gate_open_paced) */
    int launched;               /* multiplexes: a transfer went on since libcurl last ran (rw_gate_hold) */
} engine_gate;

/* A known origin whose last transfer went through more than this long ago
 * has its idle connections looked at before the next one goes through
 * (gate_stale). */
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
    int gates_answered;   /* a probe's headers came: held transfers go on (rw_gate_release_answered) */
    int gate_next;        /* where the search for a known gate to forget starts (rw_gate_hold) */
    unsigned long long *socket_origin; /* by descriptor: the gate key of its origin (0: none) */
    /* https origins (gate keys) whose server agreed on no protocol when a
     * no_replay request offered HTTP/1.1 alone: such requests offer them
     * HTTP/2 too (rw_transfer_again). A ring, the oldest forgotten first. */
    unsigned long long h2_only[ENGINE_GATES];
    int h2_only_next;
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
    unsigned char *watch; /* by descriptor: WATCH_* (see rw_watch_on_socket) */
    size_t nwatch;
    double timer_at; /* when libcurl asked to be called back (HUGE_VAL: it did not) */
    int *fired;      /* descriptors of engine:watch that became ready, not yet reported */
    int nfired, capfired;
    int nwatching;   /* descriptors of engine:watch armed and not yet ready */
    int nwanted;     /* descriptors libcurl waits on now (WATCH_WANTED; rw_watch_on_socket) */
    int nmultiplex;  /* running transfers that may share a connection (rw_transfer_may_multiplex) */
    unsigned long delivered; /* callbacks that delivered a response's bytes (rw_engine_delivered) */
    int all_again;   /* the last pass over every socket delivered: pass again (engine_drive_all) */
    int left_ready;  /* the last drive left sockets it was told were ready (its budget, or a full batch) */
    /* The slots of the table of references (user value 1) that boxes
     * left, for the next to take (rw_engine_ref); slots up to top_ref have
     * been handed out. */
    int *free_refs;
    int nfree_refs, capfree_refs, top_ref;
    struct engine_wake *wake; /* the wake-up line (wake.c; NULL: not opened) */
#ifdef RW_FAULTS
    CURLMcode fail_next; /* RW_FAULTS builds: the next drive fails with this */
    unsigned long all_drives; /* RW_FAULTS builds: engine_drive_all's calls (engine:all_drives()) */
#endif
} engine;

static inline void engine_list_add(engine_list *l, transfer *t)
{
    t->next = NULL;
    t->prev = l->tail;
    if (l->tail) l->tail->next = t;
    else l->head = t;
    l->tail = t;
    l->n++;
}

static inline void engine_list_remove(engine_list *l, transfer *t)
{
    if (t->prev) t->prev->next = t->next;
    else l->head = t->next;
    if (t->next) t->next->prev = t->prev;
    else l->tail = t->prev;
    t->prev = t->next = NULL;
    l->n--;
}

/* What the poller's set holds for a descriptor (engine.watch[fd]). libcurl
 * stops watching a connection each time a transfer on it ends and watches
 * it again for the next one, which reuses it: taking it out of the set and
 * putting it back would be system calls on every request, for nothing. So
 * a connection libcurl no longer wants stays in the set, marked unwanted,
 * until it reports an event (then it leaves: an idle connection the server
 * closes would stay readable for ever) or is closed (rw_watch_on_close;
 * closing takes it out of the set). */
#define WATCH_IN 1u
#define WATCH_OUT 2u
#define WATCH_IN_SET 4u
#define WATCH_WANTED 8u
/* A descriptor the Lua layer watches (engine:watch: a Redis connection),
 * not libcurl: armed once (POLLER_ONESHOT), reported by poll when ready. */
#define WATCH_FOREIGN 16u
#define WATCH_ARMED 32u

/* The bytes of request the handle sent on its last hop. A transfer's
 * request_size counts every hop: a POST a redirect took elsewhere reached
 * the server, even if the next hop could not connect. */
static inline long engine_sent(transfer *t)
{
    long sent = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_REQUEST_SIZE, &sent) != CURLE_OK || sent < 0) return 0;
    return sent;
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
static inline double engine_expiry(const transfer *t, enum engine_expiry_kind *kind)
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

/* The Lua object of a transfer: a box, so that the record can go back to
 * its engine's pool when the transfer is closed. NULL once closed. */
typedef struct transfer_box {
    transfer *t;
} transfer_box;

/* luaL_checkudata(L, idx, tname) for a metatable that the type's methods
 * and metamethods hold as their first upvalue (registered with it: no
 * look-up at all), and that the registry also holds under the address id
 * (lua_rawsetp at registration) for a C function without that upvalue:
 * found by address, a pointer's hash, where luaL_checkudata looks tname up
 * as a string on every call (and LuaJIT makes that string again each
 * time). A value of another type raises as luaL_checkudata does. */
static inline void *rw_check_udata(lua_State *L, int idx, const void *id, const char *tname)
{
    void *p = lua_touserdata(L, idx);
    if (p && lua_getmetatable(L, idx)) {
        /* (an upvalue the function does not have is no value: not equal) */
        int same = lua_rawequal(L, -1, lua_upvalueindex(1));
        if (!same) {
            lua_rawgetp(L, LUA_REGISTRYINDEX, id);
            same = lua_rawequal(L, -1, -2);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
        if (same) return p;
    }
    return luaL_checkudata(L, idx, tname);
}


/* The engine's next expiry comes no later than t's own (t started, or
 * something engine_expiry reads changed). */
static inline void engine_note_expiry(struct engine *e, const transfer *t)
{
    enum engine_expiry_kind kind;
    double at = engine_expiry(t, &kind);
    if (e && at < e->next_expiry) e->next_expiry = at;
}

#pragma GCC visibility push(hidden)

/* transfer.c: a record for a new transfer of engine e, from its pool or
 * new (*fresh: new, without the options every transfer sets alike; NULL:
 * out of memory); back to the pool (or freed); freed. */
transfer *rw_transfer_take(engine *e, int *fresh);
void rw_transfer_give(engine *e, transfer *t);
void rw_transfer_destroy(transfer *t);
/* transfer.c: engine:trim's share, the pooled records' large buffers let go. */
void rw_transfer_trim(engine *e);
/* transfer.c: a running transfer taken off the multi handle (code: how it
 * ended); onto its engine's finished list, for poll to report; off it. */
void rw_transfer_finish(transfer *t, CURLcode code, enum transfer_abort aborted);
/* transfer.c: running transfer t ends as the multi handle failed (mc). */
void rw_transfer_fail(transfer *t, CURLMcode mc);
/* transfer.c: a hop of t ended (the last, or a redirect followed): its
 * time and the request bytes it sent count in the transfer's. */
void rw_transfer_hop_ended(transfer *t);
/* transfer.c: t, ended with code, goes again instead when request.c's
 * prereq callback ended it before a byte went out because its server did
 * not agree on HTTP/1.1 (alpn_refused): offering HTTP/2 too, its origin
 * remembered. Answers 1 when it goes again (or has ended otherwise, queued). */
int rw_transfer_again(engine *e, transfer *t, CURLcode code);
/* transfer.c: t, set up by rw_request_configure, starts on engine e (or is
 * held by its gate); what the multi handle said when it refused it. */
CURLMcode rw_transfer_launch(engine *e, transfer *t);
/* transfer.c: t's reference in the engine's table at absolute index refs: taken for
 * the box on top of the stack (popped), let go of. */
void rw_transfer_ref(lua_State *L, engine *e, int refs, transfer *t);
void rw_transfer_unref(lua_State *L, engine *e, int refs, transfer *t);
/* transfer.c: the first of e's transfers with news, off that list (NULL:
 * none). */
transfer *rw_transfer_news_pop(engine *e);
/* transfer.c: t's handle gets a receive buffer of size bytes. */
void rw_transfer_buffer_size(transfer *t, long size);
/* transfer.c: t may share its connection with others: an HTTPS request,
 * which libcurl sends over HTTP/2 where the server offers it, unless the
 * request is held to HTTP/1.1 (request.c, request_replay). Said as it is
 * launched (its gate key) and as it is redirected to https. */
void rw_transfer_may_multiplex(transfer *t);
void rw_transfer_queue(engine *e, transfer *t);
void rw_transfer_unqueue(transfer *t);
/* transfer.c: ratewise.Transfer's metatable. */
void rw_transfer_register(lua_State *L);

/* gate.c: whether t is held for its origin's first answer (1) or goes on;
 * held transfer t goes on (out of its gate's line: rw_gate_unlink first);
 * the gates whose probe answered let their transfers go; a transfer that
 * ends leaves its gate; a probe that never started leaves its origin
 * unknown; every gate forgotten (the connections are gone); a counted
 * socket is gone. */
int rw_gate_hold(engine *e, transfer *t);
void rw_gate_go(engine *e, transfer *t);
void rw_gate_unlink(engine_gate *g, transfer *t);
void rw_gate_release_answered(engine *e);
void rw_gate_leave(engine *e, transfer *t);
void rw_gate_unprobe(engine *e, transfer *t);
void rw_gate_forget_all(engine *e);
/* gate.c: t in no gate, its record going back to the pool. */
void rw_gate_clear(transfer *t);
void rw_gate_socket_gone(engine *e, int fd);

/* redirect.c: a completed transfer that is a redirect to follow goes back
 * on the multi handle for the next URL (1); 0 when its response is the
 * final one, or the redirect cannot be followed (*code says why). */
int rw_redirect_follow(engine *e, transfer *t, CURLcode *code);
/* redirect.c: the hops t followed forgotten, its record going back to the
 * pool (or freed). */
void rw_redirect_clear(transfer *t);

/* watch.c: table (*n entries of `size` bytes, by descriptor) grown to
 * reach descriptor s; libcurl's socket and close-socket callbacks; whether
 * the poller's event on fd is the watch's own (a descriptor of
 * engine:watch, or a connection libcurl no longer wants), not libcurl's;
 * engine:watch and engine:unwatch. */
void *rw_watch_fd_table(void *table, size_t *n, size_t size, curl_socket_t s);
int rw_watch_on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp);
int rw_watch_on_close(void *userp, curl_socket_t s);
int rw_watch_event(engine *e, int fd);
int rw_watch_l_watch(lua_State *L);
int rw_watch_l_unwatch(lua_State *L);

/* wake.c: engine:wake_path, wake_accept, wake_arm and wake_kick; the
 * line, its helper thread and its socket gone (engine:close). */
extern const luaL_Reg rw_wake_methods[];
void rw_wake_close(engine *e);

/* engine.c: the engine at index 1 (misuse raises, as for a closed one). */
engine *rw_engine_check(lua_State *L);

/* engine.c: the value on top of the stack (popped) put into the table of
 * references at index refs, at the slot returned (may raise: out of
 * memory); that slot emptied, for another. */
int rw_engine_ref(lua_State *L, engine *e, int refs);
void rw_engine_unref(lua_State *L, engine *e, int refs, int ref);

#pragma GCC visibility pop

#endif
