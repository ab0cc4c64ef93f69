/*
 * ratewise.Redis: one non-blocking connection to a Redis server, for the
 * shared buckets (lua/ratewise/redis.lua, redis_bucket.lua).
 *
 * The core never waits: it connects without blocking (but for the name
 * lookup, see redis_l_connect), queues commands, writes what the socket
 * takes, and reads what has arrived. The Lua layer waits for the descriptor
 * through the engine (engine:watch), so that a task waiting on Redis waits
 * with the transfers, through the same seam. Commands are formatted and
 * replies parsed by hiredis (Debian's libhiredis), not by hand: RESP is its
 * job, and its reader is the one every Redis client in C trusts.
 */
/* Built without hiredis (`make REDIS=0`): nothing here, and core.redis_connect
 * is absent. */
#ifndef RW_NO_REDIS
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "compat.h"
#include "ratewise.h"
#include "redis_reader.h"

#define REDIS_MT "ratewise.Redis"

/* What one read takes from the socket at most. */
#define REDIS_READ_CHUNK 16384
/* Arguments of one command at most (EVALSHA with a few keys and values). */
#define REDIS_MAX_ARGS 64

enum redis_state { REDIS_CONNECTING, REDIS_OPEN, REDIS_CLOSED };

typedef struct redis_conn {
    int fd;
    enum redis_state state;
    rw_redis_reader reader; /* hiredis's reader, bounded (redis_reader.c) */
    size_t buffered;        /* bytes fed to the reader since its last complete reply */
    char *out;          /* formatted commands not yet written */
    size_t outlen, outpos, outcap;
    redisReply *pending; /* a reply being turned into Lua values (freed by close if that raises) */
} redis_conn;

static redis_conn *redis_check(lua_State *L)
{
    redis_conn *c = (redis_conn *)luaL_checkudata(L, 1, REDIS_MT);
    if (c->state == REDIS_CLOSED) luaL_argerror(L, 1, "connection is closed");
    return c;
}

/* Idempotent: __gc, __close and conn:close() come here. The Lua layer
 * unwatches the descriptor before it closes the connection. */
static int redis_l_close(lua_State *L)
{
    redis_conn *c = (redis_conn *)luaL_checkudata(L, 1, REDIS_MT);
    if (c->pending) {
        freeReplyObject(c->pending);
        c->pending = NULL;
    }
    rw_redis_reader_free(&c->reader);
    free(c->out);
    c->out = NULL;
    c->outlen = c->outpos = c->outcap = 0;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->state = REDIS_CLOSED;
    return 0;
}

/* core.redis_connect(host, port) -> conn | nil, err. The connection is
 * under way when this returns (conn:connected() says when it is made). The
 * name lookup (getaddrinfo) blocks: with a name that is not in /etc/hosts
 * it waits for the resolver, once per connection. */
static int redis_l_connect(lua_State *L)
{
    const char *host = luaL_checkstring(L, 1);
    lua_Integer port = luaL_checkinteger(L, 2);
    char service[16];
    struct addrinfo hints, *found = NULL, *ai;
    redis_conn *c;
    int rc, fd = -1, err = 0;
    luaL_argcheck(L, port > 0 && port < 65536, 2, "port must be from 1 to 65535");
    /* The userdata first, closed: whatever fails below, nothing leaks. */
    c = (redis_conn *)lua_newuserdatauv(L, sizeof *c, 0);
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->state = REDIS_CLOSED;
    luaL_setmetatable(L, REDIS_MT);
    if (rw_redis_reader_init(&c->reader) != 0) return luaL_error(L, "out of memory for a Redis reader");
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    (void)snprintf(service, sizeof service, "%d", (int)port);
    rc = getaddrinfo(host, service, &hints, &found);
    if (rc != 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot resolve %s: %s", host, gai_strerror(rc));
        return 2;
    }
    for (ai = found; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(found);
    if (fd < 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "cannot connect to %s:%d: %s", host, (int)port, strerror(err));
        return 2;
    }
    {
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    c->fd = fd;
    c->state = REDIS_CONNECTING;
    return 1;
}

/* conn:fd() -> the socket's descriptor (to wait on). */
static int redis_l_fd(lua_State *L)
{
    lua_pushinteger(L, redis_check(L)->fd);
    return 1;
}

/* conn:connected() -> true once the connection is made, false while it is
 * under way, nil and an error when it failed. */
static int redis_l_connected(lua_State *L)
{
    redis_conn *c = redis_check(L);
    struct pollfd p;
    int err = 0;
    socklen_t len = sizeof err;
    if (c->state == REDIS_OPEN) {
        lua_pushboolean(L, 1);
        return 1;
    }
    p.fd = c->fd;
    p.events = POLLOUT;
    p.revents = 0;
    if (poll(&p, 1, 0) == 0) {
        lua_pushboolean(L, 0);
        return 1;
    }
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
        lua_pushnil(L);
        lua_pushstring(L, strerror(err));
        return 2;
    }
    c->state = REDIS_OPEN;
    lua_pushboolean(L, 1);
    return 1;
}

