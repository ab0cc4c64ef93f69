/*
 * multi_curl64 [--cainfo FILE] [--pipewait] [--warmup K] [--header LINE]... [--keep] [--copy] [--paths]
 *              [--post BODY] URL N [IN_FLIGHT [USER_AGENT]]
 *
 * The baseline of `make bench`'s concurrent part: N keep-alive GETs of URL
 * driven by ONE libcurl multi handle that keeps IN_FLIGHT (default 64)
 * transfers going at a time. IN_FLIGHT easy handles are configured once and
 * reused: as soon as one finishes (curl_multi_info_read) it is removed and,
 * while requests remain, added again at once. The loop is the textbook one:
 * curl_multi_perform, curl_multi_info_read, curl_multi_poll.
 *
 * Options mirror plain_curl.c (and what ratewise puts on the wire):
 * User-Agent, no "Expect:", redirects followed, a timeout, no signals. The
 * request is the same bytes as ratewise's, which run.lua checks: so
 * CURLOPT_ACCEPT_ENCODING "" (ratewise decompresses by default and sends
 * "Accept-Encoding: deflate, gzip, br, zstd" on every request; without it
 * this contender would send 42 bytes less a request and skip libcurl's work
 * of printing that line), and the User-Agent as a header line, as ratewise
 * passes it (libcurl then prints it after Accept and Accept-Encoding).
 *
 * Over HTTPS (`make bench-http2`, bench/http2.lua): --cainfo FILE sets
 * CURLOPT_CAINFO (the bench's self-signed certificate, what ratewise's
 * ca_file option sets); libcurl then speaks HTTP/2 where the server offers
 * it (its default over HTTPS, with nghttp2). --pipewait sets
 * CURLOPT_PIPEWAIT, so that the transfers started together wait for the
 * first connection and multiplex on it, as ratewise's engine has them do
 * (its gate, src/engine.c), instead of each opening a connection of its
 * own. --header LINE sends LINE ("Authorization: Bearer ...") with every
 * request, after the User-Agent line, where ratewise sends a secret line
 * (bench's `headers` and `client` shapes). --paths gives each handle a URL
 * of its own, URL?task=I for handle I (1 to IN_FLIGHT), as the tasks of the
 * `client_paths` shape each call a path of their own. --post BODY sends
 * each request as a POST of BODY (CURLOPT_POSTFIELDS, on the handle's kept
 * connection, as libcurl does by default: the `post_json` shape). --warmup K runs K
 * requests on the same handles before the clock
 * starts, so that the measured ones find their connections open (and their
 * TLS handshakes done), as a contender that runs in a process of its own
 * all along does from its second round on.
 *
 * --copy hands each body over as a copy in memory of its own, made when
 * its transfer ends, as rw.fetch hands its caller a Lua string of it; the
 * copy before is freed then, as a caller drops one body for the next (the
 * large-body shapes, so that both contenders pay for an owned copy).
 *
 * Each body is kept whole in a per-handle buffer (bench_common.h), emptied
 * for the handle's next transfer; the bytes kept are summed, so that
 * run.lua can check every body arrived whole (the large-body shapes).
 * --keep keeps every response of the measured batch until the clock stops,
 * as rw.map returns every result to its caller (bench's map shapes): its
 * status, its header block (gathered by CURLOPT_HEADERFUNCTION) and its
 * body, each copied into memory of its own, made when the transfer ends,
 * in an array of N made before the clock starts; all freed after it stops
 * (ratewise's results are collected outside the clock too). Every
 * transfer must end with CURLE_OK and status 200; the others are counted
 * as failures. Prints, timed on the monotonic clock with set-up excluded:
 *   requests=N failures=F seconds=S rate=R cpu_us=C performs=P polls=Q body_bytes=B
 *   connections=K http_version=V warmup_failed=W
 * (cpu_us: process CPU microseconds per request; P and Q: how many times
 * curl_multi_perform and curl_multi_poll were called; B: the body bytes of
 * all N transfers; K: the connections the N transfers opened, the warm-up's
 * not counted; V: the HTTP version of the last response, 1.1 or 2; W: the
 * warm-up's failed transfers). Exits 1 when F + W > 0.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "bench_common.h"

typedef struct {
    CURL *easy;
    bench_buffer body, head;
    char errbuf[CURL_ERROR_SIZE];
} slot;

/* One response kept (--keep). */
typedef struct {
    long status;
    char *head, *body;
    size_t head_len, body_len;
} response;

/* A copy of b's bytes in memory of its own, NULL when out of memory. */
static char *copy_of(const bench_buffer *b)
{
    char *p = (char *)malloc(b->len ? b->len : 1);
    if (p && b->len) memcpy(p, b->data, b->len);
    return p;
}

/* What one batch of transfers did. */
typedef struct {
    long failures, performs, polls, connections, http_version;
    double body_bytes;
    response *kept; /* --keep: room for every response of the batch; else NULL */
    int copy;       /* --copy: each body handed over as a copy of its own */
    char *handed;   /* --copy: the last body handed over */
} batch;

static int shown; /* failures reported on stderr so far (at most 5) */

