/*
 * ratewise.Transfer: the life of a transfer's record (engine:start takes
 * one, the end of a transfer moves it to its engine's finished list,
 * closing it gives it back), and the methods of the Lua object that holds
 * it.
 *
 * A transfer's record (its easy handle, its buffers, its error text) lives
 * in C memory and is recycled through a small pool, so that a request
 * leaves almost nothing for the Lua collector: the Lua object is a box
 * holding a pointer. Under a steady load that matters twice: less work for
 * the collector, and a heap that does not grow and shrink at its top every
 * cycle (with glibc that means page faults on every cycle).
 */
#include <openssl/ssl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* What a handle of engine e has before any request's options, new or
 * reset: libcurl's receive buffer, and the engine's own callback on closed
 * sockets (the record stays with this engine for its whole life,
 * rw_transfer_give). */
static void transfer_handle_init(engine *e, transfer *t)
{
    t->recv_buffer = ENGINE_RECV_MAX; /* libcurl's default */
    curl_easy_setopt(t->easy, CURLOPT_CLOSESOCKETFUNCTION, rw_watch_on_close);
    curl_easy_setopt(t->easy, CURLOPT_CLOSESOCKETDATA, e);
    curl_easy_setopt(t->easy, CURLOPT_ERRORBUFFER, t->errbuf);
}

void rw_transfer_buffer_size(transfer *t, long size)
{
    if (t->recv_buffer == size) return;
    t->recv_buffer = size;
    curl_easy_setopt(t->easy, CURLOPT_BUFFERSIZE, size);
}

/* Such a transfer reads with libcurl's full buffer (see ENGINE_RECV_MAX),
 * set before libcurl starts it, and counts for the all-at-once drive
 * (engine.c, engine_drive) until it ends. */
void rw_transfer_may_multiplex(transfer *t)
{
    rw_transfer_buffer_size(t, ENGINE_RECV_MAX);
    if (t->may_multiplex || !t->engine) return;
    t->may_multiplex = 1;
    t->engine->nmultiplex++;
}

/* t, leaving its engine, no longer counts there. */
static void transfer_multiplex_off(engine *e, transfer *t)
{
    if (t->may_multiplex) e->nmultiplex--;
    t->may_multiplex = 0;
}

void rw_transfer_why(transfer *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    /* the analyzer does not see va_start set ap up (a false positive) */
    (void)vsnprintf(t->errbuf, sizeof t->errbuf, fmt, ap); /* NOLINT(clang-analyzer-valist.Uninitialized) */
    va_end(ap);
}

/* A pooled record's handle keeps the options that every transfer sets
 * alike; *fresh says whether they still have to be set. NULL: out of memory.
 * The record is done (never started) until rw_transfer_launch. */
transfer *rw_transfer_take(engine *e, int *fresh)
{
    transfer *t;
    *fresh = e->npool == 0;
    if (e->npool > 0) {
        t = e->pool[--e->npool];
        e->kept -= t->body.cap;
        t->state = TRANSFER_DONE;
        return t;
    }
    t = (transfer *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->easy = curl_easy_init();
    if (!t->easy) {
        free(t);
        return NULL;
    }
    t->state = TRANSFER_DONE;
    t->ref = LUA_NOREF;
    transfer_handle_init(e, t);
    return t;
}

/* libcurl mallocs its receive buffer when a transfer starts and frees it
 * when the transfer ends. At libcurl's 16 KiB, amid the Lua heap's own
 * churn, glibc seldom finds a free block that size: it grows the heap for
 * the buffer, and gives the memory back when the buffer is freed, so under
 * a steady load the heap's top grows and shrinks every few requests, each
 * time with fresh page faults. A buffer of about half the usual
 * response keeps the recv calls per response few and the heap still: the size follows a moving average of the responses seen, from
 * libcurl's minimum (1 KiB) up to its default, never above. */
static long transfer_small_buffer(const engine *e)
{
    long size = ENGINE_RECV_MIN;
    while (size < ENGINE_RECV_MAX && (double)size * 2 < e->response_bytes) size *= 2;
    return size;
}

int rw_transfer_h2_only(const engine *e, unsigned long long key)
{
    int i;
    for (i = 0; key && i < ENGINE_GATES; i++)
        if (e->h2_only[i] == key) return 1;
    return 0;
}

int rw_transfer_alpn_none(transfer *t)
{
    /* libcurl says what ALPN agreed on only once a response came; OpenSSL
     * says it as the handshake ends (the libssl libcurl's OpenSSL backend
     * uses: one library in the process). Another TLS backend: no answer. */
    struct curl_tlssessioninfo *tls = NULL;
    const unsigned char *protocol = NULL;
    unsigned int len = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_TLS_SSL_PTR, &tls) != CURLE_OK || !tls
        || tls->backend != CURLSSLBACKEND_OPENSSL || !tls->internals)
        return 0;
    SSL_get0_alpn_selected((const SSL *)tls->internals, &protocol, &len);
    return len == 0;
}

