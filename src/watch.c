/*
 * The descriptors in the engine's poller's set: the sockets libcurl says
 * it waits on (its socket interface, CURLMOPT_SOCKETFUNCTION, and its
 * close-socket callback), and those the Lua layer watches through
 * engine:watch (a Redis connection), reported by poll when ready.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

/* table (*n entries of `size` bytes, by descriptor) grown to reach
 * descriptor s, the new entries zero: the table to use from now on, or NULL
 * when out of memory (the old one is then as it was). */
void *rw_watch_fd_table(void *table, size_t *n, size_t size, curl_socket_t s)
{
    size_t want = *n ? *n : 64;
    char *grown;
    if ((size_t)s < *n) return table;
    while (want <= (size_t)s) want *= 2;
    grown = (char *)realloc(table, want * size);
    if (!grown) return NULL;
    memset(grown + *n * size, 0, (want - *n) * size);
    *n = want;
    return grown;
}

static unsigned char *watch_slot(engine *e, curl_socket_t s)
{
    unsigned char *watch;
    if (s < 0 || !(watch = (unsigned char *)rw_watch_fd_table(e->watch, &e->nwatch, 1, s))) return NULL;
    e->watch = watch;
    return &e->watch[s];
}

/* Sets a descriptor's WATCH_* bits, counting those libcurl waits on. */
static void watch_put(engine *e, unsigned char *slot, unsigned char bits)
{
    e->nwanted += ((bits & WATCH_WANTED) != 0) - ((*slot & WATCH_WANTED) != 0);
    *slot = bits;
}

/* libcurl says which sockets it waits on, and for what: the engine keeps
 * them in its poller's set. C only. */
int rw_watch_on_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    engine *e = (engine *)userp;
    unsigned char *slot = watch_slot(e, s), want;
    (void)easy;
    (void)socketp;
    if (!slot) return -1; /* out of memory: libcurl gives the multi handle up (engine_drive) */
    if (what == CURL_POLL_REMOVE) {
        watch_put(e, slot, (unsigned char)(*slot & ~WATCH_WANTED));
        return 0;
    }
    want = (unsigned char)(((what & CURL_POLL_IN) ? WATCH_IN : 0u) | ((what & CURL_POLL_OUT) ? WATCH_OUT : 0u));
    if ((*slot & WATCH_IN_SET) && (*slot & (WATCH_IN | WATCH_OUT)) == want) {
        watch_put(e, slot, (unsigned char)(*slot | WATCH_WANTED));
        return 0;
    }
    if (poller_set(&e->poller, s, ((want & WATCH_IN) ? POLLER_IN : 0u) | ((want & WATCH_OUT) ? POLLER_OUT : 0u),
                   (*slot & WATCH_IN_SET) != 0)
        != 0)
        return -1; /* out of memory: libcurl gives the multi handle up (engine_drive) */
    watch_put(e, slot, (unsigned char)(want | WATCH_IN_SET | WATCH_WANTED));
    return 0;
}

/* libcurl closes a socket: it leaves the poller's set with it. The last of an
 * origin's connections closed, the engine forgets what it knew of it: a
 * server that closed its idle connection (an HTTP/2 server's idle timeout,
 * minutes at most) would otherwise see the next burst open a connection
 * for each request, as libcurl forgets too that the origin multiplexes; and
 * another server may answer on that port next. C only. */
int rw_watch_on_close(void *userp, curl_socket_t s)
{
    engine *e = (engine *)userp;
    if (s < 0) return 0;
    if ((size_t)s < e->nwatch) watch_put(e, &e->watch[s], 0);
    poller_closing(&e->poller, s);
    rw_gate_socket_gone(e, s);
    return close(s);
}

/* A watched descriptor is ready: it is reported by the next poll. Its slot
 * in `fired` was made when it was armed, so this cannot fail. */
