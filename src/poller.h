/* The engine's OS wait (src/poller.c): the descriptors to wait on, each
 * for reading and/or writing, and one wait for any of them. Two backends,
 * chosen at build time: epoll (Linux's default), which is itself one
 * descriptor a host can wait on, and poll(2) (every POSIX system's, the
 * default elsewhere; `make POLLER=poll` defines RW_POLLER_POLL), which has
 * none. */
#ifndef RATEWISE_POLLER_H
#define RATEWISE_POLLER_H

#include <poll.h>
#include <stddef.h>

#if !defined(RW_POLLER_EPOLL) && !defined(RW_POLLER_POLL)
#ifdef __linux__
#define RW_POLLER_EPOLL 1
#else
#define RW_POLLER_POLL 1
#endif
#endif
#if defined(RW_POLLER_EPOLL) && defined(RW_POLLER_POLL)
#error "define one of RW_POLLER_EPOLL and RW_POLLER_POLL"
#endif

/* Linux's: a peer that closed its side. Elsewhere that shows as readable. */
#ifndef POLLRDHUP
#define POLLRDHUP POLLIN
#endif

#ifdef RW_POLLER_EPOLL
#define POLLER_NAME "epoll"
#else
#define POLLER_NAME "poll"
#endif

/* Internal to the module whoever builds it (see ratewise.h). */
#pragma GCC visibility push(hidden)

#define POLLER_IN 1u
#define POLLER_OUT 2u
#define POLLER_ERR 4u     /* reported: an error or a hang-up */
#define POLLER_ONESHOT 8u /* asked: reported once, then not again until set anew */

typedef struct poller_event {
    int fd;
    unsigned events;
} poller_event;

typedef struct poller {
#ifdef RW_POLLER_EPOLL
    int epfd;
    int coarse; /* the kernel has no epoll_pwait2: waits are whole milliseconds */
#else
    struct pollfd *fds;
    unsigned char *oneshot; /* beside fds */
    int nfds, cap;
    int start; /* where the next wait starts reporting, so that none starves */
    int *slot; /* by descriptor: its index in fds + 1 (0: not in the set) */
    size_t nslot;
#endif
} poller;

/* 0, or -1 with errno set. */
int poller_open(poller *p);
void poller_close(poller *p);
/* The descriptor that is readable when one in the set is ready, for a host
 * to wait on; -1 when the backend has none (poll). */
int poller_fd(const poller *p);
/* fd is waited on for events (POLLER_IN, POLLER_OUT, POLLER_ONESHOT) from
 * now on; in_set says whether it is believed to be in the set already.
 * 0, or -1 with errno set. */
int poller_set(poller *p, int fd, unsigned events, int in_set);
/* fd leaves the set (if it is there). */
void poller_del(poller *p, int fd);
/* fd is about to be closed. */
void poller_closing(poller *p, int fd);
/* Waits at most `seconds` (0: not at all) for descriptors of the set to be
 * ready, and reports at most max of them in ev: their number, or -1 with
 * errno set. */
int poller_wait(poller *p, poller_event *ev, int max, double seconds);

#pragma GCC visibility pop

#endif