int rw_transfer_again(engine *e, transfer *t, CURLcode code)
{
    CURLMcode mc;
    if (code != CURLE_ABORTED_BY_CALLBACK || !t->alpn_refused) return 0;
    if (!rw_transfer_h2_only(e, t->h1_key)) {
        e->h2_only[e->h2_only_next] = t->h1_key;
        e->h2_only_next = (e->h2_only_next + 1) % ENGINE_GATES;
    }
    curl_multi_remove_handle(e->multi, t->easy);
    rw_request_offer_h2(t);
    rw_transfer_may_multiplex(t);
    mc = curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        /* nothing went out: a failure to connect, retried as such */
        rw_transfer_finish(t, CURLE_COULDNT_CONNECT, ABORT_NONE);
        rw_transfer_why(t, "libcurl could not start the transfer again (%s)", curl_multi_strerror(mc));
        rw_transfer_queue(e, t);
    }
    return 1;
}

CURLMcode rw_transfer_launch(engine *e, transfer *t)
{
    CURLMcode mc;
    t->engine = e; /* for the gate's lists */
    if (t->gate_key) rw_transfer_may_multiplex(t);
    else rw_transfer_buffer_size(t, transfer_small_buffer(e));
    mc = rw_gate_hold(e, t) ? CURLM_OK : curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        rw_gate_unprobe(e, t); /* no probe after all: the origin stays unknown */
        transfer_multiplex_off(e, t);
        t->engine = NULL;
        return mc;
    }
    t->state = TRANSFER_RUNNING;
    engine_list_add(&e->running, t);
    t->started = rw_core_monotonic();
    if (t->timeout > 0) t->expires = t->started + t->timeout + ENGINE_EXPIRY_GRACE;
    return CURLM_OK;
}

void rw_transfer_ref(lua_State *L, engine *e, int refs, transfer *t) { t->ref = rw_engine_ref(L, e, refs); }

void rw_transfer_unref(lua_State *L, engine *e, int refs, transfer *t)
{
    rw_engine_unref(L, e, refs, t->ref);
    t->ref = LUA_NOREF;
}

/* Options libcurl cannot put back one by one (TLS files, a pin, a proxy)
 * change from one request on the handle to the next (rw_request_configure):
 * every option is forgotten, and the handle is set up as new, the engine's
 * own callback on closed sockets included (request.c forgets what it knew
 * of the handle's options). */
void rw_transfer_reset(engine *e, transfer *t)
{
    curl_easy_reset(t->easy);
    transfer_handle_init(e, t);
}

void rw_transfer_destroy(transfer *t)
{
    curl_easy_cleanup(t->easy);
    rw_request_free(t);
    rw_response_free(t);
    free(t);
}

static void transfer_news_drop(engine *e, transfer *t)
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

transfer *rw_transfer_news_pop(engine *e)
{
    transfer *t = e->news;
    if (!t) return NULL;
    e->news = t->news_next;
    t->news_next = NULL;
    t->in_news = 0;
    return t;
}

/* The largest body buffer a record going back to the pool keeps: the
 * pooled records keep ENGINE_KEEP_TOTAL bytes at most in all. */
static size_t transfer_keep(const engine *e)
{
    size_t left = e->kept < (size_t)ENGINE_KEEP_TOTAL ? (size_t)ENGINE_KEEP_TOTAL - e->kept : 0;
    return left < (size_t)ENGINE_KEEP_BUFFER ? left : (size_t)ENGINE_KEEP_BUFFER;
}

/* Back to the pool of engine e (NULL, or closed: freed instead), with what
 * the last request left behind let go of. */