/* conn:send(arg, ...): queues one command (strings or numbers); flush
 * writes it. */
static int redis_l_send(lua_State *L)
{
    redis_conn *c = redis_check(L);
    int argc = lua_gettop(L) - 1, i, len;
    const char *argv[REDIS_MAX_ARGS];
    size_t argvlen[REDIS_MAX_ARGS];
    char *cmd = NULL;
    luaL_argcheck(L, argc >= 1, 2, "a command is needed");
    luaL_argcheck(L, argc <= REDIS_MAX_ARGS, REDIS_MAX_ARGS + 2, "too many arguments");
    for (i = 0; i < argc; i++) {
        int t = lua_type(L, i + 2);
        if (t != LUA_TSTRING && t != LUA_TNUMBER) luaL_argerror(L, i + 2, "a string or a number expected");
        argv[i] = lua_tolstring(L, i + 2, &argvlen[i]);
    }
    len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
    if (len < 0 || !cmd) return luaL_error(L, "out of memory");
    if (c->outpos > 0 && c->outpos == c->outlen) c->outpos = c->outlen = 0;
    if (c->outlen + (size_t)len > c->outcap) {
        size_t cap = c->outcap ? c->outcap : 256;
        char *grown;
        while (cap < c->outlen + (size_t)len) cap *= 2;
        grown = (char *)realloc(c->out, cap);
        if (!grown) {
            redisFreeCommand(cmd);
            return luaL_error(L, "out of memory");
        }
        c->out = grown;
        c->outcap = cap;
    }
    memcpy(c->out + c->outlen, cmd, (size_t)len);
    c->outlen += (size_t)len;
    redisFreeCommand(cmd);
    return 0;
}

/* After a send or recv that failed (errno): false when the socket would
 * block (wait for it), nil and the error otherwise. Returns the count. */
static int redis_push_io_error(lua_State *L)
{
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        lua_pushboolean(L, 0);
        return 1;
    }
    lua_pushnil(L);
    lua_pushstring(L, strerror(errno));
    return 2;
}

/* conn:flush() -> true when every queued command is written, false when
 * the socket takes no more for now (wait until it is writable), nil and an
 * error when the connection failed. */
static int redis_l_flush(lua_State *L)
{
    redis_conn *c = redis_check(L);
    while (c->outpos < c->outlen) {
        ssize_t n = send(c->fd, c->out + c->outpos, c->outlen - c->outpos, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return redis_push_io_error(L);
        }
        c->outpos += (size_t)n;
    }
    c->outpos = c->outlen = 0;
    lua_pushboolean(L, 1);
    return 1;
}

/* Pushes a reply as Lua values: a string (bulk or status), an integer, a
 * table for an array (a nil element as false), {err = message} for an
 * error, nil for a nil reply. hiredis bounds the nesting (7 levels). */
