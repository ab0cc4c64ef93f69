/*
 * ratewise.core: the module entry point and the clocks.
 */
#include <time.h>

#if defined(__GLIBC__) || defined(__linux__)
#include <malloc.h>
#endif

#include <curl/curl.h>

#include "lauxlib.h"
#include "ratewise.h"

double rw_clock_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double rw_clock_realtime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int core_l_now(lua_State *L)
{
    lua_pushnumber(L, rw_clock_monotonic());
    return 1;
}

static int core_l_time(lua_State *L)
{
    lua_pushnumber(L, rw_clock_realtime());
    return 1;
}

/* core.malloc_in_use() -> bytes the C heap has handed out and not had back
 * (glibc's mallinfo2), or nil elsewhere. A diagnostic for the soak: unlike
 * the resident size, it does not move with memory that malloc keeps free. */
static int core_l_malloc_in_use(lua_State *L)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    lua_pushnumber(L, (lua_Number)mi.uordblks + (lua_Number)mi.hblkhd);
#else
    lua_pushnil(L);
#endif
    return 1;
}

__attribute__((visibility("default"))) int luaopen_ratewise_core(lua_State *L);

int luaopen_ratewise_core(lua_State *L)
{
    static const luaL_Reg funcs[] = {
        { "now", core_l_now },
        { "time", core_l_time },
        { "malloc_in_use", core_l_malloc_in_use },
        { NULL, NULL }
    };
    luaL_checkversion(L);
    /* Reference-counted and thread-safe since libcurl 7.84; never undone,
     * because another user of libcurl in the process may still need it. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return luaL_error(L, "ratewise.core: libcurl failed to initialise");
    lua_newtable(L);
    luaL_setfuncs(L, funcs, 0);
    rw_parse_register(L);
    rw_bucket_register(L);
    rw_engine_register(L);
    lua_pushliteral(L, RW_VERSION);
    lua_setfield(L, -2, "version");
    lua_pushstring(L, curl_version());
    lua_setfield(L, -2, "curl_version");
    return 1;
}
