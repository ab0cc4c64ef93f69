/*
 * A Lua host for spec/engine_spec.lua whose Lua allocator can be told to
 * fail: what ratewise.core does when a Lua allocation fails at a chosen
 * point cannot be seen from a plain lua5.4.
 *
 *   oom_host script.lua [args...]
 *
 * The script finds ratewise.core already loaded (linked in, from src/) and
 * a global fail_allocations(on): while on, every allocation that would
 * grow a block fails (freeing and shrinking still work), so the next Lua
 * allocation raises "not enough memory". fail_allocations(n), a number,
 * lets n more such allocations through first. A global curl_blocks() tells how
 * many blocks libcurl has allocated and not freed, so that a script can
 * see whether a raise left one of them behind.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

int luaopen_ratewise_core(lua_State *L);

#ifndef LUA_OK
#define LUA_OK 0 /* Lua 5.1 and LuaJIT have no name for success */
#endif

static int oom_failing;
static long oom_allowed; /* growing allocations still let through while failing */

static void *oom_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    /* osize is a type tag, not a size, when ptr is NULL. */
    if (oom_failing && (ptr == NULL || nsize > osize)) {
        if (oom_allowed == 0) return NULL;
        oom_allowed--;
    }
    return realloc(ptr, nsize);
}

/* libcurl's allocations, counted (curl_global_init_mem): the blocks it
 * holds. */
static long oom_curl_blocks;

static void *oom_curl_malloc(size_t size)
{
    void *p = malloc(size);
    if (p) oom_curl_blocks++;
    return p;
}

static void oom_curl_free(void *p)
{
    if (p) oom_curl_blocks--;
    free(p);
}

static void *oom_curl_realloc(void *p, size_t size)
{
    void *q = realloc(p, size);
    if (q && !p) oom_curl_blocks++;
    return q;
}

static char *oom_curl_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = oom_curl_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void *oom_curl_calloc(size_t count, size_t size)
{
    void *p = calloc(count, size);
    if (p) oom_curl_blocks++;
    return p;
}

static int oom_l_curl_blocks(lua_State *L)
{
    lua_pushnumber(L, (lua_Number)oom_curl_blocks);
    return 1;
}

static int oom_l_fail_allocations(lua_State *L)
{
    oom_failing = lua_toboolean(L, 1);
    oom_allowed = lua_type(L, 1) == LUA_TNUMBER ? (long)lua_tonumber(L, 1) : 0;
    return 0;
}

int main(int argc, char **argv)
{
    lua_State *L;
    int i, status;
    if (argc < 2) {
        fprintf(stderr, "usage: oom_host script.lua [args...]\n");
        return 2;
    }
    if (curl_global_init_mem(CURL_GLOBAL_ALL, oom_curl_malloc, oom_curl_free, oom_curl_realloc, oom_curl_strdup,
                             oom_curl_calloc) != CURLE_OK) {
        fprintf(stderr, "oom_host: curl_global_init_mem failed\n");
        return 1;
    }
    L = lua_newstate(oom_alloc, NULL);
    if (!L) return 1;
    luaL_openlibs(L);
    /* require "ratewise.core" finds it (luaL_requiref is 5.2 and later) */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_ratewise_core);
    lua_setfield(L, -2, "ratewise.core");
    lua_pop(L, 2);
    lua_register(L, "fail_allocations", oom_l_fail_allocations);
    lua_register(L, "curl_blocks", oom_l_curl_blocks);
    lua_createtable(L, argc, 0);
    for (i = 0; i < argc - 1; i++) {
        lua_pushstring(L, argv[i + 1]);
        lua_rawseti(L, -2, i);
    }
    lua_setglobal(L, "arg");
    status = luaL_dofile(L, argv[1]);
    if (status != LUA_OK) fprintf(stderr, "oom_host: %s\n", lua_tostring(L, -1));
    lua_close(L);
    return status == LUA_OK ? 0 : 1;
}