void rw_transfer_give(engine *e, transfer *t)
{
    transfer_news_drop(e, t);
    rw_redirect_clear(t);
    if (!e || !e->multi || e->npool >= ENGINE_POOL_MAX) {
        rw_transfer_destroy(t);
        return;
    }
    /* Each file forgets what it wrote of the last transfer. */
    rw_response_keep_body(t, transfer_keep(e));
    e->kept += t->body.cap;
    rw_response_clear(t, ENGINE_KEEP_HEAD);
    rw_request_clear(t); /* its header lists stay, for a next request with the same lines */
    rw_gate_clear(t);
    t->aborted = ABORT_NONE;
    t->code = CURLE_OK;
    t->multi_code = CURLM_OK;
    t->errbuf[0] = '\0';
    t->started = t->expires = 0;
    t->notify = 0;
    t->bounded = 0;
    t->status = t->request_size = t->http_version = 0;
    t->total_time = 0;
    t->state = TRANSFER_CLOSED;
    t->ref = LUA_NOREF;
    e->pool[e->npool++] = t;
}

void rw_transfer_hop_ended(transfer *t)
{
    double hop_time = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_TOTAL_TIME, &hop_time) == CURLE_OK) t->total_time += hop_time;
    t->request_size += engine_sent(t);
}

void rw_transfer_fail(transfer *t, CURLMcode mc)
{
    t->multi_code = mc;
    rw_transfer_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_MULTI_FAILED);
}

/* Takes a running transfer off the multi handle, keeping what libcurl knows
 * about its outcome. Its engine forgets it: see rw_transfer_queue. */
void rw_transfer_finish(transfer *t, CURLcode code, enum transfer_abort aborted)
{
    engine *e = t->engine;
    CURL *easy = t->easy;
    int held;
    if (!e) return;
    held = t->held;
    if (t->gate_slot) rw_gate_leave(e, t);
    transfer_news_drop(e, t); /* finished, it is reported once, as such */
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
        rw_transfer_hop_ended(t);
        /* Removing a transfer that has not completed closes its
         * connection instead of returning it to the cache, which is what
         * an abort needs. */
        curl_multi_remove_handle(e->multi, easy);
    }
    engine_list_remove(&e->running, t);
    transfer_multiplex_off(e, t);
    t->engine = NULL;
    t->state = TRANSFER_DONE;
}

/* A finished transfer waits in its engine's finished list until poll has
 * put it in the caller's table: a transfer libcurl reported is never lost,
 * whatever fails in between. */
void rw_transfer_queue(engine *e, transfer *t)
{
    engine_list_add(&e->finished, t);
    t->engine = e;
}

/* Drops a finished transfer from the list of those poll is to report. */
void rw_transfer_unqueue(transfer *t)
{
    if (t->state != TRANSFER_DONE || !t->engine) return;
    engine_list_remove(&t->engine->finished, t);
    t->engine = NULL;
}

void rw_transfer_progress(transfer *t)
{
    engine *e = t->engine;
    if (!e || t->state != TRANSFER_RUNNING) return;
    if (t->notify && !t->in_news) {
        t->notify = 0;
        t->in_news = 1;
        t->news_next = e->news;
        e->news = t;
    }
    engine_note_expiry(e, t);
}

/* engine:trim's share: the pooled records let go of their large body
 * buffers. */
void rw_transfer_trim(engine *e)
{
    int i;
    for (i = 0; i < e->npool; i++) {
        transfer *t = e->pool[i];
        e->kept -= t->body.cap;
        rw_response_keep_body(t, ENGINE_KEEP_SMALL);
        e->kept += t->body.cap;
    }
}

/* ---- Transfer methods ---- */

/* The transfers' metatable in the registry, by this address (rw_check_udata). */
static const char transfer_mt_id = 0;

static transfer_box *transfer_check_box(lua_State *L)
{
    return (transfer_box *)rw_check_udata(L, 1, &transfer_mt_id, TRANSFER_MT);
}

static transfer *transfer_check(lua_State *L)
{
    transfer_box *box = transfer_check_box(L);
    if (!box->t) luaL_argerror(L, 1, "transfer is closed");
    return box->t;
}

static int transfer_l_done(lua_State *L)
{
    lua_pushboolean(L, transfer_check(L)->state == TRANSFER_DONE);
    return 1;
}

