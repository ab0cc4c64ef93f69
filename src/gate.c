/*
 * The gate: one probe per https origin not yet known. The first transfer
 * to such an origin goes on; those that come before it is answered are
 * held (not on the multi handle yet) until its final headers say whether
 * the connection multiplexes, then go at once; to an origin that does, a
 * burst goes one transfer at a time, so that libcurl opens a connection
 * only when those there are have no stream left (gate_open_paced). The
 * gate also counts each origin's open connections, to forget an origin
 * whose last one closed.
 */
/* POLLRDHUP (Linux, as epoll is): a peer that closed its side. The name is
 * glibc's feature macro, reserved for just this. */
#define _GNU_SOURCE /* NOLINT(bugprone-reserved-identifier,cert-dcl37-c,cert-dcl51-cpp) */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

static engine_gate *gate_find(engine *e, unsigned long long key)
{
    int i;
    for (i = 0; i < ENGINE_GATES; i++)
        if (e->gates[i].state != GATE_FREE && e->gates[i].key == key) return &e->gates[i];
    return NULL;
}

void rw_gate_socket_opened(transfer *t, int fd)
{
    engine *e = t->engine;
    unsigned long long *origins;
    engine_gate *g;
    if (!e || !t->gate_key || fd < 0) return;
    origins = (unsigned long long *)rw_watch_fd_table(e->socket_origin, &e->nsocket_origin, sizeof *origins, fd);
    if (!origins) return; /* not counted: the origin is only forgotten later */
    e->socket_origin = origins;
    g = gate_find(e, t->gate_key);
    if (!g) return;
    e->socket_origin[fd] = t->gate_key;
    g->sockets++;
    if (g->pacing && !t->gate_probe) {
        /* t opens a connection while the gate lets its transfers go one at
         * a time: those left wait for this one's first answer */
        g->state = GATE_PROBING;
        t->gate_slot = (int)(g - e->gates) + 1;
        t->gate_probe = 1;
    }
}

/* Socket fd of a counted origin is closed, or was found closed by its peer
 * while idle: the last one gone, a known origin is forgotten. */
void rw_gate_socket_gone(engine *e, int fd)
{
    engine_gate *g;
    if (fd < 0 || (size_t)fd >= e->nsocket_origin || !e->socket_origin[fd]) return;
    g = gate_find(e, e->socket_origin[fd]);
    e->socket_origin[fd] = 0;
    if (g && g->sockets > 0 && --g->sockets == 0 && g->state == GATE_KNOWN && !g->held) g->state = GATE_FREE;
}

/* Whether known gate g's origin has no connection left: when no transfer
 * went through it for ENGINE_GATE_RECHECK, its connections libcurl keeps
 * idle are looked at (one poll), and those the server closed (an HTTP/2
 * GOAWAY and a FIN, say) no longer count; one that only has something to
 * say (an HTTP/2 PING) still does.
 * libcurl itself finds them dead only as the next transfer looks for a
 * connection, after the engine has let the whole burst go; without this,
 * a burst after an idle timeout opened a connection for each request. An
 * origin without a connection is forgotten (the gate is then free). */
static int gate_stale(engine *e, engine_gate *g)
{
    struct pollfd fds[64];
    double now = rw_core_monotonic();
    size_t fd = 0;
    int n, i;
    if (now - g->last_start <= ENGINE_GATE_RECHECK) {
        g->last_start = now;
        return 0;
    }
    g->last_start = now;
    while (fd < e->nsocket_origin && g->state == GATE_KNOWN) {
        for (n = 0; fd < e->nsocket_origin && n < 64; fd++) {
            if (e->socket_origin[fd] != g->key) continue;
            if (fd < e->nwatch && (e->watch[fd] & WATCH_WANTED)) continue; /* a transfer's: in use */
            fds[n].fd = (int)fd;
            fds[n].events = POLLRDHUP;
            fds[n].revents = 0;
            n++;
        }
        if (n == 0 || poll(fds, (nfds_t)n, 0) <= 0) continue;
        for (i = 0; i < n; i++)
            if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) rw_gate_socket_gone(e, fds[i].fd);
    }
    if (g->state == GATE_KNOWN && g->sockets == 0 && !g->held) g->state = GATE_FREE;
    return g->state == GATE_FREE;
}

