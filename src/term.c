/*
 * What the command-line tool (lua/ratewise/cli*.lua) needs of the operating
 * system and no Lua can ask for: the terminal's width, a stop signal
 * (SIGINT, SIGTERM, SIGHUP) turned into a flag that the batch polls,
 * SIGPIPE ignored (so that a closed pipe is a write error, as it is to
 * curl), and one read of a descriptor that the scheduler saw readable.
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
 * something else), and SIGTERM and SIGHUP end the process where it stands
 * (a request the server received then gets no result line); a flag lets
 * the batch decide where it stops. It holds the number of the first stop
 * signal that came, 0 while none has. */
static volatile sig_atomic_t term_interrupted = 0;

static void term_on_stop_signal(int sig)
{
    if (term_interrupted == 0) {
        term_interrupted = sig;
    }
}

/* The signals that ask a command to stop: Ctrl-C, kill(1)'s default and a
 * closed terminal. */
static const int term_stop_signals[] = { SIGINT, SIGTERM, SIGHUP };
#define TERM_STOP_SIGNALS (sizeof term_stop_signals / sizeof term_stop_signals[0])

#define TERM_SAVED "ratewise.term_saved_signals"

/* core.trap_stop_signals() -> saved: from now on SIGINT, SIGTERM and SIGHUP
 * set the flag that core.interrupted() reads, however many come (timeout(1)
 * relays one to the process and again to its group: a second one must not
 * kill). saved holds the actions that were in place, for
 * core.release_stop_signals. */
static int term_l_trap_stop_signals(lua_State *L)
{
    struct sigaction action;
    size_t i;
    struct sigaction *saved = (struct sigaction *)lua_newuserdata(L, TERM_STOP_SIGNALS * sizeof *saved);
    memset(&action, 0, sizeof action);
    action.sa_handler = term_on_stop_signal;
    action.sa_flags = 0;
    (void)sigemptyset(&action.sa_mask);
    term_interrupted = 0;
    for (i = 0; i < TERM_STOP_SIGNALS; i++) {
        if (sigaction(term_stop_signals[i], &action, &saved[i]) != 0) {
            int err = errno;
            while (i-- > 0) {
                (void)sigaction(term_stop_signals[i], &saved[i], NULL);
            }
            lua_pop(L, 1);
            lua_pushnil(L);
            lua_pushstring(L, strerror(err));
            return 2;
        }
    }
    luaL_setmetatable(L, TERM_SAVED);
    return 1;
}

/* core.release_stop_signals(saved): the stop signals do what they did
 * before the trap. */
static int term_l_release_stop_signals(lua_State *L)
{
    const struct sigaction *saved = (const struct sigaction *)luaL_checkudata(L, 1, TERM_SAVED);
    size_t i;
    for (i = 0; i < TERM_STOP_SIGNALS; i++) {
        (void)sigaction(term_stop_signals[i], &saved[i], NULL);
    }
    return 0;
}

/* core.interrupted() -> false, or the number of the first stop signal that
 * came since core.trap_stop_signals() (a command exits 128 + it, as a
 * shell reports a command that signal ended). */
static int term_l_interrupted(lua_State *L)
{
    int sig = (int)term_interrupted;
    if (sig == 0) {
        lua_pushboolean(L, 0);
    } else {
        lua_pushinteger(L, (lua_Integer)sig);
    }
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
        { "trap_stop_signals", term_l_trap_stop_signals },
        { "release_stop_signals", term_l_release_stop_signals },
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
