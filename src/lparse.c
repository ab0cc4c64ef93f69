/*
 * Lua bindings of the parsers and the retry arithmetic in parse.c.
 *
 * Kept apart from parse.c so that the parsers build without Lua, which is
 * what the fuzz targets in fuzz/ need.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "compat.h"
#include "ratewise.h"

static int lparse_l_classify(lua_State *L)
{
    lua_Integer status;
    if (lua_type(L, 1) != LUA_TNUMBER || !lua_isinteger(L, 1)) {
        lua_Number n = lua_tonumber(L, 1);
        if (lua_type(L, 1) != LUA_TNUMBER || n != floor(n) || fabs(n) > 1e9)
            return luaL_argerror(L, 1, "status must be an integer");
        status = (lua_Integer)n;
    } else {
        status = lua_tointeger(L, 1);
    }
    lua_pushstring(L, rwp_classify(status < 0 || status > 999 ? 0 : (long)status));
    return 1;
}

/* The "now" argument, or the wall clock when it is absent. */
static double lparse_now(lua_State *L, int arg)
{
    lua_Number now;
    if (lua_isnoneornil(L, arg)) return rw_core_realtime();
    now = luaL_checknumber(L, arg);
    luaL_argcheck(L, isfinite(now), arg, "now must be a finite number");
    return now;
}

/* A parsed value: an integer where it is whole (on the Luas that have
 * integers), so that "120" seconds reads back as 120, not 120.0. */
static void lparse_push_value(lua_State *L, double v)
{
    lua_Integer whole;
    if (v == floor(v) && lua_numbertointeger(v, &whole)) lua_pushinteger(L, whole);
    else lua_pushnumber(L, v);
}

typedef int (*lparse_clock_fn)(const char *s, size_t len, double now, double *out);

/* The bindings of the parsers read against a clock (argument 2, or the wall
 * clock): nil for a value that does not parse; a non-string raises. */
static int lparse_apply_now(lua_State *L, lparse_clock_fn fn)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    double out;
    if (fn(s, len, lparse_now(L, 2), &out)) lparse_push_value(L, out);
    else lua_pushnil(L);
    return 1;
}

/* An HTTP-date has whole seconds, so its epoch seconds are an integer
 * (years 0000-9999 fit any lua_Integer of 5.3 and later). */
static int lparse_l_http_date(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    double out;
    if (rwp_parse_http_date(s, len, lparse_now(L, 2), &out)) lparse_push_value(L, out);
    else lua_pushnil(L);
    return 1;
}

static int lparse_l_retry_after(lua_State *L) { return lparse_apply_now(L, rwp_parse_retry_after); }

typedef int (*lparse_fn)(const char *s, size_t len, double *out);

/* The bindings of the parsers that need no clock: nil for a value that
 * does not parse; a non-string raises. */
static int lparse_apply(lua_State *L, lparse_fn fn)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    double out;
    if (fn(s, len, &out)) lparse_push_value(L, out);
    else lua_pushnil(L);
    return 1;
}

static int lparse_l_seconds(lua_State *L) { return lparse_apply(L, rwp_parse_seconds); }
static int lparse_l_duration(lua_State *L) { return lparse_apply(L, rwp_parse_duration); }
static int lparse_l_rfc3339(lua_State *L) { return lparse_apply(L, rwp_parse_rfc3339); }

/* backoff(attempt, base, max_delay, jitter, u [, previous]): the options are
 * checked by the Lua layer, which names them; these checks catch misuse of
 * the core itself. */
