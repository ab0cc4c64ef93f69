/*
 * A parser of server-sent events (the text/event-stream format of the
 * WHATWG HTML standard, "9.2.6 Interpreting an event stream"), fed the
 * body of a streamed response chunk by chunk, as it arrives.
 *
 * Hand-written because no maintained C library parses the format (LLM APIs
 * stream their completions in it), and a body is untrusted bytes: every
 * buffer is bounded by the `max` the parser is made with (a line's bytes
 * count as they came, a byte order mark with the first line), and a fuzz
 * target (fuzz/fuzz_sse.c) holds it to a reference reading of the standard.
 *
 * Plain C, no Lua (the binding is in lparse.c), like parse.c.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ratewise.h"

static int sse_append(rwp_sse_buf *b, const char *p, size_t n, size_t max)
{
    if (n > max || b->len > max - n) return RWP_SSE_TOO_LARGE;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *data;
        while (cap < b->len + n + 1) cap *= 2;
        data = (char *)realloc(b->data, cap);
        if (!data) return RWP_SSE_NO_MEMORY;
        b->data = data;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int sse_set(rwp_sse_buf *b, const char *p, size_t n, size_t max)
{
    b->len = 0;
    return sse_append(b, p, n, max);
}

void rwp_sse_init(rwp_sse *p, size_t max)
{
    memset(p, 0, sizeof *p);
    p->max = max;
}

void rwp_sse_free(rwp_sse *p)
{
    free(p->line.data);
    free(p->data.data);
    free(p->event.data);
    free(p->id.data);
    rwp_sse_init(p, p->max);
}

static int sse_is_field(const char *name, size_t n, const char *field)
{
    size_t len = strlen(field);
    return n == len && memcmp(name, field, n) == 0;
}

/* The event the blank line ends, if it has data; then the buffers of the
 * next one start empty (the last event id stays: it is the stream's). */
static int sse_dispatch(rwp_sse *p, rwp_sse_emit emit, void *ctx)
{
    int rc = 0;
    if (p->data.len > 0) {
        rwp_sse_event ev;
        ev.event = p->event.len ? p->event.data : "message";
        ev.event_len = p->event.len ? p->event.len : 7;
        ev.data = p->data.data;
        ev.data_len = p->data.len - 1; /* less the LF after the last data line */
        ev.id = p->has_id ? p->id.data : NULL;
        ev.id_len = p->has_id ? p->id.len : 0;
        ev.has_retry = p->has_retry;
        ev.retry = p->retry;
        rc = emit(ctx, &ev);
    }
    p->data.len = 0;
    p->event.len = 0;
    p->has_retry = 0;
    return rc;
}

static int sse_line(rwp_sse *p, const char *line, size_t n, rwp_sse_emit emit, void *ctx)
{
    const char *colon, *value;
    size_t name_len, value_len;
    if (!p->past_bom) {
        p->past_bom = 1;
        if (n >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0) {
            line += 3;
            n -= 3;
        }
    }
    if (n == 0) return sse_dispatch(p, emit, ctx);
    if (line[0] == ':') return 0; /* a comment: a keep-alive, as often as not */
    colon = (const char *)memchr(line, ':', n);
    if (colon) {
        name_len = (size_t)(colon - line);
        value = colon + 1;
        value_len = n - name_len - 1;
        if (value_len > 0 && value[0] == ' ') {
            value++;
            value_len--;
        }
    } else {
        name_len = n;
        value = line + n;
        value_len = 0;
    }
    if (sse_is_field(line, name_len, "data")) {
        int rc = sse_append(&p->data, value, value_len, p->max);
        return rc ? rc : sse_append(&p->data, "\n", 1, p->max);
    }
    if (sse_is_field(line, name_len, "event")) return sse_set(&p->event, value, value_len, p->max);
    if (sse_is_field(line, name_len, "id")) {
        if (memchr(value, '\0', value_len)) return 0; /* ignored, as the standard says */
        p->has_id = 1;
        return sse_set(&p->id, value, value_len, p->max);
    }
    if (sse_is_field(line, name_len, "retry")) {
        size_t i;
        long ms = 0;
        if (value_len == 0) return 0;
        for (i = 0; i < value_len; i++) {
            if (value[i] < '0' || value[i] > '9') return 0;
            /* saturates: a wait of 24 days or more is a wait too long anyway */
            ms = ms > (LONG_MAX - 9) / 10 ? LONG_MAX : ms * 10 + (value[i] - '0');
        }
        if (ms > RWP_SSE_MAX_RETRY) ms = RWP_SSE_MAX_RETRY;
        p->retry = ms;
        p->has_retry = 1;
    }
    return 0; /* any other field is ignored */
}

int rwp_sse_feed(rwp_sse *p, const char *s, size_t n, rwp_sse_emit emit, void *ctx)
{
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        int rc;
        if (p->after_cr) {
            p->after_cr = 0;
            if (s[i] == '\n') { /* the LF of a CRLF */
                i++;
                continue;
            }
        }
        while (i < n && s[i] != '\r' && s[i] != '\n') i++;
        if (i == n) { /* the line goes on in the next chunk */
            return sse_append(&p->line, s + start, i - start, p->max);
        }
        p->after_cr = s[i] == '\r';
        if (p->line.len > 0) {
            rc = sse_append(&p->line, s + start, i - start, p->max);
            if (!rc) rc = sse_line(p, p->line.data, p->line.len, emit, ctx);
            p->line.len = 0;
        } else {
            if (i - start > p->max) return RWP_SSE_TOO_LARGE;
            rc = sse_line(p, s + start, i - start, emit, ctx);
        }
        if (rc) return rc;
        i++;
    }
    return 0;
}