void rw_gate_clear(transfer *t)
{
    t->gate_slot = t->gate_probe = t->held = 0;
    t->held_next = NULL;
}

/* Whether t is to wait for its origin's first answer. The first transfer
 * to an https origin the engine knows nothing of is its probe and goes on;
 * those that come while it has not answered are held (not yet on the multi
 * handle) until its final headers say whether the connection multiplexes:
 * then they all go at once, and share that connection if it is HTTP/2, or
 * open their own if not. Answers 1 when t is held. */
int rw_gate_hold(engine *e, transfer *t)
{
    int i, free_slot = -1;
    engine_gate *g;
    rw_gate_clear(t);
    if (!t->gate_key) return 0;
    g = gate_find(e, t->gate_key);
    if (g && g->state == GATE_KNOWN && !gate_stale(e, g)) {
        /* To an origin that multiplexes, one transfer goes on at once; those
         * that come before libcurl runs are let go one at a time after it
         * has (gate_open_paced), so that a burst larger than its connections
         * take opens one connection more, not one for each transfer. */
        if (!g->multiplexes || (!g->launched && !g->held)) {
            g->launched = g->multiplexes;
            e->gates_answered |= g->launched;
            return 0;
        }
        e->gates_answered = 1;
    }
    if (g && g->state != GATE_FREE) {
        t->gate_slot = (int)(g - e->gates) + 1;
        t->held = 1;
        if (g->held_tail) g->held_tail->held_next = t;
        else g->held = t;
        g->held_tail = t;
        return 1;
    }
    if (g) free_slot = (int)(g - e->gates); /* forgotten just now: t probes it again */
    for (i = 0; i < ENGINE_GATES && free_slot < 0; i++)
        if (e->gates[i].state == GATE_FREE) free_slot = i;
    if (free_slot < 0) {
        /* Every gate in use: a known origin is forgotten, taken in turn
         * (its next burst is probed again), so that a program that has
         * talked to more origins than there are gates still gates a new
         * one. A known gate holds nothing once rw_gate_release_answered ran. */
        for (i = 0; i < ENGINE_GATES && free_slot < 0; i++) {
            int j = (e->gate_next + i) % ENGINE_GATES;
            if (e->gates[j].state == GATE_KNOWN && !e->gates[j].held) free_slot = j;
        }
        if (free_slot < 0) return 0; /* every gate probing: no gate */
        e->gate_next = (free_slot + 1) % ENGINE_GATES;
    }
    g = &e->gates[free_slot];
    g->key = t->gate_key;
    g->state = GATE_PROBING;
    g->held = g->held_tail = NULL;
    g->sockets = 0;
    g->multiplexes = 0;
    g->last_start = rw_core_monotonic();
    t->gate_slot = free_slot + 1;
    t->gate_probe = 1;
    return 0;
}

/* Held transfer t, out of its gate's line, goes on: onto the multi
 * handle. Not from a libcurl callback: curl_multi_add_handle refuses to run
 * inside one. */
void rw_gate_go(engine *e, transfer *t)
{
    CURLMcode mc;
    t->held = 0;
    t->gate_slot = 0;
    t->held_next = NULL;
    mc = curl_multi_add_handle(e->multi, t->easy);
    if (mc != CURLM_OK) {
        rw_transfer_finish(t, CURLE_OUT_OF_MEMORY, ABORT_NONE);
        rw_transfer_why(t, "libcurl could not start the transfer (%s)", curl_multi_strerror(mc));
        rw_transfer_queue(e, t);
    }
}

/* The transfers a gate held go on, in order. */
static void gate_open(engine *e, engine_gate *g)
{
    transfer *t = g->held;
    g->held = g->held_tail = NULL;
    while (t) {
        transfer *next = t->held_next;
        rw_gate_go(e, t);
        t = next;
    }
}

