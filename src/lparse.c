/*
 * Lua bindings of the parsers and the retry arithmetic in parse.c.
 *
 * Kept apart from parse.c so that the parsers build without Lua, which is
 * what the fuzz targets in fuzz/ need.
 */
#include <math.h>

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
    if (lua_isnoneornil(L, arg)) return rw_clock_realtime();
    now = luaL_checknumber(L, arg);
    luaL_argcheck(L, isfinite(now), arg, "now must be a finite number");
    return now;
}

typedef int (*lparse_clock_fn)(const char *s, size_t len, double now, double *out);

/* The bindings of the parsers read against a clock (argument 2, or the wall
 * clock): nil for a value that does not parse; a non-string raises. */
static int lparse_apply_now(lua_State *L, lparse_clock_fn fn)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    double out;
    if (fn(s, len, lparse_now(L, 2), &out)) lua_pushnumber(L, out);
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
    lua_Integer whole;
    if (!rwp_parse_http_date(s, len, lparse_now(L, 2), &out)) lua_pushnil(L);
    else if (lua_numbertointeger(out, &whole)) lua_pushinteger(L, whole);
    else lua_pushnumber(L, out);
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
    if (fn(s, len, &out)) lua_pushnumber(L, out);
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

void rw_parse_register(lua_State *L)
{
    static const luaL_Reg funcs[] = {
        { "classify", lparse_l_classify },
        { "parse_http_date", lparse_l_http_date },
        { "parse_retry_after", lparse_l_retry_after },
        { "parse_seconds", lparse_l_seconds },
        { "parse_duration", lparse_l_duration },
        { "parse_rfc3339", lparse_l_rfc3339 },
        { "backoff", lparse_l_backoff },
        { NULL, NULL }
    };
    luaL_setfuncs(L, funcs, 0);
}
