/*
 * plain_curl URL N [USER_AGENT]
 *
 * The baseline of `make bench`: N sequential GETs of URL with one reused
 * libcurl easy handle (so one kept-alive connection), the body written to a
 * buffer that is thrown away. Options mirror what ratewise sets on its easy
 * handles where they matter on the wire (User-Agent, no "Expect:", redirects
 * followed, a timeout, no signals).
 *
 * The request must be the same bytes as ratewise's, or the comparison is of
 * unlike things (run.lua checks it: both heads, captured by a socket server,
 * must be equal). So:
 * - CURLOPT_ACCEPT_ENCODING "": ratewise decompresses by default, so libcurl
 *   sends "Accept-Encoding: deflate, gzip, br, zstd" on every request of
 *   ratewise's; without it here this contender sends 42 bytes less a
 *   request, and libcurl skips the work of printing that line.
 * - User-Agent as a header line (CURLOPT_HTTPHEADER), not CURLOPT_USERAGENT:
 *   ratewise passes it that way, and libcurl puts such lines after its own
 *   Accept and Accept-Encoding, where CURLOPT_USERAGENT would put it before.
 *
 * Checks every status is 200 and prints
 *   requests=N seconds=S rate=R cpu_us=C
 * timed on the monotonic clock, set-up excluded (C: process CPU microseconds
 * per request).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "bench_common.h"

int main(int argc, char **argv)
{
    const char *url, *agent;
    char *end;
    long n, i, status = 0;
    bench_buffer body = { NULL, 0, 0 };
    char errbuf[CURL_ERROR_SIZE];
    char *agent_line;
    struct curl_slist *headers = NULL;
    CURL *easy;
    double t0, c0, secs, cpu;
    int rc = 0;

    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s URL N [USER_AGENT]\n", argv[0]);
        return 2;
    }
    url = argv[1];
    n = strtol(argv[2], &end, 10);
    if (*end || n <= 0) {
        fprintf(stderr, "plain_curl: N must be a positive integer\n");
        return 2;
    }
    agent = argc == 4 ? argv[3] : "plain_curl";

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "plain_curl: curl_global_init failed\n");
        return 1;
    }
    easy = curl_easy_init();
    agent_line = bench_agent_line(agent);
    headers = curl_slist_append(headers, "Expect:");
    if (headers && agent_line) headers = curl_slist_append(headers, agent_line);
    if (!easy || !agent_line || !headers) {
        fprintf(stderr, "plain_curl: out of memory\n");
        return 1;
    }
    errbuf[0] = '\0';
    curl_easy_setopt(easy, CURLOPT_URL, url);
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(easy, CURLOPT_ACCEPT_ENCODING, "");
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(easy, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, bench_on_body);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);

    t0 = bench_clock(CLOCK_MONOTONIC);
    c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
    for (i = 0; i < n; i++) {
        CURLcode code;
        body.len = 0; /* the body is discarded */
        code = curl_easy_perform(easy);
        if (code != CURLE_OK) {
            fprintf(stderr, "plain_curl: request %ld: %s\n", i + 1,
                    errbuf[0] ? errbuf : curl_easy_strerror(code));
            rc = 1;
            break;
        }
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200) {
            fprintf(stderr, "plain_curl: request %ld: status %ld\n", i + 1, status);
            rc = 1;
            break;
        }
    }
    secs = bench_clock(CLOCK_MONOTONIC) - t0;
    cpu = bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (rc == 0)
        printf("requests=%ld seconds=%.6f rate=%.1f cpu_us=%.2f\n", n, secs, (double)n / secs,
               cpu * 1e6 / (double)n);

    curl_easy_cleanup(easy);
    curl_slist_free_all(headers);
    free(agent_line);
    free(body.data);
    curl_global_cleanup();
    return rc;
}