static void redis_push_reply(lua_State *L, const redisReply *r)
{
    size_t i;
    luaL_checkstack(L, 3, "Redis reply too deeply nested");
    switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
        lua_pushlstring(L, r->str, (size_t)r->len);
        break;
    case REDIS_REPLY_INTEGER:
        lua_pushinteger(L, (lua_Integer)r->integer);
        break;
    case REDIS_REPLY_ERROR:
        lua_createtable(L, 0, 1);
        lua_pushlstring(L, r->str, (size_t)r->len);
        lua_setfield(L, -2, "err");
        break;
    case REDIS_REPLY_ARRAY:
        lua_createtable(L, r->elements > INT_MAX ? INT_MAX : (int)r->elements, 0);
        for (i = 0; i < r->elements && i < INT_MAX; i++) {
            if (r->element[i]->type == REDIS_REPLY_NIL) lua_pushboolean(L, 0);
            else redis_push_reply(L, r->element[i]);
            lua_rawseti(L, -2, (int)i + 1);
        }
        break;
    default: /* REDIS_REPLY_NIL, and types of RESP3 hiredis 0.14 does not make */
        lua_pushnil(L);
        break;
    }
}

/* Takes one complete reply from the reader: 1 (pushed true, value), 0
 * (none complete yet) or -1 (protocol error, pushed nil, err). */
static int redis_take_reply(lua_State *L, redis_conn *c)
{
    void *reply = NULL;
    if (redisReaderGetReply(c->reader.reader, &reply) != REDIS_OK) {
        lua_pushnil(L);
        lua_pushfstring(L, "protocol error: %s", c->reader.reader->errstr);
        return -1;
    }
    if (!reply) return 0;
    c->buffered = 0;
    c->pending = (redisReply *)reply;
    lua_pushboolean(L, 1);
    redis_push_reply(L, c->pending);
    freeReplyObject(c->pending);
    c->pending = NULL;
    return 1;
}

/* conn:read() -> true, value when a reply is complete; false when more
 * must arrive first (wait until the socket is readable); nil and an error
 * when the server closed the connection, the socket failed, or what came
 * is not RESP. */
static int redis_l_read(lua_State *L)
{
    redis_conn *c = redis_check(L);
    char buf[REDIS_READ_CHUNK];
    int got = redis_take_reply(L, c);
    if (got != 0) return 2;
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            c->buffered += (size_t)n;
            if (c->buffered > RW_REDIS_MAX_REPLY_BYTES) {
                lua_pushnil(L);
                lua_pushfstring(L, "protocol error: a reply of more than %d bytes", RW_REDIS_MAX_REPLY_BYTES);
                return 2;
            }
            if (redisReaderFeed(c->reader.reader, buf, (size_t)n) != REDIS_OK) {
                lua_pushnil(L);
                lua_pushfstring(L, "protocol error: %s", c->reader.reader->errstr);
                return 2;
            }
            got = redis_take_reply(L, c);
            if (got != 0) return 2;
            continue;
        }
        if (n == 0) {
            lua_pushnil(L);
            lua_pushliteral(L, "the server closed the connection");
            return 2;
        }
        if (errno == EINTR) continue;
        return redis_push_io_error(L);
    }
}

static int redis_l_tostring(lua_State *L)
{
    redis_conn *c = (redis_conn *)luaL_checkudata(L, 1, REDIS_MT);
    lua_pushfstring(L, "ratewise.Redis (%s)", c->state == REDIS_CLOSED ? "closed"
                    : c->state == REDIS_OPEN ? "open" : "connecting");
    return 1;
}

void rw_redis_register(lua_State *L)
{
    static const luaL_Reg methods[] = {
        { "fd", redis_l_fd },
        { "connected", redis_l_connected },
        { "send", redis_l_send },
        { "flush", redis_l_flush },
        { "read", redis_l_read },
        { "close", redis_l_close },
        { NULL, NULL }
    };
    static const luaL_Reg metamethods[] = {
        { "__gc", redis_l_close },
        { "__close", redis_l_close },
        { "__tostring", redis_l_tostring },
        { NULL, NULL }
    };
    luaL_newmetatable(L, REDIS_MT);
    luaL_setfuncs(L, metamethods, 0);
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    lua_pushcfunction(L, redis_l_connect);
    lua_setfield(L, -2, "redis_connect");
}

#endif /* RW_NO_REDIS */
