/*
 * The one place that knows which Lua the C core is built against: Lua 5.1,
 * LuaJIT 2.1, Lua 5.2 (mpv's), Lua 5.3 or Lua 5.4. Every file of src/ that talks to Lua
 * includes this instead of lua.h and lauxlib.h, and writes the Lua 5.4 API.
 *
 * - Lua 5.1, LuaJIT and Lua 5.2: lua-compat-5.3 (Debian's lua-compat53-dev, the
 *   header cqueues, luv and lua-cjson's users vendor) supplies the 5.3 API:
 *   luaL_setfuncs, luaL_tolstring, lua_geti, lua_isinteger, the int results
 *   of lua_getfield and lua_rawget... Its functions are compiled into each
 *   file as unused-tolerant statics. Lua 5.1 and LuaJIT keep user values
 *   in the userdata's environment table; Lua 5.2 has user values as 5.3.
 * - Lua 5.3 and earlier: the 5.4 user values. A 5.4 userdata has n of them;
 *   before, one value (5.3) or its environment (5.1). No compat library
 *   covers that: here a userdata that asks for n gets one table holding
 *   them, in its single user value.
 *
 * The Makefile builds each Lua into its own folder, with that Lua's headers
 * (and, for LuaJIT, lua-compat-5.3's folder after LuaJIT's own).
 */
#ifndef RATEWISE_COMPAT_H
#define RATEWISE_COMPAT_H

#include "lua.h"
#include "lauxlib.h"

#if LUA_VERSION_NUM < 503
/* Its own code casts const away (a registry key from a string); the rest of
 * ours is held to -Wcast-qual. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcast-qual"
#include "compat-5.3.h"
#pragma GCC diagnostic pop
#endif

#if LUA_VERSION_NUM < 504

static inline void *compat_newuserdatauv(lua_State *L, size_t size, int nuv)
{
    void *p = lua_newuserdata(L, size);
    if (nuv > 0) {
        lua_createtable(L, nuv, 0);
        lua_setuservalue(L, -2);
    }
    return p;
}

#if LUA_VERSION_NUM < 502
/* Lua 5.1 and LuaJIT: a userdata's environment is always a table, which
 * holds lua_newuserdatauv's values (ours are the only userdata these are
 * called on). The raw lua_rawgeti, in parentheses: compat-5.3's asks
 * lua_type after every push, as lua_getuservalue's does. */

/* Pushes user value n of the userdata at idx and returns its type. */
static inline int compat_getiuservalue(lua_State *L, int idx, int n)
{
    lua_getfenv(L, idx);
    (lua_rawgeti)(L, -1, n);
    lua_remove(L, -2);
    return lua_type(L, -1);
}

/* Pops a value into user value n of the userdata at idx; 1. */
static inline int compat_setiuservalue(lua_State *L, int idx, int n)
{
    idx = lua_absindex(L, idx);
    lua_getfenv(L, idx);
    lua_insert(L, -2);
    lua_rawseti(L, -2, n);
    lua_pop(L, 1);
    return 1;
}

#else
/* Pushes user value n of the userdata at idx and returns its type; pushes
 * nil and returns LUA_TNONE when there is no such value. */
static inline int compat_getiuservalue(lua_State *L, int idx, int n)
{
    int type;
    lua_getuservalue(L, idx);
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_pushnil(L);
        return LUA_TNONE;
    }
    type = lua_rawgeti(L, -1, n);
    lua_remove(L, -2);
    return type;
}

/* Pops a value into user value n of the userdata at idx; 0 when the
 * userdata has none (the value is popped all the same). */
static inline int compat_setiuservalue(lua_State *L, int idx, int n)
{
    idx = lua_absindex(L, idx);
    lua_getuservalue(L, idx);
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 2);
        return 0;
    }
    lua_insert(L, -2);
    lua_rawseti(L, -2, n);
    lua_pop(L, 1);
    return 1;
}

#endif

#define lua_newuserdatauv compat_newuserdatauv
#define lua_getiuservalue compat_getiuservalue
#define lua_setiuservalue compat_setiuservalue

#endif

/* lua_rawgeti for a push whose type nobody asks. Under lua-compat-5.3 it is
 * the raw call, in parentheses: the compat macro calls lua_type after each
 * push. */
#if LUA_VERSION_NUM < 503
#define rw_rawgeti(L, idx, n) (lua_rawgeti)((L), (idx), (n))
#else
#define rw_rawgeti(L, idx, n) ((void)lua_rawgeti((L), (idx), (n)))
#endif

#endif
