/*
 * The engine's wake-up line (engine:wake_path, wake_accept, wake_arm,
 * wake_kick): a host whose loop cannot wait on the engine's descriptor
 * (nginx's Lua, which waits only on its own cosockets) connects a socket
 * it can wait on to a unix socket the engine listens on, and the engine
 * writes a byte on that connection once its descriptor is readable.
 *
 * Someone must be waiting on the descriptor for that byte to be written
 * while the host's thread sits in its own loop: a helper thread of the
 * engine's does, and nothing else. It waits (epoll) on the engine's epoll
 * descriptor, armed once at a time (EPOLLONESHOT, re-armed by
 * engine:wake_arm before the host waits), on a timer (timerfd), and on a
 * descriptor that tells it to end; it writes one byte when either of the
 * first two fires. The timer, not the host's socket, bounds the wait:
 * nginx writes an error line for every cosocket read that times out. It
 * is set only when a wait needs it sooner than it is set for (or it has
 * gone off): a wait that a kick or an answer ended leaves it set, and the
 * next wait, whose deadline is as far off or further (a transfer's
 * time-out, counted anew), takes it as it is, where setting it and
 * re-arming it in the helper's set were two system calls a wait. Every
 * arming that fires makes a byte, and every byte makes the host look and
 * arm again, so none is lost (a stale one, a timer set for an earlier
 * wait, only wakes the host once for nothing). The
 * helper touches no Lua, no libcurl and no engine state: only descriptors
 * that stay open until it has been joined (engine:close). The host's
 * thread still does all the work (engine:poll) after the byte wakes it.
 *
 * The socket lives in a directory of its own (mkdtemp, mode 0700); a
 * connection from another process is refused (SO_PEERCRED). The
 * connection the helper writes on is always the same descriptor number:
 * a newer connection (the host's earlier one closed, or owned by a part
 * of the host that ended) takes that number's place (dup2), which is
 * atomic for a write in the helper.
 */
#define _GNU_SOURCE /* NOLINT(bugprone-reserved-identifier,cert-dcl37-c,cert-dcl51-cpp) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

#ifdef RW_POLLER_EPOLL
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>

struct engine_wake {
    pid_t pid;       /* the process that made it: a forked child has no helper */
    int listen_fd;   /* the unix socket connections come to */
    int line;        /* the connection the helper writes on (-1: none yet) */
    int helper_ep;   /* the helper's epoll: the engine's descriptor and `stop` */
    int engine_fd;   /* the engine's epoll descriptor, in helper_ep */
    int timer;       /* timerfd, in helper_ep: a wait's deadline */
    double timer_at; /* when it goes off (rw_core_monotonic's clock); 0: not set */
    int stop;        /* eventfd: readable when the helper must end */
    int started;     /* the helper runs */
    pthread_t helper;
    char dir[64];
    char path[80];
};

static void wake_close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* The helper: a byte on the line each time the armed descriptor is
 * readable, until `stop` is. */
