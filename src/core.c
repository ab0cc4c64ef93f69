/*
 * ratewise.core: the module entry point, the clocks and random bytes.
 */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__) && defined(__GLIBC__) \
    && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 25))
#include <sys/random.h>
#define CORE_HAVE_GETRANDOM 1
#endif

#if defined(__GLIBC__) || defined(__linux__)
#include <malloc.h>
#endif

#include <curl/curl.h>

#include "compat.h"
#include "poller.h"
#include "ratewise.h"

double rw_core_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double rw_core_realtime(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int core_l_now(lua_State *L)
{
    lua_pushnumber(L, rw_core_monotonic());
    return 1;
}

static int core_l_time(lua_State *L)
{
    lua_pushnumber(L, rw_core_realtime());
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

#define CORE_RANDOM_MAX 256

/* Fills buf with n bytes from /dev/urandom. 0 or an errno value. */
static int core_urandom(unsigned char *buf, size_t n)
{
    size_t got = 0;
    int fd, err = 0;
    do fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return errno;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r > 0) got += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else {
            err = r < 0 ? errno : EIO;
            break;
        }
    }
    close(fd);
    return err;
}

/* Fills buf with n bytes from the kernel's generator: getrandom(2), which
 * needs no descriptor (so it works when they are all in use) and blocks only
 * until the generator is first seeded at boot; /dev/urandom only on a
 * kernel without it. *source names what failed. 0 or an errno value. */
static int core_entropy(unsigned char *buf, size_t n, const char **source)
{
#ifdef CORE_HAVE_GETRANDOM
    size_t got = 0;
    *source = "getrandom";
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r > 0) got += (size_t)r;
        else if (r < 0 && errno == EINTR) continue;
        else if (r < 0 && errno == ENOSYS && got == 0) break;
        else return r < 0 ? errno : EIO;
    }
    if (got == n) return 0;
#endif
    *source = "/dev/urandom";
    return core_urandom(buf, n);
}

/* core.random_bytes(n) -> string of n bytes from the kernel's
 * cryptographic generator, or nil, err when none can be had (never a
 * weaker source in its place). n is an integer from 1 to 256. */
static int core_l_random_bytes(lua_State *L)
{
    unsigned char buf[CORE_RANDOM_MAX];
    lua_Integer n;
    const char *source = "";
    int err;
    luaL_checktype(L, 1, LUA_TNUMBER); /* not a string that looks like one */
    /* luaL_checkinteger would truncate 1.5 on Lua 5.1 and LuaJIT */
    luaL_argcheck(L, lua_tonumber(L, 1) == floor(lua_tonumber(L, 1)), 1, "must be an integer from 1 to 256");
    n = luaL_checkinteger(L, 1);
    luaL_argcheck(L, n >= 1 && n <= CORE_RANDOM_MAX, 1, "must be an integer from 1 to 256");
    err = core_entropy(buf, (size_t)n, &source);
    if (err != 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "no random bytes to be had: %s: %s", source, strerror(err));
        return 2;
    }
    lua_pushlstring(L, (const char *)buf, (size_t)n);
    return 1;
}

/* core.random() -> a number in [0, 1) from the kernel's generator (53
 * bits), or nil, err. What jitters waits: math.random is seeded alike in
 * every process on Lua 5.1, 5.3 and LuaJIT (nginx's workers included), so
 * processes that met the same 429 would draw the same waits and come back
 * together, which jitter is there to prevent. */
static int core_l_random(lua_State *L)
{
    unsigned char buf[7];
    const char *source = "";
    double x = 0;
    int i, err = core_entropy(buf, sizeof buf, &source);
    if (err != 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "no random bytes to be had: %s: %s", source, strerror(err));
        return 2;
    }
    buf[0] &= 0x1f; /* 5 + 6 * 8 = 53 bits: a double holds them exactly */
    for (i = 0; i < 7; i++) x = x * 256.0 + buf[i];
    lua_pushnumber(L, ldexp(x, -53));
    return 1;
}

/* core.isatty(fd) -> whether the descriptor is a terminal: what the
 * command-line tool asks before it draws a progress bar. */
static int core_l_isatty(lua_State *L)
{
    lua_Integer fd = luaL_checkinteger(L, 1);
    luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 1, "descriptor must be a non-negative integer");
    lua_pushboolean(L, isatty((int)fd) == 1);
    return 1;
}

/* core.unyielding(fn, ...) -> fn(...)'s results, called where nothing can
 * yield: a host that interrupts its coroutines at any instruction, where
 * they may yield (HAProxy's forced yield, every tune.lua.forced-yield
 * instructions), cannot stop the scheduler halfway through a step and let
 * another coroutine into it. fn's error goes on as it was. */
