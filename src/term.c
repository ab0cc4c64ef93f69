/*
 * What the command-line tool (lua/ratewise/cli*.lua) needs of the operating
 * system and no Lua can ask for: the terminal's width, an interrupt (SIGINT)
 * turned into a flag that the batch polls, SIGPIPE ignored (so that a closed
 * pipe is a write error, as it is to curl), and one read of a descriptor
 * that the scheduler saw readable.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "compat.h"
#include "ratewise.h"

/* The core's only global mutable state, and unavoidable: a signal handler
 * reaches nothing but a static sig_atomic_t. The stand-alone interpreters
 * turn SIGINT into an "interrupted!" error raised from a hook at whatever
 * Lua code runs next (inside a fetch, a scheduler turn or a pcall meant for
 * something else); a flag lets the batch decide where it stops. */
static volatile sig_atomic_t term_interrupted = 0;

static void term_on_sigint(int sig)
{
    (void)sig;
    term_interrupted = 1;
}

#define TERM_SAVED "ratewise.term_saved_sigint"

/* core.trap_sigint() -> saved: from now on SIGINT sets the flag that
 * core.interrupted() reads, however many come (timeout(1) relays one to
 * the process and again to its group: a second one must not kill). saved
 * holds the action that was in place, for core.release_sigint. */
static int term_l_trap_sigint(lua_State *L)
{
    struct sigaction action;
    struct sigaction *saved = (struct sigaction *)lua_newuserdata(L, sizeof *saved);
    memset(&action, 0, sizeof action);
    action.sa_handler = term_on_sigint;
    action.sa_flags = 0;
    (void)sigemptyset(&action.sa_mask);
    term_interrupted = 0;
    if (sigaction(SIGINT, &action, saved) != 0) {
        lua_pop(L, 1);
        lua_pushnil(L);
        lua_pushstring(L, strerror(errno));
        return 2;
    }
    luaL_setmetatable(L, TERM_SAVED);
    return 1;
}

/* core.release_sigint(saved): SIGINT does what it did before the trap. */
static int term_l_release_sigint(lua_State *L)
{
    const struct sigaction *saved = (const struct sigaction *)luaL_checkudata(L, 1, TERM_SAVED);
    (void)sigaction(SIGINT, saved, NULL);
    return 0;
}

/* core.interrupted() -> whether SIGINT came since core.trap_sigint(). */
static int term_l_interrupted(lua_State *L)
{
    lua_pushboolean(L, term_interrupted != 0);
    return 1;
}

/* core.ignore_sigpipe(): a write to a closed pipe fails with EPIPE instead
 * of ending the process silently. */
static int term_l_ignore_sigpipe(lua_State *L)
{
    (void)L;
    (void)signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* core.terminal_width(fd) -> the columns of the terminal at fd, or nil when
 * fd is not a terminal or the terminal does not say (a pty of size 0). */
static int term_l_terminal_width(lua_State *L)
{
    struct winsize ws;
    lua_Integer fd = luaL_checkinteger(L, 1);
    luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 1, "descriptor must be a non-negative integer");
    memset(&ws, 0, sizeof ws);
    if (ioctl((int)fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) {
        lua_pushnil(L);
        return 1;
    }
    lua_pushinteger(L, (lua_Integer)ws.ws_col);
    return 1;
}

/* core.read_fd(fd, max) -> bytes ("" at the end of the input) | nil, err:
 * one read(2) of at most max bytes (and of TERM_READ_MAX), for a descriptor
 * that poll found readable (it would block otherwise), so that what arrives
 * is handed on without waiting for more. An interrupted read answers nil,
 * "interrupted". */
#define TERM_READ_MAX 16384
static int term_l_read_fd(lua_State *L)
{
    char buf[TERM_READ_MAX];
    ssize_t n;
    lua_Integer fd = luaL_checkinteger(L, 1);
    lua_Integer max = luaL_checkinteger(L, 2);
    luaL_argcheck(L, fd >= 0 && fd <= INT_MAX, 1, "descriptor must be a non-negative integer");
    luaL_argcheck(L, max > 0, 2, "must be positive");
    n = read((int)fd, buf, max < TERM_READ_MAX ? (size_t)max : sizeof buf);
    if (n < 0) {
        int err = errno;
        lua_pushnil(L);
        lua_pushstring(L, err == EINTR ? "interrupted" : strerror(err));
        return 2;
    }
    lua_pushlstring(L, buf, (size_t)n);
    return 1;
}

void rw_term_register(lua_State *L)
{
    static const luaL_Reg funcs[] = {
        { "trap_sigint", term_l_trap_sigint },
        { "release_sigint", term_l_release_sigint },
        { "interrupted", term_l_interrupted },
        { "ignore_sigpipe", term_l_ignore_sigpipe },
        { "terminal_width", term_l_terminal_width },
        { "read_fd", term_l_read_fd },
        { NULL, NULL }
    };
    luaL_newmetatable(L, TERM_SAVED);
    lua_pop(L, 1);
    luaL_setfuncs(L, funcs, 0);
}
