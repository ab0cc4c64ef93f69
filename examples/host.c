/*
 * A C program that embeds Lua (5.1, 5.3, 5.4 or LuaJIT), loads ratewise and
 * runs a frame loop:
 * the game engine's side of examples/game_loop.lua.
 *
 *   make examples
 *   examples/host URL [REQUESTS]
 *
 * It spawns REQUESTS tasks (default 4) that each fetch URL, then calls
 * rw.step(0) once per 60 Hz frame until no task is left, and prints one line
 * per answer and a closing line with the frame count, the slowest step and
 * the most CPU time one step used.
 * LUA_PATH and LUA_CPATH must let require find ratewise (the Makefile's
 * examples target says how when run from the repo root).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lauxlib.h"
#include "lua.h"
#include "lualib.h"

#ifndef LUA_OK
#define LUA_OK 0 /* Lua 5.1 and LuaJIT have no name for success */
#endif

static double host_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The CPU this thread has used: the work of a step, which a machine busy
 * with other processes does not stretch as it does the step's wall time. */
static double host_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void host_pause_until(double t)
{
    double left = t - host_now();
    if (left > 0) {
        struct timespec ts;
        ts.tv_sec = (time_t)left;
        ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
}

/* The game's script: spawns the tasks and returns rw.step for the frame loop. */
static const char *const host_script =
    "local url, n = ...\n"
    "local rw = require 'ratewise'\n"
    "for i = 1, n do\n"
    "  rw.spawn(function()\n"
    "    local res, err = rw.fetch(url, { on_retry = false })\n"
    "    if res then print(('request %d: %d after %d attempts'):format(i, res.status, res.attempts))\n"
    "    else print(('request %d failed: %s'):format(i, tostring(err))) end\n"
    "  end)\n"
    "end\n"
    "return rw.step\n";

int main(int argc, char **argv)
{
    lua_State *L;
    int step_ref, frames = 0, live = 1, status = 0;
    lua_Integer requests = argc > 2 ? atoi(argv[2]) : 4;
    double worst = 0, worst_cpu = 0, start, next;

    if (argc < 2) {
        fprintf(stderr, "usage: %s URL [REQUESTS]\n", argv[0]);
        return 2;
    }
    L = luaL_newstate();
    if (!L) return 1;
    luaL_openlibs(L);
    if (luaL_loadstring(L, host_script) != LUA_OK) goto fail;
    lua_pushstring(L, argv[1]);
    lua_pushinteger(L, requests);
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) goto fail;
    step_ref = luaL_ref(L, LUA_REGISTRYINDEX);

    start = next = host_now();
    while (live > 0) {
        double t0 = host_now(), cpu0 = host_cpu(), took;
        lua_rawgeti(L, LUA_REGISTRYINDEX, step_ref);
        lua_pushnumber(L, 0);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK) goto fail;
        live = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
        took = host_now() - t0;
        if (took > worst) worst = took;
        took = host_cpu() - cpu0;
        if (took > worst_cpu) worst_cpu = took;
        frames++;
        /* ... the engine would draw its frame here ... */
        next += 1.0 / 60;
        host_pause_until(next);
    }
    printf("%d frames in %.2f s, slowest rw.step(0): %.2f ms (most CPU in one: %.2f ms)\n", frames,
           host_now() - start, worst * 1000, worst_cpu * 1000);
    lua_close(L);
    return 0;

fail:
    fprintf(stderr, "host: %s\n", lua_tostring(L, -1));
    status = 1;
    lua_close(L);
    return status;
}