static int core_l_unyielding(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* core.few_fields(t) -> n, k1, v1, k2, v2, k3, v3: the fields of table t
 * in the order next() gives them, and how many (0 to 3), when it has no
 * metatable and three fields at most; false otherwise; nil when t is not a
 * table. What fetch asks of every options table (most hold one to three
 * options) in one call of C, where type, getmetatable and next took a call
 * each, and next one more for each field. */
static int core_l_few_fields(lua_State *L)
{
    int n = 0, base = lua_gettop(L);
    if (!lua_istable(L, 1)) {
        lua_pushnil(L);
        return 1;
    }
    if (lua_getmetatable(L, 1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 0);
        return 1;
    }
    lua_pushnil(L);
    while (lua_next(L, 1)) { /* (arguments), k1, v1, ..., k, v */
        if (n == 3) {
            lua_settop(L, base);
            lua_pushboolean(L, 0);
            return 1;
        }
        n++;
        lua_pushvalue(L, -2); /* the key, for the next call of lua_next */
    }
    lua_pushinteger(L, n);
    lua_insert(L, base + 1);
    return 1 + 2 * n;
}

#ifdef RW_STACK_CHECK
/* The stack checks of RW_STACK_CHECK builds (see ratewise.h). */
#include <stdio.h>
#include <stdlib.h>

void rw_core_stack_fail(const char *where, int line, int want, int got)
{
    (void)fprintf(stderr, "ratewise: Lua stack check failed in %s, line %d: height %d, expected %d\n", where,
                  line, got, want);
    abort();
}

/* Runs the C function in upvalue 2 (its name in upvalue 3) and checks the
 * promise every entry point keeps: its arguments left where they were, its
 * results pushed above them, nothing else. The function runs in this
 * closure's frame, and finds its own first upvalue (its type's metatable:
 * rw_check_udata; no function has more) as this closure's first. */
static int core_stack_wrapper(lua_State *L)
{
    lua_CFunction f = lua_tocfunction(L, lua_upvalueindex(2));
    int nargs = lua_gettop(L);
    int n = f(L);
    int top = lua_gettop(L);
    if (n < 0 || top != nargs + n) {
        (void)fprintf(stderr, "ratewise: Lua stack check failed in %s: called with %d arguments, it returned %d "
                      "results and left the stack %d high (expected %d)\n",
                      lua_tostring(L, lua_upvalueindex(3)), nargs, n, top, nargs + n);
        abort();
    }
    return n;
}

/* Wraps each C function of the table at index idx (once), noting each
 * wrapper in the table at index checked (wrapper -> name): Lua 5.1 lets no
 * Lua code read a C function's upvalues, so that is how a spec tells a
 * wrapped function from one that was missed. */
static void core_stack_wrap(lua_State *L, int idx, int checked, const char *prefix)
{
    idx = lua_absindex(L, idx);
    checked = lua_absindex(L, checked);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_CFunction f = lua_tocfunction(L, -1);
        if (f && f != core_stack_wrapper && lua_type(L, -2) == LUA_TSTRING) {
            lua_pushvalue(L, -2);
            if (!lua_getupvalue(L, -2, 1)) lua_pushnil(L); /* its first upvalue, if it has one */
            lua_pushvalue(L, -3);
            lua_pushfstring(L, "%s%s", prefix, lua_tostring(L, -3));
            lua_pushcclosure(L, core_stack_wrapper, 3);
            lua_pushvalue(L, -1);
            lua_pushfstring(L, "%s%s", prefix, lua_tostring(L, -3));
            lua_rawset(L, checked);
            lua_rawset(L, idx); /* an existing key: allowed during lua_next */
        }
        lua_pop(L, 1);
    }
}

/* Every C function of the module table at the top of the stack, and of the
 * metatables this module registered ("ratewise.*") and their __index
 * tables, is replaced by its checked wrapper. */
static void core_stack_wrap_all(lua_State *L)
{
    int checked;
    lua_newtable(L);
    checked = lua_gettop(L);
    core_stack_wrap(L, -2, checked, "ratewise.core.");
    lua_pushnil(L);
    while (lua_next(L, LUA_REGISTRYINDEX)) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TTABLE
            && strncmp(lua_tostring(L, -2), "ratewise.", 9) == 0) {
            lua_pushfstring(L, "%s:", lua_tostring(L, -2));
            core_stack_wrap(L, -2, checked, lua_tostring(L, -1));
            if (lua_getfield(L, -2, "__index") == LUA_TTABLE)
                core_stack_wrap(L, -1, checked, lua_tostring(L, -2));
            lua_pop(L, 2);
        }
        lua_pop(L, 1);
    }
    lua_setfield(L, -2, "stack_checked"); /* core.stack_checked: wrapper -> name */
}
#endif

__attribute__((visibility("default"))) int luaopen_ratewise_core(lua_State *L);

int luaopen_ratewise_core(lua_State *L)
{
    static const luaL_Reg funcs[] = {
        { "now", core_l_now },
        { "time", core_l_time },
        { "malloc_in_use", core_l_malloc_in_use },
        { "random_bytes", core_l_random_bytes },
        { "random", core_l_random },
        { "isatty", core_l_isatty },
        { "few_fields", core_l_few_fields },
        { "unyielding", core_l_unyielding },
        { NULL, NULL }
    };
    luaL_checkversion(L);
    /* Reference-counted and thread-safe since libcurl 7.84; never undone,
     * because another user of libcurl in the process may still need it. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return luaL_error(L, "ratewise.core: libcurl failed to initialise");
    lua_newtable(L);
    luaL_setfuncs(L, funcs, 0);
    rw_lparse_register(L);
    rw_bucket_register(L);
    rw_engine_register(L);
#ifdef RW_NO_REDIS
    lua_pushboolean(L, 0);
#else
    rw_redis_register(L);
    lua_pushboolean(L, 1);
#endif
    lua_setfield(L, -2, "redis"); /* whether core.redis_connect is there (`make REDIS=0`) */
    lua_pushliteral(L, POLLER_NAME);
    lua_setfield(L, -2, "poller"); /* the OS wait: "epoll" or "poll" (src/poller.h) */
    rw_term_register(L);
    rw_digest_register(L);
    rw_json_register(L);
    lua_pushliteral(L, RW_VERSION);
    lua_setfield(L, -2, "version");
    lua_pushstring(L, curl_version());
    lua_setfield(L, -2, "curl_version");
    /* JSON's null as ratewise gives it (rw.null): the light userdata NULL,
     * the same value as lua-cjson's cjson.null and OpenResty's ngx.null. */
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
#ifdef RW_STACK_CHECK
    core_stack_wrap_all(L);
#endif
    return 1;
}
