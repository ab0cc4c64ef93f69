/*
 * What the two plain-C contenders of `make bench` share: a body buffer
 * filled by libcurl's write callback (the bodies are thrown away, but
 * copied, as ratewise copies them), the User-Agent line, and a clock.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <stdio.h>

typedef struct {
    char *data;
    size_t len, cap;
} bench_buffer;

/* CURLOPT_WRITEFUNCTION, with a bench_buffer as CURLOPT_WRITEDATA.
 * Every chunk is appended, so after a transfer data[0 .. len) is its whole
 * body in one piece, as a Lua string is ratewise's (len is checked against
 * Content-Length by multi_curl64). The caller empties it (len = 0) before
 * the next transfer and keeps the memory: after the first body of a size,
 * no allocation, where ratewise makes a new string per body. */
static size_t bench_on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    bench_buffer *b = (bench_buffer *)ud;
    size_t n = size * nmemb;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        char *data;
        while (cap < b->len + n) cap *= 2;
        data = (char *)realloc(b->data, cap);
        if (!data) return 0;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    return n;
}

/* "User-Agent: AGENT", malloc'd; NULL when out of memory. The contenders
 * send it through CURLOPT_HTTPHEADER, as ratewise does (see plain_curl.c). */
static char *bench_agent_line(const char *agent)
{
    size_t n = strlen("User-Agent: ") + strlen(agent) + 1;
    char *line = (char *)malloc(n);
    if (line) snprintf(line, n, "User-Agent: %s", agent);
    return line;
}

static double bench_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#endif