static void *wake_helper(void *arg)
{
    const struct engine_wake *w = (const struct engine_wake *)arg;
    for (;;) {
        struct epoll_event ev[2];
        int n = epoll_wait(w->helper_ep, ev, 2, -1), i;
        if (n < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        for (i = 0; i < n; i++) {
            if (ev[i].data.fd == w->stop) return NULL;
            if (ev[i].data.fd == w->timer) {
                unsigned long long expired;
                /* (nothing to read when re-armed meanwhile: a stale byte) */
                if (read(w->timer, &expired, sizeof expired) < 0) expired = 0;
            }
            /* A full buffer already holds a wake-up; a closed line has no
             * reader: either way nothing more to do. */
            (void)send(w->line, "w", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
    }
}

/* Opens the helper's descriptors and starts it: 0 or an errno. It takes no
 * signal: they are the host's thread's (nginx's handlers set flags its loop
 * reads as epoll_wait returns EINTR). */
static int wake_open_helper(struct engine_wake *w)
{
    struct epoll_event ev;
    sigset_t all, old;
    int rc;
    w->helper_ep = epoll_create1(EPOLL_CLOEXEC);
    if (w->helper_ep < 0) return errno;
    w->stop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->stop < 0) return errno;
    w->timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (w->timer < 0) return errno;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN;
    ev.data.fd = w->stop;
    if (epoll_ctl(w->helper_ep, EPOLL_CTL_ADD, w->stop, &ev) != 0) return errno;
    /* (the timer is read as it goes off: readable only once set anew) */
    ev.data.fd = w->timer;
    if (epoll_ctl(w->helper_ep, EPOLL_CTL_ADD, w->timer, &ev) != 0) return errno;
    ev.events = EPOLLONESHOT; /* disarmed until engine:wake_arm */
    ev.data.fd = w->engine_fd;
    if (epoll_ctl(w->helper_ep, EPOLL_CTL_ADD, w->engine_fd, &ev) != 0) return errno;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&w->helper, NULL, wake_helper, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) return rc;
    w->started = 1;
    return 0;
}

/* The helper started, or an errno, with what it opened closed again (a
 * later wake_accept tries anew). */
static int wake_start(struct engine_wake *w)
{
    int err = wake_open_helper(w);
    if (err) {
        wake_close_fd(&w->helper_ep);
        wake_close_fd(&w->timer);
        wake_close_fd(&w->stop);
    }
    return err;
}

void rw_wake_close(engine *e)
{
    struct engine_wake *w = e->wake;
    if (!w) return;
    e->wake = NULL;
    if (w->pid == getpid()) {
        if (w->started) {
            unsigned long long one = 1;
            /* the helper ends at once: it only ever waits in epoll_wait */
            if (write(w->stop, &one, sizeof one) == (ssize_t)sizeof one) pthread_join(w->helper, NULL);
        }
        (void)unlink(w->path);
        (void)rmdir(w->dir);
    }
    wake_close_fd(&w->listen_fd);
    wake_close_fd(&w->line);
    wake_close_fd(&w->helper_ep);
    wake_close_fd(&w->timer);
    wake_close_fd(&w->stop);
    free(w);
}

/* The engine's wake-up record, made in this process; NULL with *why set. */
static struct engine_wake *wake_get(engine *e, const char **why)
{
    struct engine_wake *w = e->wake;
    if (w && w->pid != getpid()) {
        *why = "the engine's wake-up line was made in another process (before a fork)";
        return NULL;
    }
    if (!w) *why = "the engine's wake-up line is not open (engine:wake_path)";
    return w;
}

/* engine:wake_path() -> path | nil, err: where a host connects its line (a
 * unix stream socket). The engine listens there until it is closed. */
static int wake_l_path(lua_State *L)
{
    engine *e = rw_engine_check(L);
    struct engine_wake *w = e->wake;
    const char *tmp = getenv("TMPDIR");
    struct sockaddr_un addr;
    int err;
    if (w) {
        const char *why;
        if (!wake_get(e, &why)) {
            lua_pushnil(L);
            lua_pushstring(L, why);
            return 2;
        }
        lua_pushstring(L, w->path);
        return 1;
    }
    w = (struct engine_wake *)calloc(1, sizeof *w);
    if (!w) {
        lua_pushnil(L);
        lua_pushliteral(L, "cannot open the engine's wake-up line: out of memory");
        return 2;
    }
    w->pid = getpid();
    w->listen_fd = w->line = w->helper_ep = w->timer = w->stop = -1;
    w->engine_fd = poller_fd(&e->poller);
    if (!tmp || !*tmp || strlen(tmp) > 24) tmp = "/tmp";
    (void)snprintf(w->dir, sizeof w->dir, "%s/ratewise-wake.XXXXXX", tmp); /* fits: tmp is short */
    if (!mkdtemp(w->dir)) {
        err = errno;
        free(w);
        lua_pushnil(L);
        lua_pushfstring(L, "cannot make the engine's wake-up directory: %s", strerror(err));
        return 2;
    }
    (void)snprintf(w->path, sizeof w->path, "%s/line", w->dir);
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, w->path, strlen(w->path) + 1);
    w->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    e->wake = w; /* from here on rw_wake_close undoes it all */
    if (w->listen_fd < 0 || bind(w->listen_fd, (struct sockaddr *)&addr, sizeof addr) != 0
        || listen(w->listen_fd, 8) != 0) {
        err = errno;
        rw_wake_close(e);
        lua_pushnil(L);
        lua_pushfstring(L, "cannot open the engine's wake-up line: %s", strerror(err));
        return 2;
    }
    lua_pushstring(L, w->path);
    return 1;
}

