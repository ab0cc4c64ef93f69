/*
 * ratewise.Engine: HTTP transfers on one libcurl multi handle, and the
 * drive that moves them (engine:start, engine:poll, engine:timeout).
 *
 * The engine never sleeps on its own account and never calls Lua from a
 * libcurl callback: the callbacks only append to C buffers owned by the
 * transfer, or record what libcurl wants to wait for, and everything Lua
 * sees is built after libcurl has returned.
 *
 * The engine is pollable, as cqueues calls it: libcurl's socket interface
 * (CURLMOPT_SOCKETFUNCTION, CURLMOPT_TIMERFUNCTION) tells it which sockets
 * to watch, which it keeps in its poller's set (src/poller.c, through
 * src/watch.c), and when to call back. So a host waits on one descriptor
 * (engine:pollfd(), readable when any socket is ready; none with the
 * poll(2) backend) and one deadline (engine:timeout()), then lets the
 * engine act on what is ready (engine:poll(0), which never blocks).
 * engine:poll(t) waits on that descriptor itself, at most t seconds: the
 * one place the engine blocks, and only when asked to.
 * Connections live in the multi handle's cache, so they are reused across
 * transfers. The transfers' records and ratewise.Transfer are
 * src/transfer.c's; the gate that holds a burst to an unknown https origin
 * is src/gate.c's; redirects are followed by src/redirect.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* libcurl's connection cache counts the connections in use with the idle
 * ones: whenever a transfer ends with more than CURLMOPT_MAXCONNECTS
 * connections open, it closes the oldest idle one, which is then most often
 * the one just given back. Set to max_idle, that would make every transfer
 * reconnect whenever more than max_idle run at once. So the cache grows with the most
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

/* libcurl says when to call it back (0: at once; -1: never). C only. */
static int engine_on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    engine *e = (engine *)userp;
    (void)multi;
    e->timer_at = timeout_ms < 0 ? HUGE_VAL : rw_core_monotonic() + (double)timeout_ms / 1000.0;
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
    curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, rw_watch_on_socket);
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
    rw_gate_forget_all(e);
    e->timer_at = HUGE_VAL;
    engine_apply_limits(e);
}

/* Ends every running transfer after the multi handle failed (out of
 * memory, a failed poll(2)...): each reports the error, so that nothing
 * waits for a transfer that libcurl will never finish. */
static void engine_fail_all(engine *e, CURLMcode mc)
{
    e->renew = 1;
    while (e->running.head) {
        transfer *t = e->running.head;
        rw_transfer_fail(t, mc);
        rw_transfer_queue(e, t);
    }
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
    now = rw_core_monotonic();
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
            rw_gate_unlink(&e->gates[t->gate_slot - 1], t);
            rw_gate_go(e, t);
            if (t->state == TRANSFER_RUNNING) {
                at = engine_expiry(t, &kind);
                if (at < next) next = at;
            }
            continue;
        }
        rw_transfer_finish(t, CURLE_OPERATION_TIMEDOUT, ABORT_NONE);
        if (kind == EXPIRY_FIRST_BYTE)
            rw_transfer_why(t, "no response headers within %.0f milliseconds (first_byte_timeout)",
                            t->first_byte_timeout * 1000);
        else if (kind == EXPIRY_IDLE)
            rw_transfer_why(t, "no body bytes for %.0f milliseconds (idle_timeout)", t->idle_timeout * 1000);
        else if (t->request_size == 0)
            rw_transfer_why(t, "Operation timed out after %.0f milliseconds waiting for a connection "
                               "(all %ld in use: max_connections)", (now - t->started) * 1000, e->max_connections);
        else
            rw_transfer_why(t, "Operation timed out after %.0f milliseconds", (now - t->started) * 1000);
        rw_transfer_queue(e, t);
    }
    e->next_expiry = next;
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
        if (code == CURLE_OK && t->follow && rw_redirect_follow(e, t, &code)) continue;
        if (code == CURLE_ABORTED_BY_CALLBACK && rw_transfer_again(e, t, code)) continue;
        rw_transfer_finish(t, code, ABORT_NONE);
        rw_transfer_queue(e, t);
    }
}

