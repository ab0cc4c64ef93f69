/*
 * The engine's OS wait (src/poller.h): epoll or poll(2), one of them
 * compiled in. Both are level-triggered: a descriptor still ready after a
 * wait is reported by the next one.
 */
#define _GNU_SOURCE /* NOLINT(bugprone-reserved-identifier,cert-dcl37-c,cert-dcl51-cpp) */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "poller.h"
#include "ratewise.h"

#ifdef RW_POLLER_EPOLL
#include <sys/epoll.h>
#endif

/* Whole milliseconds, rounded up: a wait is never shorter than asked. */
static int poller_ms(double seconds)
{
    double ms = ceil(seconds * 1000.0);
    if (seconds <= 0) return 0;
    if (ms < 1) ms = 1;
    return ms > (double)INT_MAX ? INT_MAX : (int)ms;
}

#ifdef RW_POLLER_EPOLL

int poller_open(poller *p)
{
    memset(p, 0, sizeof *p);
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    return p->epfd < 0 ? -1 : 0;
}

void poller_close(poller *p)
{
    if (p->epfd >= 0) close(p->epfd);
    p->epfd = -1;
}

int poller_fd(const poller *p) { return p->epfd; }

int poller_set(poller *p, int fd, unsigned events, int in_set)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = ((events & POLLER_IN) ? EPOLLIN : 0u) | ((events & POLLER_OUT) ? EPOLLOUT : 0u)
                | ((events & POLLER_ONESHOT) ? (unsigned)EPOLLONESHOT : 0u);
    ev.data.fd = fd;
    if (epoll_ctl(p->epfd, in_set ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) == 0
        || (errno == ENOENT && epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) == 0)
        || (errno == EEXIST && epoll_ctl(p->epfd, EPOLL_CTL_MOD, fd, &ev) == 0))
        return 0;
    return -1;
}

void poller_del(poller *p, int fd) { (void)epoll_ctl(p->epfd, EPOLL_CTL_DEL, fd, NULL); }

/* Closing a descriptor takes it out of every epoll set. */
void poller_closing(poller *p, int fd)
{
    (void)p;
    (void)fd;
}

/* To the microsecond where the kernel can (epoll_pwait2, Linux 5.11): a
 * bucket spacing requests 5 ms apart must not send them 4 or 6 ms apart,
 * as waits rounded up to whole milliseconds of epoll_wait would. */
static int poller_epoll_wait(poller *p, struct epoll_event *ev, int max, double seconds)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
    if (!p->coarse && seconds > 0) {
        struct timespec ts;
        int n;
        if (seconds > RW_MAX_SECONDS) seconds = RW_MAX_SECONDS;
        ts.tv_sec = (time_t)seconds;
        ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
        if (ts.tv_nsec > 999999999L) ts.tv_nsec = 999999999L;
        n = epoll_pwait2(p->epfd, ev, max, &ts, NULL);
        if (n >= 0 || errno != ENOSYS) return n;
        p->coarse = 1;
    }
#endif
    return epoll_wait(p->epfd, ev, max, poller_ms(seconds));
}

int poller_wait(poller *p, poller_event *out, int max, double seconds)
{
    struct epoll_event ev[64];
    int n, i;
    if (max > 64) max = 64;
    n = poller_epoll_wait(p, ev, max, seconds);
    for (i = 0; i < n; i++) {
        out[i].fd = ev[i].data.fd;
        out[i].events = ((ev[i].events & EPOLLIN) ? POLLER_IN : 0u) | ((ev[i].events & EPOLLOUT) ? POLLER_OUT : 0u)
                        | ((ev[i].events & (EPOLLERR | EPOLLHUP)) ? POLLER_ERR : 0u);
    }
    return n;
}

#else /* RW_POLLER_POLL */

int poller_open(poller *p)
{
    memset(p, 0, sizeof *p);
    return 0;
}

void poller_close(poller *p)
{
    free(p->fds);
    free(p->oneshot);
    free(p->slot);
    memset(p, 0, sizeof *p);
}