/* Runs n transfers on the multi handle, at most conc (<= n) at a time, on
 * the slots' easy handles; adds to *b. Returns 0, or -1 when the multi
 * handle failed (reported). */
static int run_batch(CURLM *multi, slot *slots, long conc, long n, batch *b)
{
    long started = 0, finished = 0, i;
    int running = 0;
    for (i = 0; i < conc; i++) {
        slots[i].errbuf[0] = '\0';
        slots[i].body.len = 0;
        slots[i].head.len = 0;
        curl_multi_add_handle(multi, slots[i].easy);
        started++;
    }
    while (finished < n) {
        CURLMsg *msg;
        int left;
        CURLMcode mc = curl_multi_perform(multi, &running);
        b->performs++;
        if (mc != CURLM_OK) {
            fprintf(stderr, "multi_curl64: curl_multi_perform: %s\n", curl_multi_strerror(mc));
            return -1;
        }
        while ((msg = curl_multi_info_read(multi, &left)) != NULL) {
            slot *s = NULL;
            CURL *easy;
            long status = 0, connects = 0, version = 0;
            if (msg->msg != CURLMSG_DONE) continue;
            easy = msg->easy_handle;
            curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&s);
            curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
            curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects);
            curl_easy_getinfo(easy, CURLINFO_HTTP_VERSION, &version);
            if (msg->data.result != CURLE_OK || status != 200) {
                b->failures++;
                if (shown++ < 5)
                    fprintf(stderr, "multi_curl64: request failed: %s (status %ld)\n",
                            msg->data.result != CURLE_OK
                                ? (s && s->errbuf[0] ? s->errbuf : curl_easy_strerror(msg->data.result))
                                : "not 200",
                            status);
            }
            b->connections += connects;
            b->http_version = version;
            if (s) b->body_bytes += (double)s->body.len;
            if (s && b->copy) {
                free(b->handed);
                if (!(b->handed = copy_of(&s->body))) {
                    fprintf(stderr, "multi_curl64: out of memory\n");
                    return -1;
                }
            }
            if (s && b->kept) {
                response *r = &b->kept[finished];
                r->status = status;
                r->head = copy_of(&s->head);
                r->body = copy_of(&s->body);
                r->head_len = s->head.len;
                r->body_len = s->body.len;
                if (!r->head || !r->body) {
                    fprintf(stderr, "multi_curl64: out of memory\n");
                    return -1;
                }
            }
            finished++;
            curl_multi_remove_handle(multi, easy); /* msg is invalid after this */
            if (started < n) {
                if (s) {
                    s->body.len = 0; /* the body is discarded (or was copied) */
                    s->head.len = 0;
                    s->errbuf[0] = '\0';
                }
                curl_multi_add_handle(multi, easy);
                started++;
            }
        }
        if (finished >= n) break;
        mc = curl_multi_poll(multi, NULL, 0, 1000, NULL);
        b->polls++;
        if (mc != CURLM_OK) {
            fprintf(stderr, "multi_curl64: curl_multi_poll: %s\n", curl_multi_strerror(mc));
            return -1;
        }
    }
    return 0;
}

static int usage(const char *prog)
{
    fprintf(stderr, "usage: %s [--cainfo FILE] [--pipewait] [--warmup K] [--header LINE]... [--keep] [--copy] [--paths] [--post BODY] URL N "
                    "[IN_FLIGHT [USER_AGENT]]\n",
            prog);
    return 2;
}