/* transfer:set_owner(owner): the owner the poll that reports this transfer
 * names with it (see engine:start); nil: none. The poll that reports it
 * finished names it, once; one that reports a stream's news (transfer:head
 * or transfer:read answered nil) names it and forgets it, since the
 * reader that waited has its news. Set once the transfer was reported
 * finished, it is never named. */
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
            if (lua_getiuservalue(L, -1, 1) == LUA_TTABLE) rw_engine_unref(L, e, lua_gettop(L), t->ref);
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
    t->ref = LUA_NOREF;
    RW_STACK_EXPECT(L, mark, 0);
    return e;
}

/* A transfer ended outside a drive of engine e: those its gates held
 * behind it (rw_gate_hold: to an origin that multiplexes, waiting for
 * libcurl to have run) go on now, as the drive that would have let them
 * go may not come while nothing else runs. */
static void transfer_held_go(engine *e)
{
    if (e && e->gates_answered) rw_gate_release_answered(e);
}

/* transfer:cancel(): aborts a running transfer and closes its connection. */
static int transfer_l_cancel(lua_State *L)
{
    transfer *t = transfer_check(L);
    if (t->state == TRANSFER_RUNNING) {
        engine *e = transfer_detach(L, t);
        rw_transfer_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_CANCELLED);
        transfer_held_go(e);
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
    if (t->state == TRANSFER_RUNNING) {
        rw_transfer_finish(t, CURLE_ABORTED_BY_CALLBACK, ABORT_CANCELLED);
        transfer_held_go(e);
    } else {
        rw_transfer_unqueue(t);
    }
    rw_transfer_give(e, t);
}

/* Idempotent; transfer:close(), __close and __gc. */
static int transfer_l_close(lua_State *L)
{
    transfer_release(L, transfer_check_box(L));
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
        if (rw_response_read(L, t, t->state == TRANSFER_RUNNING)) {
            engine *e = t->engine;
            CURLcode rc;
            /* libcurl hands the chunk it kept to the write callback (which
             * only buffers it) and asks its timer to run the transfer on. */
            rc = curl_easy_pause(t->easy, CURLPAUSE_CONT);
            if (rc != CURLE_OK && e) {
                /* the chunk libcurl kept was refused (max_body, out of
                 * memory): the transfer ends with why, not without it */
                rw_transfer_finish(t, rc, ABORT_NONE);
                rw_transfer_queue(e, t);
                return 1;
            }
            engine_note_expiry(e, t);
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
        t->bounded = 1;
        engine_note_expiry(t->engine, t);
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

/* transfer:result([lazy [, close [, recycle [, mt [, url]]]]]) -> response
 * table | nil, error table (response.c). close: the transfer is closed once
 * its result is made, as transfer:close() would (one call less for a caller
 * that is done with it). recycle (with close): the caller holds no other
 * reference to this transfer object and drops its own, so that
 * engine:start may hand the object out again for another transfer
 * (runtime.transfer's). mt: a table made the metatable of a response (not
 * of an error), which spares fetch a call of its own. url: a string, the
 * response's url when no redirect was followed (which sets the URL the
 * redirects led to). */
static int transfer_l_result(lua_State *L)
{
    transfer_box *box = transfer_check_box(L);
    int n, close = lua_toboolean(L, 3), recycle = close && lua_toboolean(L, 4); /* read before the results go on the stack */
    int mt = !lua_isnoneornil(L, 5), url = !lua_isnoneornil(L, 6);
    if (mt) luaL_checktype(L, 5, LUA_TTABLE);
    if (url) luaL_checktype(L, 6, LUA_TSTRING);
    if (!box->t) return luaL_argerror(L, 1, "transfer is closed");
    n = rw_response_result(L, box->t, lua_toboolean(L, 2), url ? 6 : 0);
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

void rw_transfer_register(lua_State *L)
{
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
    luaL_newmetatable(L, TRANSFER_MT);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &transfer_mt_id);
    rw_response_push_keys(L);
    lua_rawseti(L, -2, TRANSFER_MT_RESPONSE_KEYS);
    lua_pushvalue(L, -1); /* each method's first upvalue: the metatable (rw_check_udata) */
    luaL_setfuncs(L, transfer_meta, 1);
    lua_createtable(L, 0, (int)(sizeof transfer_methods / sizeof *transfer_methods) - 1);
    lua_pushvalue(L, -2);
    luaL_setfuncs(L, transfer_methods, 1);
    lua_pushvalue(L, -1); /* as engine_methods (engine.c) */
    lua_setfield(L, -4, "transfer_methods");
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}
