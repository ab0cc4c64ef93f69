/*
 * multi_curl URL N MODE [USER_AGENT]   (a profiling aid for `make bench`)
 *
 * The loop of plain_curl, but driven the way ratewise's engine (src/engine.c)
 * drives libcurl, in C and without Lua, to tell libcurl's share of
 * rw.fetch's cost from the Lua binding's. MODE:
 *   easy    curl_easy_perform on one reused handle (= plain_curl)
 *   multi   one multi handle; the same easy handle, configured once, added
 *           and removed for every request; multi_perform / multi_poll
 *   engine  as multi, plus what engine.c does per request: curl_easy_reset,
 *           every option set again, a fresh header list, curl_multi_timeout,
 *           five curl_easy_getinfo calls and a copy of the effective URL
 * Prints: requests=N seconds=S rate=R cpu_us=C (CPU microseconds a request)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

typedef struct { char *data; size_t len, cap; } buffer;

static int append(buffer *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        char *d;
        while (cap < b->len + n + 1) cap *= 2;
        d = (char *)realloc(b->data, cap);
        if (!d) return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 1;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
    return append((buffer *)ud, ptr, size * nmemb) ? size * nmemb : 0;
}

static double clock_of(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static buffer body, head;
static char errbuf[CURL_ERROR_SIZE];

static struct curl_slist *configure(CURL *easy, const char *url, const char *agent, int full)
{
    struct curl_slist *h = NULL;
    char ua[256];
    curl_easy_setopt(easy, CURLOPT_URL, url);
    if (full) { /* engine.c sends the agent as a header line from Lua */
        snprintf(ua, sizeof ua, "User-Agent: %s", agent);
        h = curl_slist_append(h, ua);
    } else {
        curl_easy_setopt(easy, CURLOPT_USERAGENT, agent);
    }
    h = curl_slist_append(h, "Expect:");
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
    if (full) {
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
        curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_data);
        curl_easy_setopt(easy, CURLOPT_HEADERDATA, &head);
        curl_easy_setopt(easy, CURLOPT_PRIVATE, &body);
    }
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);
    return h;
}

int main(int argc, char **argv)
{
    const char *url, *mode, *agent;
    long n, i, status = 0;
    CURL *easy;
    CURLM *multi;
    struct curl_slist *h;
    double t0, c0, secs, cpu;
    int full, use_multi;

    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s URL N easy|multi|engine [USER_AGENT]\n", argv[0]);
        return 2;
    }
    url = argv[1];
    n = strtol(argv[2], NULL, 10);
    mode = argv[3];
    agent = argc == 5 ? argv[4] : "multi_curl";
    full = strcmp(mode, "engine") == 0;
    use_multi = full || strcmp(mode, "multi") == 0;
    if (n <= 0 || (!use_multi && strcmp(mode, "easy") != 0)) {
        fprintf(stderr, "multi_curl: bad N or MODE\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    easy = curl_easy_init();
    multi = curl_multi_init();
    h = configure(easy, url, agent, full);

    t0 = clock_of(CLOCK_MONOTONIC);
    c0 = clock_of(CLOCK_PROCESS_CPUTIME_ID);
    for (i = 0; i < n; i++) {
        CURLcode code = CURLE_OK;
        body.len = head.len = 0;
        if (!use_multi) {
            code = curl_easy_perform(easy);
        } else {
            int running = 1, left;
            CURLMsg *msg;
            if (full) {
                curl_easy_reset(easy);
                curl_slist_free_all(h);
                h = configure(easy, url, agent, 1);
            }
            curl_multi_add_handle(multi, easy);
            for (;;) {
                long ms = -1;
                curl_multi_perform(multi, &running);
                if (!running) break;
                if (full) curl_multi_timeout(multi, &ms);
                curl_multi_poll(multi, NULL, 0, 31000, NULL);
            }
            while ((msg = curl_multi_info_read(multi, &left)) != NULL)
                if (msg->msg == CURLMSG_DONE) code = msg->data.result;
            if (full) {
                long l;
                double d;
                char *u = NULL;
                curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &l);
                curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &l);
                curl_easy_getinfo(easy, CURLINFO_REDIRECT_COUNT, &l);
                curl_easy_getinfo(easy, CURLINFO_TOTAL_TIME, &d);
                curl_easy_getinfo(easy, CURLINFO_EFFECTIVE_URL, &u);
                if (u) free(strdup(u));
            }
            curl_multi_remove_handle(multi, easy);
        }
        if (code != CURLE_OK) {
            fprintf(stderr, "multi_curl: request %ld: %s\n", i + 1, curl_easy_strerror(code));
            return 1;
        }
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200) {
            fprintf(stderr, "multi_curl: request %ld: status %ld\n", i + 1, status);
            return 1;
        }
    }
    secs = clock_of(CLOCK_MONOTONIC) - t0;
    cpu = clock_of(CLOCK_PROCESS_CPUTIME_ID) - c0;
    printf("requests=%ld seconds=%.6f rate=%.1f cpu_us=%.2f\n", n, secs, n / secs, cpu * 1e6 / n);
    curl_multi_cleanup(multi);
    curl_easy_cleanup(easy);
    curl_slist_free_all(h);
    free(body.data);
    free(head.data);
    curl_global_cleanup();
    return 0;
}