/* engine:wake_accept() -> true | nil, err: the newest connection to the
 * path becomes the line (an older one is closed, which its reader sees);
 * one from another process is refused. Call it once a host's socket has
 * connected anew. The first starts the helper. */
static int wake_l_accept(lua_State *L)
{
    engine *e = rw_engine_check(L);
    const char *why;
    struct engine_wake *w = wake_get(e, &why);
    int fd, took = 0, err = 0;
    if (!w) {
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    while ((fd = accept4(w->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid != w->pid) {
            close(fd);
            continue;
        }
        if (w->line < 0) {
            w->line = fd;
        } else {
            (void)dup2(fd, w->line);
            close(fd);
        }
        took = 1;
    }
    if (!took) err = errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
    if (took && !w->started) err = wake_start(w);
    if (!took || err) {
        lua_pushnil(L);
        if (err) lua_pushfstring(L, "the engine's wake-up line failed: %s", strerror(err));
        else lua_pushliteral(L, "no connection of this process waits on the engine's wake-up line");
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

/* The timer goes off once the seconds have passed, or sooner: set anew
 * only when it is not set for sooner and still to come. On
 * rw_core_monotonic's clock, which is CLOCK_MONOTONIC. */
static void wake_set_timer(struct engine_wake *w, double seconds)
{
    struct itimerspec when;
    double now = rw_core_monotonic(), at;
    if (seconds > RW_MAX_SECONDS / 1e9) seconds = RW_MAX_SECONDS / 1e9; /* (far enough) */
    at = now + (seconds > 0 ? seconds : 1e-9); /* (all zero would disarm it) */
    if (w->timer_at > now && w->timer_at <= at) return;
    memset(&when, 0, sizeof when);
    when.it_value.tv_sec = (time_t)at;
    when.it_value.tv_nsec = (long)((at - (double)when.it_value.tv_sec) * 1e9);
    if (when.it_value.tv_nsec > 999999999L) when.it_value.tv_nsec = 999999999L;
    if (timerfd_settime(w->timer, TFD_TIMER_ABSTIME, &when, NULL) == 0) w->timer_at = at;
}

/* engine:wake_arm([seconds]): the next time the engine's descriptor is
 * readable (now, if it is), or once the seconds have passed, one byte goes
 * down the line. Call it before each wait on the line. A timer an earlier
 * arming set that goes off sooner is kept: its byte comes early, once. */
static int wake_l_arm(lua_State *L)
{
    engine *e = rw_engine_check(L);
    struct engine_wake *w = e->wake;
    lua_Number seconds = luaL_optnumber(L, 2, -1);
    struct epoll_event ev;
    luaL_argcheck(L, lua_isnoneornil(L, 2) || seconds >= 0, 2, "seconds must be a non-negative number");
    if (!w || !w->started || w->pid != getpid()) return 0;
    if (seconds >= 0) wake_set_timer(w, seconds);
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.fd = w->engine_fd;
    (void)epoll_ctl(w->helper_ep, EPOLL_CTL_MOD, w->engine_fd, &ev);
    return 0;
}

/* engine:wake_kick(): a byte down the line now (the host has news for
 * whoever waits on it). */
static int wake_l_kick(lua_State *L)
{
    engine *e = rw_engine_check(L);
    struct engine_wake *w = e->wake;
    if (w && w->line >= 0 && w->pid == getpid()) (void)send(w->line, "k", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    return 0;
}

#else /* RW_POLLER_POLL: no descriptor to wake on */

void rw_wake_close(engine *e) { (void)e; }

static int wake_l_path(lua_State *L)
{
    rw_engine_check(L);
    lua_pushnil(L);
    lua_pushliteral(L, "the engine has no descriptor to wake on (a poll(2) build)");
    return 2;
}

#define wake_l_accept wake_l_path

static int wake_l_quiet(lua_State *L)
{
    rw_engine_check(L);
    return 0;
}
#define wake_l_arm wake_l_quiet
#define wake_l_kick wake_l_quiet

#endif

const luaL_Reg rw_wake_methods[] = {
    { "wake_path", wake_l_path },
    { "wake_accept", wake_l_accept },
    { "wake_arm", wake_l_arm },
    { "wake_kick", wake_l_kick },
    { NULL, NULL }
};