/* The transfers a gate held go on to an origin that multiplexes: one at a
 * time, each handed to libcurl at once, until one opens a connection;
 * those left wait for that connection's first answer (rw_gate_socket_opened
 * makes it the gate's probe again), then go on the same way. libcurl 7.88
 * puts a transfer on a connection below the server's
 * SETTINGS_MAX_CONCURRENT_STREAMS, and opens a new one for every transfer
 * that finds them all at that limit: it never waits for one it is still
 * opening, CURLOPT_PIPEWAIT or not: let go all at once, a burst larger
 * than the connections take opened a connection for nearly every request
 * past them (docs/http.md). */
static void gate_open_paced(engine *e, engine_gate *g)
{
    int running;
    CURLMcode mc = CURLM_OK;
    g->pacing = 1;
    while (g->held && g->state == GATE_KNOWN && mc == CURLM_OK) {
        transfer *t = g->held;
        g->held = t->held_next;
        if (!g->held) g->held_tail = NULL;
        rw_gate_go(e, t);
        mc = curl_multi_socket_action(e->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    g->pacing = 0;
    if (mc != CURLM_OK && g->state == GATE_KNOWN) gate_open(e, g); /* the engine's next drive reports it */
}

/* Held transfer t leaves its gate's line. */
void rw_gate_unlink(engine_gate *g, transfer *t)
{
    transfer **p, *prev = NULL;
    for (p = &g->held; *p; prev = *p, p = &(*p)->held_next) {
        if (*p == t) {
            *p = t->held_next;
            if (g->held_tail == t) g->held_tail = prev;
            break;
        }
    }
    t->held = 0;
}

void rw_gate_answered(transfer *t)
{
    engine *e = t->engine;
    long version = 0;
    if (!e || !t->gate_probe || !t->gate_slot) return;
    e->gates[t->gate_slot - 1].state = GATE_KNOWN;
    if (curl_easy_getinfo(t->easy, CURLINFO_HTTP_VERSION, &version) == CURLE_OK)
        e->gates[t->gate_slot - 1].multiplexes = version >= CURL_HTTP_VERSION_2_0;
    t->gate_probe = 0;
    t->gate_slot = 0;
    e->gates_answered = 1;
}

/* After libcurl returns: the gates whose probe answered let their
 * transfers go. */
void rw_gate_release_answered(engine *e)
{
    int i;
    if (!e->gates_answered) return;
    e->gates_answered = 0;
    for (i = 0; i < ENGINE_GATES; i++) {
        e->gates[i].launched = 0;
        if (e->gates[i].state == GATE_KNOWN && e->gates[i].held) {
            if (e->gates[i].multiplexes) gate_open_paced(e, &e->gates[i]);
            else gate_open(e, &e->gates[i]);
        }
    }
}

/* A transfer that ends while its gate still counts on it: a held one
 * leaves the line; a probe that ends before an answer leaves its origin
 * unknown, and those it held go on without a gate. */
void rw_gate_leave(engine *e, transfer *t)
{
    engine_gate *g = &e->gates[t->gate_slot - 1];
    if (t->held) {
        rw_gate_unlink(g, t);
    } else if (t->gate_probe) {
        t->gate_probe = 0;
        if (g->state == GATE_PROBING) {
            g->state = GATE_FREE;
            t->gate_slot = 0;
            gate_open(e, g);
        }
    }
    t->gate_slot = 0;
    t->held_next = NULL;
}

/* Probe t never went onto the multi handle: its origin stays unknown. */
void rw_gate_unprobe(engine *e, transfer *t)
{
    if (!t->gate_probe) return;
    e->gates[t->gate_slot - 1].state = GATE_FREE;
    t->gate_probe = t->gate_slot = 0;
}

/* The multi handle's connections are gone: what the gates knew of each
 * origin goes with them (nothing runs, so nothing is held). */
void rw_gate_forget_all(engine *e)
{
    memset(e->gates, 0, sizeof e->gates);
}