static void watch_fire(engine *e, int fd)
{
    if (!(e->watch[fd] & WATCH_ARMED)) return;
    e->watch[fd] &= (unsigned char)~WATCH_ARMED;
    e->nwatching--;
    e->fired[e->nfired++] = fd;
}

/* The poller reports fd ready: answers 1 when that is the watch's own
 * business, not libcurl's. A descriptor of engine:watch is reported by the
 * next poll; a connection libcurl no longer watches (see WATCH_IN) leaves
 * the set. */
int rw_watch_event(engine *e, int fd)
{
    if (fd < 0 || (size_t)fd >= e->nwatch) return 0;
    if (e->watch[fd] & WATCH_FOREIGN) {
        watch_fire(e, fd);
        return 1;
    }
    if (!(e->watch[fd] & WATCH_WANTED)) {
        poller_del(&e->poller, fd);
        e->watch[fd] = 0;
        return 1;
    }
    return 0;
}

/* engine:watch(fd, "r" | "w"): the next poll that finds fd ready to read
 * (or write) reports it, once, as the number fd among the finished
 * transfers; waits on the engine (its pollfd, a blocking poll) wake for it.
 * For descriptors the Lua layer reads itself (a Redis connection), so that
 * they are waited on with the transfers, through the same seam. */
int rw_watch_l_watch(lua_State *L)
{
    engine *e = rw_engine_check(L);
    lua_Integer fd = luaL_checkinteger(L, 2);
    const char *mode = luaL_checkstring(L, 3);
    unsigned char *slot;
    luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 2, "not a descriptor");
    luaL_argcheck(L, (mode[0] == 'r' || mode[0] == 'w') && mode[1] == '\0', 3, "mode must be \"r\" or \"w\"");
    slot = watch_slot(e, (curl_socket_t)fd);
    if (!slot) return luaL_error(L, "out of memory");
    luaL_argcheck(L, !(*slot & (WATCH_IN_SET | WATCH_WANTED)) || (*slot & WATCH_FOREIGN), 2,
                  "a descriptor of a transfer");
    if (*slot & WATCH_ARMED) {
        e->nwatching--; /* re-armed below, for the new mode */
        *slot &= (unsigned char)~WATCH_ARMED;
    }
    if (e->nfired + e->nwatching + 1 > e->capfired) {
        int cap = e->capfired ? e->capfired * 2 : 8;
        int *grown = (int *)realloc(e->fired, (size_t)cap * sizeof *grown);
        if (!grown) return luaL_error(L, "out of memory");
        e->fired = grown;
        e->capfired = cap;
    }
    if (poller_set(&e->poller, (int)fd, (mode[0] == 'r' ? POLLER_IN : POLLER_OUT) | POLLER_ONESHOT,
                   (*slot & WATCH_FOREIGN) != 0)
        != 0) {
        int err = errno;
        lua_pushnil(L);
        lua_pushfstring(L, "cannot watch descriptor %d: %s", (int)fd, strerror(err));
        return 2;
    }
    *slot = (unsigned char)(WATCH_FOREIGN | WATCH_ARMED);
    e->nwatching++;
    lua_pushboolean(L, 1);
    return 1;
}

/* engine:unwatch(fd): fd is watched no more (call it before closing fd). A
 * readiness not yet reported is forgotten. */
int rw_watch_l_unwatch(lua_State *L)
{
    engine *e = rw_engine_check(L);
    lua_Integer fd = luaL_checkinteger(L, 2);
    int i;
    if (fd < 0 || (size_t)fd >= e->nwatch || !(e->watch[fd] & WATCH_FOREIGN)) return 0;
    if (e->watch[fd] & WATCH_ARMED) e->nwatching--;
    e->watch[fd] = 0;
    poller_del(&e->poller, (int)fd);
    for (i = 0; i < e->nfired; i++) {
        if (e->fired[i] == (int)fd) e->fired[i--] = e->fired[--e->nfired];
    }
    return 0;
}