#define ENGINE_EVENTS 64

void rw_engine_delivered(transfer *t)
{
    if (t->engine) t->engine->delivered++;
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
#ifdef RW_FAULTS
    e->all_drives++;
#endif
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
             && !(until > 0 && rw_core_monotonic() >= until));
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
     * socket again, where one pass over the transfers (curl_multi_perform's)
     * polls it once. Then libcurl is given every socket at once, one pass
     * over the transfers as curl_multi_perform makes, which is what the
     * plain contender does (engine_drive_all).
     * Not with many sockets (a pass would poll each connection that has
     * nothing to read), and with a budget (a frame's step, OpenResty's
     * driver) only on one socket, where a pass is no longer than that
     * socket's own turn: socket by socket there, so that a step can stop
     * between them. Transfers that cannot share a connection (HTTP/1.1)
     * do not count: just started, they have no socket yet, and as many of
     * them as had just finished made a pass over every transfer look
     * worth it where only a few sockets had anything to read. */
    int all = e->nwanted > 0 && e->nwanted <= (budget > 0 ? 1 : ENGINE_ALL_SOCKETS)
              && e->nmultiplex >= 2 * e->nwanted,
        any = 0;
    double until;
    n = poller_wait(&e->poller, ev, ENGINE_EVENTS, seconds);
    e->left_ready = n == ENGINE_EVENTS; /* more may be */
    until = budget > 0 ? rw_core_monotonic() + budget : 0;
    if (n < 0) {
        n = 0;
        if (errno != EINTR) mc = CURLM_UNRECOVERABLE_POLL;
    }
    for (i = 0; i < n && mc == CURLM_OK; i++) {
        int fd = ev[i].fd;
        int flags = ((ev[i].events & POLLER_IN) ? CURL_CSELECT_IN : 0) | ((ev[i].events & POLLER_OUT) ? CURL_CSELECT_OUT : 0)
                    | ((ev[i].events & POLLER_ERR) ? CURL_CSELECT_ERR : 0);
        if (rw_watch_event(e, fd)) continue;
        if (!spent && until > 0 && rw_core_monotonic() >= until) spent = 1;
        if (spent) {
            e->left_ready = 1; /* still ready (level-triggered): the next drive takes it */
            continue;          /* watched descriptors still fire */
        }
        if (all) {
            any = 1;
            continue;
        }
        mc = curl_multi_socket_action(e->multi, fd, flags, &running);
    }
    if ((any || e->all_again) && mc == CURLM_OK) mc = engine_drive_all(e, until, &running);
    if (mc == CURLM_OK && !spent && e->timer_at != HUGE_VAL) {
        double now = rw_core_monotonic();
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
    if (mc == CURLM_OK) rw_gate_release_answered(e);
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
 * transfers wait to be reported, or when the last drive left sockets that
 * are ready (a host that waits on the engine's descriptor would be woken
 * at once: a hop through OpenResty's wake-up line). Negative: nothing (no
 * deadline). */
static double engine_deadline(const engine *e)
{
    double at = e->timer_at < e->next_expiry ? e->timer_at : e->next_expiry, left;
    if (e->finished.head || e->nfired || e->news || e->all_again || e->left_ready) return 0;
    if (at == HUGE_VAL) return -1;
    left = at - rw_core_monotonic();
    return left > 0 ? left : 0;
}

/* luaL_ref and luaL_unref, the free slots kept here rather than as a list
 * threaded through the table itself, which luaL_ref reads and rewrites at
 * every call. */
int rw_engine_ref(lua_State *L, engine *e, int refs)
{
    int ref = e->nfree_refs > 0 ? e->free_refs[--e->nfree_refs] : ++e->top_ref;
    lua_rawseti(L, refs, ref); /* may raise: out of memory (the slot is then not used again) */
    return ref;
}

void rw_engine_unref(lua_State *L, engine *e, int refs, int ref)
{
    lua_pushnil(L);
    lua_rawseti(L, refs, ref);
    if (!e->multi) return; /* closed: nothing is started again */
    if (e->nfree_refs == e->capfree_refs) {
        int cap = e->capfree_refs ? e->capfree_refs * 2 : ENGINE_POOL_MAX;
        int *grown = (int *)realloc(e->free_refs, (size_t)cap * sizeof *grown);
        if (!grown) return; /* the slot is not used again */
        e->free_refs = grown;
        e->capfree_refs = cap;
    }
    e->free_refs[e->nfree_refs++] = ref;
}

/* The engines' metatable in the registry, by this address (rw_check_udata). */
static const char engine_mt_id = 0;

engine *rw_engine_check(lua_State *L)
{
    engine *e = (engine *)rw_check_udata(L, 1, &engine_mt_id, ENGINE_MT);
    if (!e->multi) luaL_argerror(L, 1, "engine is closed");
    return e;
}

/* ---- Engine methods ---- */

/* The options core.engine and engine:configure take, in engine_read_limits'
 * order. */
static const char *const engine_options[] = { "max_connections", "max_idle_connections", NULL };

/* Reads the connection options of the table at index idx into *conns and
 * *idle (options left out keep their value). Misuse raises, naming the
 * option. */
static void engine_read_limits(lua_State *L, int idx, long *conns, long *idle)
{
    RW_STACK_MARK(L, mark);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        int place = rw_options_key(L, -2, engine_options);
        long *slot = place == 0 ? conns : idle;
        lua_Integer v;
        int isint = 0;
        if (place < 0) {
            rw_options_unknown(L, "engine", -2, engine_options, NULL);
            return; /* not reached; lauxlib.h does not tell the analyzer so */
        }
        v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
        if (!isint || v < 1 || v > ENGINE_MAX_LIMIT)
            luaL_error(L, "engine: option '%s' must be an integer from 1 to %d (got %s)", engine_options[place],
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
    /* The boxes of transfers until poll reports them (rw_engine_ref), which
     * also keeps them alive. */
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
    engine *e = rw_engine_check(L);
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
 * reports it (finished, or a stream's news) names it in its owners table
 * (transfer:set_owner). */
static int engine_l_start(lua_State *L)
{
    engine *e = rw_engine_check(L);
    transfer_box *box;
    transfer *t;
    CURLMcode mc;
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
        rw_rawgeti(L, -1, e->nspare);
        lua_pushnil(L);
        lua_rawseti(L, -3, e->nspare);
        e->nspare--;
        lua_remove(L, tidx);
        box = (transfer_box *)lua_touserdata(L, tidx);
    } else {
        box = (transfer_box *)lua_newuserdatauv(L, sizeof(transfer_box), TRANSFER_NUV);
        box->t = NULL;
        rw_rawgeti(L, keys, KEYS_TRANSFER_MT);
        lua_setmetatable(L, tidx);
        lua_pushvalue(L, 1);
        lua_setiuservalue(L, tidx, TRANSFER_UV_ENGINE);
    }
    if (owned) {
        lua_pushvalue(L, 3);
        lua_setiuservalue(L, tidx, TRANSFER_UV_OWNER);
    }

    t = rw_transfer_take(e, &fresh);
    if (!t) {
        lua_settop(L, keys - 1);
        lua_pushnil(L);
        lua_pushliteral(L, "libcurl could not create an easy handle");
        return 2;
    }
    box->t = t; /* from here on __gc gives the record back, whatever happens */
    rw_request_configure(L, e, t, 2, keys, tidx, fresh); /* may raise */
    /* The reference first: it is the one step that can raise (out of
     * memory), and a transfer on the multi handle must have one. */
    lua_getiuservalue(L, 1, 1);
    lua_pushvalue(L, tidx);
    rw_transfer_ref(L, e, lua_gettop(L) - 1, t);
    mc = rw_transfer_launch(e, t);
    if (mc != CURLM_OK) {
        rw_transfer_unref(L, e, lua_gettop(L), t);
        box->t = NULL;
        rw_transfer_give(e, t);
        lua_settop(L, keys - 1);
        lua_pushnil(L);
        lua_pushstring(L, curl_multi_strerror(mc));
        return 2;
    }
    lua_pop(L, 1);
    lua_replace(L, keys); /* the box, in the names' place */
    engine_size_cache(e);
    engine_note_expiry(e, t);
    return 1;
}

/* owners[n] (when the caller gave that table): false, for an entry of out
 * that has no owner (a descriptor). */
static void engine_no_owner(lua_State *L, int owners, int n)
{
    if (!owners) return;
    lua_pushboolean(L, 0);
    lua_rawseti(L, owners, n); /* may raise: out of memory */
}

/* owners[n] (when the caller gave that table): the owner of the transfer
 * on top of the stack (transfer:set_owner), or false. */
static void engine_name_owner(lua_State *L, int owners, int n)
{
    if (!owners) return;
    if (lua_getiuservalue(L, -1, TRANSFER_UV_OWNER) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_pushboolean(L, 0);
    }
    lua_rawseti(L, owners, n); /* may raise: out of memory */
}

/* Puts the finished transfers in the table at index out, from out[1] on,
 * and returns how many; with owners (an index, or 0), owners[i] is the
 * owner engine:start or transfer:set_owner gave out[i], or false. Each
 * leaves the finished list (and the engine's table of references) only
 * once it is in out: when a Lua allocation fails halfway, the rest are
 * still there for the next poll. */
static int engine_report(lua_State *L, engine *e, int out, int owners)
{
    RW_STACK_MARK(L, mark);
    int n = 0;
    lua_getiuservalue(L, 1, 1);
    /* Streamed transfers with news first: a finished one's reference goes
     * below. They stay running (their references stay). Their news is
     * named with its owner, the reader that waits for it, whom it then
     * forgets: the owner of a reader's wait that has ended must not be
     * woken by the stream's next news or its end. */
    while (e->news) {
        transfer *t = e->news;
        if (t->ref != LUA_NOREF) {
            rw_rawgeti(L, -1, t->ref);
            engine_name_owner(L, owners, n + 1);
            lua_pushvalue(L, -1);
            lua_rawseti(L, out, n + 1); /* may raise: out of memory */
            lua_pushnil(L);
            lua_setiuservalue(L, -2, TRANSFER_UV_OWNER);
            lua_pop(L, 1);
            n++;
        }
        rw_transfer_news_pop(e);
    }
    while (e->finished.head) {
        transfer *t = e->finished.head;
        rw_rawgeti(L, -1, t->ref);
        engine_name_owner(L, owners, n + 1);
        lua_rawseti(L, out, n + 1); /* may raise: out of memory */
        n++;
        rw_transfer_unqueue(t);
        rw_transfer_unref(L, e, lua_gettop(L), t);
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
 * out[i], or false (a streamed transfer's news, as its end, names its
 * owner, which the news then forgets): the caller finds whom to wake
 * without a table keyed by transfers (whose keys, new with each transfer,
 * had LuaJIT rehash it at nearly every insert). When libcurl's multi handle fails, every running
 * transfer ends with that error (error.multi), and is reported here like
 * any other. */
static int engine_l_poll(lua_State *L)
{
    engine *e = rw_engine_check(L);
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
 * nil with the poll(2) backend, which has none. */
static int engine_l_pollfd(lua_State *L)
{
    int fd = poller_fd(&rw_engine_check(L)->poller);
    if (fd < 0) lua_pushnil(L);
    else lua_pushinteger(L, fd);
    return 1;
}

/* engine:events() -> "r": what to wait for on engine:pollfd(). */
static int engine_l_events(lua_State *L)
{
    rw_engine_check(L);
    lua_pushliteral(L, "r");
    return 1;
}

/* engine:timeout() -> seconds until the engine must be polled even though
 * its sockets stayed quiet (0: now), or nil when nothing is due. A host
 * that cannot see them naps shorter meanwhile (the scheduler's policy). */
static int engine_l_timeout(lua_State *L)
{
    double left = engine_deadline(rw_engine_check(L));
    if (left < 0) lua_pushnil(L);
    else lua_pushnumber(L, left);
    return 1;
}

#ifdef RW_FAULTS
/* RW_FAULTS builds (specs only): engine:fail_next() makes the next drive
 * fail as if libcurl's multi handle had (CURLM_UNRECOVERABLE_POLL). */
static int engine_l_fail_next(lua_State *L)
{
    rw_engine_check(L)->fail_next = CURLM_UNRECOVERABLE_POLL;
    return 0;
}

/* engine:all_drives(): how many drives handed libcurl every socket at once
 * (engine_drive_all), for specs that say when that may happen. */
static int engine_l_all_drives(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)rw_engine_check(L)->all_drives);
    return 1;
}

#endif

/* engine:trim(): once nothing runs, closes the connections kept from a
 * burst of more than max_idle_connections transfers (see engine_shed), and
 * lets go of the large body buffers the pooled records keep. */
static int engine_l_trim(lua_State *L)
{
    engine *e = rw_engine_check(L);
    engine_shed(e);
    rw_transfer_trim(e);
    return 0;
}

/* engine:running() -> number of transfers in flight (queued for a
 * connection or not), finished ones poll has yet to report, and watched
 * descriptors (armed or ready): while it is above 0, there is something to
 * poll for. */
static int engine_l_running(lua_State *L)
{
    engine *e = rw_engine_check(L);
    lua_pushinteger(L, e->running.n + e->finished.n + e->nwatching + e->nfired);
    return 1;
}

/* Idempotent; __gc, __close and engine:close() all come here. Transfers
 * still running end as aborted; finished ones are no longer reported. */
static int engine_l_close(lua_State *L)
{
    engine *e = (engine *)luaL_checkudata(L, 1, ENGINE_MT);
    if (!e->multi) return 0;
    while (e->news) rw_transfer_news_pop(e);
    while (e->running.head) rw_transfer_finish(e->running.head, CURLE_ABORTED_BY_CALLBACK, ABORT_ENGINE_CLOSED);
    while (e->finished.head) rw_transfer_unqueue(e->finished.head);
    while (e->npool > 0) rw_transfer_destroy(e->pool[--e->npool]);
    curl_multi_cleanup(e->multi);
    e->multi = NULL;
    rw_wake_close(e); /* its helper waits on the poller's descriptor: joined before that closes */
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
    free(e->free_refs);
    e->free_refs = NULL;
    e->nfree_refs = e->capfree_refs = 0;
    return 0;
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
        { "watch", rw_watch_l_watch },
        { "unwatch", rw_watch_l_unwatch },
        { "events", engine_l_events },
        { "timeout", engine_l_timeout },
#ifdef RW_FAULTS
        { "fail_next", engine_l_fail_next },
        { "all_drives", engine_l_all_drives },
#endif
        { "close", engine_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg engine_meta[] = {
        { "__gc", engine_l_close },
        { "__close", engine_l_close },
        { NULL, NULL }
    };
    luaL_newmetatable(L, ENGINE_MT);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &engine_mt_id);
    lua_pushvalue(L, -1); /* each method's first upvalue: the metatable (rw_check_udata) */
    luaL_setfuncs(L, engine_meta, 1);
    lua_createtable(L, 0, (int)(sizeof engine_methods / sizeof *engine_methods) - 1);
    lua_pushvalue(L, -2);
    luaL_setfuncs(L, engine_methods, 1);
    lua_pushvalue(L, -2);
    luaL_setfuncs(L, rw_wake_methods, 1);
    /* The Lua layer calls the hot ones as local functions: a method looked
     * up through a userdata's metatable costs a look-up a call. */
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, "engine_methods");
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    rw_transfer_register(L);
    lua_pushcfunction(L, engine_l_new);
    lua_setfield(L, -2, "engine");
    lua_pushcfunction(L, rw_response_l_headers);
    lua_setfield(L, -2, "response_headers");
    rw_request_register(L);
}
