/* core.json_plain(value [, host_null]): whether lua-cjson writes value with
 * the bytes ratewise's own encoder (lua/ratewise/json/pure.lua) writes, but
 * for lua-cjson's "\/" for "/", which lua/ratewise/json.lua undoes. That
 * holds when every number is exact in lua-cjson's "%.14g" (a whole number
 * below 1e14 in magnitude, or a float that reads back the same from 14
 * digits), every string and key is ASCII (the pure encoder checks UTF-8),
 * every key is a string or a number, every table is plain (no metatable:
 * the pure encoder walks with pairs, lua-cjson with lua_next) and nested
 * at most JSON_PLAIN_DEPTH deep, and the only null is rw.null (the light
 * userdata NULL; host_null, a host's own null such as vim.NIL, is the pure
 * encoder's to write). Anything else answers false: the pure encoder
 * writes it, or names what cannot be written.
 *
 * Why in C: json.encode asks it of every JSON request body, and a walk of
 * the body in Lua cost more than lua-cjson's encoding of it. It reads
 * values the caller made, never bytes from the network. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "compat.h"
#include "ratewise.h"

#define JSON_PLAIN_DEPTH 16
#define JSON_PLAIN_DIGITS 1e14 /* whole numbers below it: all their digits in "%.14g" */

static int json_number_plain(lua_State *L, int idx)
{
    lua_Number n;
    char text[32];
#if LUA_VERSION_NUM >= 503
    if (lua_isinteger(L, idx)) {
        lua_Integer i = lua_tointeger(L, idx);
        return i > -(lua_Integer)100000000000000 && i < (lua_Integer)100000000000000;
    }
#endif
    n = lua_tonumber(L, idx);
    if (isnan(n) || isinf(n)) return 0;
    if (floor(n) == n) return n > -JSON_PLAIN_DIGITS && n < JSON_PLAIN_DIGITS;
    (void)snprintf(text, sizeof text, "%.14g", (double)n);
    return strtod(text, NULL) == (double)n;
}

static int json_string_plain(lua_State *L, int idx)
{
    size_t len, i;
    const unsigned char *s = (const unsigned char *)lua_tolstring(L, idx, &len);
    for (i = 0; i < len; i++)
        if (s[i] >= 0x80) return 0;
    return 1;
}

/* A key lua-cjson and the pure encoder write alike: a string, or a number
 * (written as its text); never converted in place (lua_next's key). */
static int json_key_plain(lua_State *L, int idx)
{
    int t = lua_type(L, idx);
    if (t == LUA_TSTRING) return json_string_plain(L, idx);
    return t == LUA_TNUMBER && json_number_plain(L, idx);
}

static int json_plain_at(lua_State *L, int idx, int depth, int host_null)
{
    switch (lua_type(L, idx)) {
    case LUA_TSTRING:
        return json_string_plain(L, idx);
    case LUA_TNUMBER:
        return json_number_plain(L, idx);
    case LUA_TBOOLEAN:
        return 1;
    case LUA_TLIGHTUSERDATA:
        return lua_touserdata(L, idx) == NULL;
    case LUA_TTABLE:
        break;
    default:
        return 0;
    }
    if (depth >= JSON_PLAIN_DEPTH) return 0;
    if (host_null && lua_rawequal(L, idx, host_null)) return 0;
    if (lua_getmetatable(L, idx)) {
        lua_pop(L, 1);
        return 0;
    }
    luaL_checkstack(L, 3, "json_plain: nesting");
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (!json_key_plain(L, -2) || !json_plain_at(L, lua_gettop(L), depth + 1, host_null)) {
            lua_pop(L, 2);
            return 0;
        }
        lua_pop(L, 1);
    }
    return 1;
}

static int json_l_plain(lua_State *L)
{
    int host_null = lua_isnoneornil(L, 2) ? 0 : 2;
    luaL_checkany(L, 1);
    lua_pushboolean(L, json_plain_at(L, 1, 0, host_null));
    return 1;
}

void rw_json_register(lua_State *L)
{
    lua_pushcfunction(L, json_l_plain);
    lua_setfield(L, -2, "json_plain");
}