int main(int argc, char **argv)
{
    const char *url, *agent, *cainfo = NULL, *post = NULL;
    char *end;
    long n, conc, warmup = 0, i;
    int pipewait = 0, keep = 0, copy = 0, paths = 0, arg = 1, rest, nextra = 0;
    const char *extra[8];
    char *agent_line;
    struct curl_slist *headers = NULL;
    CURLM *multi;
    slot *slots;
    double t0, c0, secs, cpu;
    batch warm, b;

    while (arg < argc && strncmp(argv[arg], "--", 2) == 0) {
        if (strcmp(argv[arg], "--pipewait") == 0) {
            pipewait = 1;
            arg++;
        } else if (strcmp(argv[arg], "--keep") == 0) {
            keep = 1;
            arg++;
        } else if (strcmp(argv[arg], "--copy") == 0) {
            copy = 1;
            arg++;
        } else if (strcmp(argv[arg], "--paths") == 0) {
            paths = 1;
            arg++;
        } else if (strcmp(argv[arg], "--post") == 0 && arg + 1 < argc) {
            post = argv[arg + 1];
            arg += 2;
        } else if (strcmp(argv[arg], "--header") == 0 && arg + 1 < argc) {
            if (nextra == (int)(sizeof extra / sizeof extra[0])) {
                fprintf(stderr, "multi_curl64: at most %d --header lines\n", (int)(sizeof extra / sizeof extra[0]));
                return 2;
            }
            extra[nextra++] = argv[arg + 1];
            arg += 2;
        } else if (strcmp(argv[arg], "--cainfo") == 0 && arg + 1 < argc) {
            cainfo = argv[arg + 1];
            arg += 2;
        } else if (strcmp(argv[arg], "--warmup") == 0 && arg + 1 < argc) {
            warmup = strtol(argv[arg + 1], &end, 10);
            if (*end || warmup < 0) {
                fprintf(stderr, "multi_curl64: K of --warmup must be an integer >= 0\n");
                return 2;
            }
            arg += 2;
        } else {
            return usage(argv[0]);
        }
    }
    rest = argc - arg;
    if (rest < 2 || rest > 4) return usage(argv[0]);
    url = argv[arg];
    n = strtol(argv[arg + 1], &end, 10);
    if (*end || n <= 0) {
        fprintf(stderr, "multi_curl64: N must be a positive integer\n");
        return 2;
    }
    conc = 64;
    if (rest >= 3) {
        conc = strtol(argv[arg + 2], &end, 10);
        if (*end || conc <= 0) {
            fprintf(stderr, "multi_curl64: IN_FLIGHT must be a positive integer\n");
            return 2;
        }
    }
    if (conc > n) conc = n;
    agent = rest == 4 ? argv[arg + 3] : "multi_curl64";

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "multi_curl64: curl_global_init failed\n");
        return 1;
    }
    multi = curl_multi_init();
    /* Room for a connection per handle in libcurl's cache (its default is 4
     * per handle added, which shrinks as a batch's last handles are removed,
     * so the warm-up's connections were closed but 4 at its end). */
    if (multi) curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, conc);
    agent_line = bench_agent_line(agent);
    headers = curl_slist_append(headers, "Expect:");
    if (headers && agent_line) headers = curl_slist_append(headers, agent_line);
    for (i = 0; i < nextra && headers; i++) headers = curl_slist_append(headers, extra[i]);
    slots = (slot *)calloc((size_t)conc, sizeof *slots);
    if (!multi || !agent_line || !headers || !slots) {
        fprintf(stderr, "multi_curl64: out of memory\n");
        return 1;
    }
    for (i = 0; i < conc; i++) {
        slot *s = &slots[i];
        CURL *easy = s->easy = curl_easy_init();
        if (!easy) {
            fprintf(stderr, "multi_curl64: out of memory\n");
            return 1;
        }
        if (paths) {
            char own[2048]; /* libcurl copies it */
            int len = snprintf(own, sizeof own, "%s?task=%ld", url, i + 1);
            if (len < 0 || (size_t)len >= sizeof own) {
                fprintf(stderr, "multi_curl64: URL too long for --paths\n");
                return 2;
            }
            curl_easy_setopt(easy, CURLOPT_URL, own);
        } else {
            curl_easy_setopt(easy, CURLOPT_URL, url);
        }
        curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, "");
        curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
        curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 30000L);
        curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, s->errbuf);
        curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, bench_on_body);
        curl_easy_setopt(easy, CURLOPT_WRITEDATA, &s->body);
        curl_easy_setopt(easy, CURLOPT_PRIVATE, s);
        if (cainfo) curl_easy_setopt(easy, CURLOPT_CAINFO, cainfo);
        if (post) {
            curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(post));
            curl_easy_setopt(easy, CURLOPT_POSTFIELDS, post);
        }
        if (pipewait) curl_easy_setopt(easy, CURLOPT_PIPEWAIT, 1L);
        if (keep) {
            curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, bench_on_body);
            curl_easy_setopt(easy, CURLOPT_HEADERDATA, &s->head);
        }
    }

    memset(&warm, 0, sizeof warm);
    memset(&b, 0, sizeof b);
    warm.copy = b.copy = copy;
    if (keep && !(b.kept = (response *)calloc((size_t)n, sizeof *b.kept))) {
        fprintf(stderr, "multi_curl64: out of memory\n");
        return 1;
    }
    if (warmup > 0 && run_batch(multi, slots, conc < warmup ? conc : warmup, warmup, &warm) != 0) return 1;
    t0 = bench_clock(CLOCK_MONOTONIC);
    c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
    if (run_batch(multi, slots, conc, n, &b) != 0) return 1;
    secs = bench_clock(CLOCK_MONOTONIC) - t0;
    cpu = bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
    printf("requests=%ld failures=%ld seconds=%.6f rate=%.1f cpu_us=%.2f performs=%ld polls=%ld body_bytes=%.0f"
           " connections=%ld http_version=%s warmup_failed=%ld\n",
           n, b.failures, secs, (double)n / secs, cpu * 1e6 / (double)n, b.performs, b.polls, b.body_bytes,
           b.connections, b.http_version == CURL_HTTP_VERSION_2_0 ? "2" : "1.1", warm.failures);

    free(warm.handed);
    free(b.handed);
    if (b.kept) {
        for (i = 0; i < n; i++) {
            free(b.kept[i].head);
            free(b.kept[i].body);
        }
        free(b.kept);
    }
    for (i = 0; i < conc; i++) {
        curl_easy_cleanup(slots[i].easy);
        free(slots[i].body.data);
        free(slots[i].head.data);
    }
    free(slots);
    curl_multi_cleanup(multi);
    curl_slist_free_all(headers);
    free(agent_line);
    curl_global_cleanup();
    return b.failures + warm.failures > 0 ? 1 : 0;
}