int poller_fd(const poller *p)
{
    (void)p;
    return -1;
}

int poller_set(poller *p, int fd, unsigned events, int in_set)
{
    int i;
    (void)in_set;
    if (fd < 0) {
        errno = EBADF;
        return -1;
    }
    if ((size_t)fd >= p->nslot) {
        size_t n = p->nslot ? p->nslot : 64;
        int *grown;
        while (n <= (size_t)fd) n *= 2;
        grown = (int *)realloc(p->slot, n * sizeof *grown);
        if (!grown) return -1;
        memset(grown + p->nslot, 0, (n - p->nslot) * sizeof *grown);
        p->slot = grown;
        p->nslot = n;
    }
    i = p->slot[fd] - 1;
    if (i < 0) {
        /* Refused as epoll_ctl refuses it, not reported later (POLLNVAL). */
        if (fcntl(fd, F_GETFD) == -1) return -1;
        if (p->nfds == p->cap) {
            int cap = p->cap ? p->cap * 2 : 16;
            struct pollfd *fds = (struct pollfd *)realloc(p->fds, (size_t)cap * sizeof *fds);
            unsigned char *oneshot;
            if (!fds) return -1;
            p->fds = fds;
            oneshot = (unsigned char *)realloc(p->oneshot, (size_t)cap);
            if (!oneshot) return -1;
            p->oneshot = oneshot;
            p->cap = cap;
        }
        i = p->nfds++;
        p->slot[fd] = i + 1;
        p->fds[i].fd = fd;
    }
    p->fds[i].events = (short)(((events & POLLER_IN) ? POLLIN : 0) | ((events & POLLER_OUT) ? POLLOUT : 0));
    p->fds[i].revents = 0;
    p->oneshot[i] = (events & POLLER_ONESHOT) != 0;
    return 0;
}

/* The last entry takes the leaving one's place. */
void poller_del(poller *p, int fd)
{
    int i, last;
    if (fd < 0 || (size_t)fd >= p->nslot || !p->slot[fd]) return;
    i = p->slot[fd] - 1;
    last = --p->nfds;
    p->slot[fd] = 0;
    if (i != last) {
        p->fds[i] = p->fds[last];
        p->oneshot[i] = p->oneshot[last];
        p->slot[p->fds[i].fd] = i + 1;
    }
}

/* poll(2) would report a closed descriptor (POLLNVAL), or the next file
 * opened with its number. */
void poller_closing(poller *p, int fd) { poller_del(p, fd); }

int poller_wait(poller *p, poller_event *out, int max, double seconds)
{
    int n, i, k, got = 0;
    if (p->nfds == 0) {
        /* nothing to wait on: a plain sleep */
        if (seconds > 0) {
            n = poll(NULL, 0, poller_ms(seconds));
            if (n < 0) return -1;
        }
        return 0;
    }
    n = poll(p->fds, (nfds_t)p->nfds, poller_ms(seconds));
    if (n < 0) return -1;
    if (n == 0) return 0;
    if (p->start >= p->nfds) p->start = 0;
    for (k = 0; k < p->nfds && got < max; k++) {
        struct pollfd *f;
        i = (p->start + k) % p->nfds;
        f = &p->fds[i];
        if (!f->revents) continue;
        out[got].fd = f->fd;
        out[got].events = ((f->revents & POLLIN) ? POLLER_IN : 0u) | ((f->revents & POLLOUT) ? POLLER_OUT : 0u)
                          | ((f->revents & (POLLERR | POLLHUP | POLLNVAL)) ? POLLER_ERR : 0u);
        f->revents = 0;
        got++;
    }
    p->start = (p->start + k) % p->nfds;
    /* Reported once: a one-shot descriptor leaves the set (after the loop,
     * which the last entry's move into its place would upset). */
    for (i = 0; i < got; i++) {
        int s = p->slot[out[i].fd] - 1;
        if (s >= 0 && p->oneshot[s]) poller_del(p, out[i].fd);
    }
    return got;
}

#endif