static int lparse_l_backoff(lua_State *L)
{
    static const char *const names[] = { "none", "full", "equal", "decorrelated", NULL };
    static const enum rwp_jitter kinds[] = {
        RWP_JITTER_NONE, RWP_JITTER_FULL, RWP_JITTER_EQUAL, RWP_JITTER_DECORRELATED
    };
    lua_Number attempt = luaL_checknumber(L, 1);
    lua_Number base = luaL_checknumber(L, 2);
    lua_Number max_delay = luaL_checknumber(L, 3);
    int jitter = luaL_checkoption(L, 4, "full", names);
    lua_Number u = luaL_optnumber(L, 5, 0.0);
    lua_Number previous = luaL_optnumber(L, 6, base);
    luaL_argcheck(L, attempt >= 0 && attempt == floor(attempt), 1,
                  "attempt must be a non-negative integer");
    luaL_argcheck(L, base > 0 && isfinite(base), 2, "base must be a positive number");
    luaL_argcheck(L, max_delay >= 0 && !isnan(max_delay), 3,
                  "max_delay must be a non-negative number");
    luaL_argcheck(L, u >= 0 && u < 1, 5, "random value must be in [0, 1)");
    luaL_argcheck(L, previous >= 0 && isfinite(previous), 6,
                  "previous delay must be a non-negative number");
    lua_pushnumber(L, rwp_backoff(attempt, base, max_delay, kinds[jitter], u, previous));
    return 1;
}

/* ---- Link (parse.c) ---- */

/* ref resolved against base (RFC 3986 section 5, by libcurl's URL parser):
 * a URL to curl_free, or NULL with *why set. */
static char *lparse_resolve(const char *base, const char *ref, const char **why)
{
    CURLU *u = curl_url();
    char *out = NULL;
    if (!u) {
        *why = "out of memory resolving the link";
        return NULL;
    }
    if (curl_url_set(u, CURLUPART_URL, base, 0) != CURLUE_OK) {
        *why = "the response's URL does not parse";
    } else if (curl_url_set(u, CURLUPART_URL, ref, 0) != CURLUE_OK
               || curl_url_get(u, CURLUPART_URL, &out, 0) != CURLUE_OK) {
        *why = "the link's target is not a URL reference";
        out = NULL;
    }
    curl_url_cleanup(u);
    return out;
}

/* (under lua_pcall) the C string at the light userdata, as a Lua string */
static int lparse_push_url(lua_State *L)
{
    lua_pushstring(L, (const char *)lua_touserdata(L, 1));
    return 1;
}

/* core.link(value, rel [, base]) -> url | nil | nil, why: the target of
 * the first link-value of a Link field value whose rel names rel, resolved
 * against base when given; nil when there is none; nil and why when its
 * target does not resolve (why does not quote it: a server's link may hold
 * a token). */
