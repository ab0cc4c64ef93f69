/*
 * What the two plain-C contenders of `make bench` share: a body buffer
 * filled by libcurl's write callback (the bodies are thrown away, but
 * copied, as ratewise copies them), and a clock.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    char *data;
    size_t len, cap;
} bench_buffer;

/* CURLOPT_WRITEFUNCTION, with a bench_buffer as CURLOPT_WRITEDATA. */
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

static double bench_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

#endif