static int lparse_l_link(lua_State *L)
{
    size_t len, rel_len, base_len, target_len, i;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *rel = luaL_checklstring(L, 2, &rel_len);
    const char *base = luaL_optlstring(L, 3, NULL, &base_len);
    const char *target, *ref, *why = NULL;
    char *url;
    int status;
    luaL_argcheck(L, rel_len > 0, 2, "rel must not be empty");
    luaL_argcheck(L, !base || strlen(base) == base_len, 3, "base must not hold a NUL byte");
    if (!rwp_link_find(s, len, rel, rel_len, &target, &target_len)) {
        lua_pushnil(L);
        return 1;
    }
    for (i = 0; i < target_len; i++) {
        unsigned char c = (unsigned char)target[i];
        if (c <= ' ' || c == 0x7f) {
            lua_pushnil(L);
            lua_pushliteral(L, "the link's target holds a space or a control character");
            return 2;
        }
    }
    if (!base) {
        lua_pushlstring(L, target, target_len);
        return 1;
    }
    ref = lua_pushlstring(L, target, target_len); /* (a NUL-terminated copy) */
    /* The copy of libcurl's URL into Lua may raise (out of memory): made
     * under lua_pcall, so that the URL is freed before the error goes on.
     * Everything the pcall needs is pushed before libcurl allocates. */
    luaL_checkstack(L, 3, "link");
    lua_pushcfunction(L, lparse_push_url);
    url = lparse_resolve(base, ref, &why);
    if (!url) {
        lua_pop(L, 2); /* the function and ref: the results alone above the arguments */
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    lua_pushlightuserdata(L, url);
    status = lua_pcall(L, 1, 1, 0);
    curl_free(url);
    if (status != 0) lua_error(L);
    lua_remove(L, -2); /* ref */
    return 1;
}

/* ---- server-sent events (sse.c) ---- */

#define LPARSE_SSE_MT "ratewise.SSEParser"
#define LPARSE_SSE_DEFAULT_MAX (1024 * 1024)

typedef struct lparse_sse {
    rwp_sse parser;
    int closed;
} lparse_sse;

/* core.sse_parser([max]) -> parser: a line or an event's data may hold at
 * most max bytes (default 1 MiB). */
static int lparse_l_sse_new(lua_State *L)
{
    lua_Number max = luaL_optnumber(L, 1, LPARSE_SSE_DEFAULT_MAX);
    lparse_sse *s;
    luaL_argcheck(L, max >= 1 && max <= (lua_Number)(1u << 30) && max == floor(max), 1,
                  "max must be a whole number of bytes from 1 to 2^30");
    s = (lparse_sse *)lua_newuserdatauv(L, sizeof *s, 0);
    rwp_sse_init(&s->parser, (size_t)max);
    s->closed = 0;
    luaL_setmetatable(L, LPARSE_SSE_MT);
    return 1;
}

static int lparse_sse_push(void *ctx, const rwp_sse_event *ev)
{
    lua_State *L = (lua_State *)ctx;
    lua_createtable(L, 0, 4);
    lua_pushlstring(L, ev->event, ev->event_len);
    lua_setfield(L, -2, "event");
    lua_pushlstring(L, ev->data, ev->data_len);
    lua_setfield(L, -2, "data");
    if (ev->id) {
        lua_pushlstring(L, ev->id, ev->id_len);
        lua_setfield(L, -2, "id");
    }
    if (ev->has_retry) {
        lua_pushinteger(L, (lua_Integer)ev->retry);
        lua_setfield(L, -2, "retry");
    }
    lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
    return 0;
}

/* parser:feed(chunk) -> {event, ...} (the events the chunk completed, in
 * order; often none) | nil, err when a line or an event is over max. */
static int lparse_l_sse_feed(lua_State *L)
{
    lparse_sse *s = (lparse_sse *)luaL_checkudata(L, 1, LPARSE_SSE_MT);
    size_t n;
    const char *chunk = luaL_checklstring(L, 2, &n);
    int rc;
    if (s->closed) return luaL_argerror(L, 1, "parser is closed");
    lua_settop(L, 2);
    lua_newtable(L);
    rc = rwp_sse_feed(&s->parser, chunk, n, lparse_sse_push, L);
    if (rc == 0) return 1;
    lua_pop(L, 1); /* the events so far: the error is the answer */
    lua_pushnil(L);
    if (rc == RWP_SSE_TOO_LARGE) {
        char limit[32];
        (void)snprintf(limit, sizeof limit, "%zu", s->parser.max);
        lua_pushfstring(L, "an event-stream line or event over %s bytes", limit);
    } else {
        lua_pushliteral(L, "out of memory parsing the event stream");
    }
    return 2;
}

/* Idempotent; __gc, __close and parser:close() all come here. */
static int lparse_l_sse_close(lua_State *L)
{
    lparse_sse *s = (lparse_sse *)luaL_checkudata(L, 1, LPARSE_SSE_MT);
    if (!s->closed) {
        s->closed = 1;
        rwp_sse_free(&s->parser);
    }
    return 0;
}

void rw_lparse_register(lua_State *L)
{
    static const luaL_Reg sse_methods[] = {
        { "feed", lparse_l_sse_feed },
        { "close", lparse_l_sse_close },
        { NULL, NULL }
    };
    static const luaL_Reg sse_meta[] = {
        { "__gc", lparse_l_sse_close },
        { "__close", lparse_l_sse_close },
        { NULL, NULL }
    };
    static const luaL_Reg funcs[] = {
        { "classify", lparse_l_classify },
        { "parse_http_date", lparse_l_http_date },
        { "parse_retry_after", lparse_l_retry_after },
        { "parse_seconds", lparse_l_seconds },
        { "parse_duration", lparse_l_duration },
        { "parse_rfc3339", lparse_l_rfc3339 },
        { "backoff", lparse_l_backoff },
        { "link", lparse_l_link },
        { "sse_parser", lparse_l_sse_new },
        { NULL, NULL }
    };
    luaL_newmetatable(L, LPARSE_SSE_MT);
    luaL_setfuncs(L, sse_meta, 0);
    luaL_newlib(L, sse_methods);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    luaL_setfuncs(L, funcs, 0);
}
