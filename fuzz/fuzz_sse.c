/*
 * rwp_sse_feed: server-sent events from a body that arrives in chunks.
 *
 * The input's first byte seeds where the body is cut into chunks; the rest
 * is the body. Properties:
 *   - the events do not depend on the chunking: fed whole, fed in the
 *     seeded chunks and fed a byte at a time, the parser gives the same
 *     events (and the same answer);
 *   - they are exactly those of a reference reading of the standard
 *     written here from its text (split into lines first, then one field
 *     at a time), which shares no code with sse.c;
 *   - every event's name and data hold no CR, its name and id no LF, its id
 *     no NUL, a retry is 0 to RWP_SSE_MAX_RETRY, and no span is longer than
 *     the parser's max.
 */
#include "fuzz.h"

#define SSE_MAX 512
#define SSE_MAX_EVENTS 4096

typedef struct sse_seen {
    size_t n;
    char text[SSE_MAX_EVENTS][64]; /* a digest of each event: lengths, retry and a checksum */
    int overflow;
} sse_seen;

static unsigned long sse_sum(const char *s, size_t n)
{
    unsigned long h = 5381;
    size_t i;
    for (i = 0; i < n; i++) h = h * 33 + (unsigned char)s[i];
    return h;
}

static void sse_record(sse_seen *seen, const char *event, size_t event_len, const char *data, size_t data_len,
                       const char *id, size_t id_len, int has_retry, long retry)
{
    if (seen->n >= SSE_MAX_EVENTS) {
        seen->overflow = 1;
        return;
    }
    (void)snprintf(seen->text[seen->n], sizeof seen->text[0], "%zu:%lx/%zu:%lx/%d:%zu:%lx/%d:%ld", event_len,
                   sse_sum(event, event_len), data_len, sse_sum(data, data_len), id != NULL, id_len,
                   id ? sse_sum(id, id_len) : 0UL, has_retry, has_retry ? retry : 0L);
    seen->n++;
}

static int sse_emit(void *ctx, const rwp_sse_event *ev)
{
    FUZZ_CHECK(ev->event && ev->event_len > 0 && ev->event_len <= SSE_MAX);
    FUZZ_CHECK(!memchr(ev->event, '\r', ev->event_len) && !memchr(ev->event, '\n', ev->event_len));
    FUZZ_CHECK(ev->data && ev->data_len < SSE_MAX && !memchr(ev->data, '\r', ev->data_len));
    if (ev->id) {
        FUZZ_CHECK(ev->id_len <= SSE_MAX);
        FUZZ_CHECK(!memchr(ev->id, '\r', ev->id_len) && !memchr(ev->id, '\n', ev->id_len));
        FUZZ_CHECK(!memchr(ev->id, '\0', ev->id_len));
    }
    if (ev->has_retry) FUZZ_CHECK(ev->retry >= 0 && ev->retry <= RWP_SSE_MAX_RETRY);
    sse_record((sse_seen *)ctx, ev->event, ev->event_len, ev->data, ev->data_len, ev->id, ev->id_len,
               ev->has_retry, ev->retry);
    return 0;
}

/* ---- the reference: the standard's steps, over the whole body at once ---- */

typedef struct ref_state {
    char data[SSE_MAX + 2], event[SSE_MAX + 1], id[SSE_MAX + 1];
    size_t data_len, event_len, id_len;
    int has_id, has_retry, too_large;
    long retry;
} ref_state;

static int ref_field(const char *line, size_t n, const char *name)
{
    return strlen(name) == n && memcmp(line, name, n) == 0;
}

static void ref_line(ref_state *st, sse_seen *seen, const char *line, size_t n)
{
    size_t colon, vlen;
    const char *value;
    if (n > SSE_MAX) {
        st->too_large = 1;
        return;
    }
    if (n == 0) { /* dispatch */
        if (st->data_len > 0)
            sse_record(seen, st->event_len ? st->event : "message", st->event_len ? st->event_len : 7, st->data,
                       st->data_len - 1, st->has_id ? st->id : NULL, st->has_id ? st->id_len : 0, st->has_retry,
                       st->retry);
        st->data_len = st->event_len = 0;
        st->has_retry = 0;
        return;
    }
    if (line[0] == ':') return;
    for (colon = 0; colon < n && line[colon] != ':'; colon++) {}
    value = colon < n ? line + colon + 1 : line + n;
    vlen = colon < n ? n - colon - 1 : 0;
    if (vlen && value[0] == ' ') {
        value++;
        vlen--;
    }
    if (ref_field(line, colon, "data")) {
        if (st->data_len + vlen + 1 > SSE_MAX) {
            st->too_large = 1;
            return;
        }
        memcpy(st->data + st->data_len, value, vlen);
        st->data_len += vlen;
        st->data[st->data_len++] = '\n';
    } else if (ref_field(line, colon, "event")) {
        memcpy(st->event, value, vlen);
        st->event_len = vlen;
    } else if (ref_field(line, colon, "id")) {
        if (!memchr(value, '\0', vlen)) {
            memcpy(st->id, value, vlen);
            st->id_len = vlen;
            st->has_id = 1;
        }
    } else if (ref_field(line, colon, "retry") && vlen > 0) {
        size_t i;
        double ms = 0;
        for (i = 0; i < vlen; i++)
            if (value[i] < '0' || value[i] > '9') return;
        for (i = 0; i < vlen; i++) ms = ms * 10 + (value[i] - '0');
        st->retry = ms > (double)RWP_SSE_MAX_RETRY ? RWP_SSE_MAX_RETRY : (long)ms;
        st->has_retry = 1;
    }
}

/* 0, or 1 when a line or an event's data passed SSE_MAX. A line's bound
 * counts its bytes as they came: a byte order mark counts toward the first
 * line (the parser holds it with the line until the line ends). */
static int ref_parse(const char *s, size_t n, sse_seen *seen)
{
    ref_state st;
    size_t i = 0, bom = 0;
    memset(&st, 0, sizeof st);
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) i = bom = 3;
    while (i < n) {
        size_t start = i;
        while (i < n && s[i] != '\r' && s[i] != '\n') i++;
        if (i - start + (start == bom ? bom : 0) > SSE_MAX) return 1; /* too long, even unfinished */
        if (i == n) break; /* an unfinished line is never processed */
        ref_line(&st, seen, s + start, i - start);
        if (st.too_large) return 1;
        if (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n') i++;
        i++;
    }
    return 0;
}

static int sse_run(const char *s, size_t n, const size_t *cuts, size_t ncuts, sse_seen *seen)
{
    rwp_sse p;
    size_t from = 0, k;
    int rc = 0;
    rwp_sse_init(&p, SSE_MAX);
    for (k = 0; k <= ncuts && rc == 0; k++) {
        size_t to = k < ncuts ? cuts[k] : n;
        rc = rwp_sse_feed(&p, s + from, to - from, sse_emit, seen);
        from = to;
    }
    rwp_sse_free(&p);
    FUZZ_CHECK(rc == 0 || rc == RWP_SSE_TOO_LARGE);
    return rc;
}

static sse_seen whole, chunked, bytes, reference;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static size_t cuts[1 << 16];
    const char *s = (const char *)data + 1;
    size_t n, ncuts = 0, i, at;
    unsigned seed;
    int rc_whole, rc_chunked, rc_bytes, rc_ref;
    if (size < 1 || size > (1 << 16)) return 0;
    seed = data[0];
    n = size - 1;
    for (at = (seed % 7) + 1; at < n; at += (seed % 13) + 1 + (at % 5)) cuts[ncuts++] = at;
    whole.n = chunked.n = bytes.n = reference.n = 0;
    whole.overflow = chunked.overflow = bytes.overflow = reference.overflow = 0;
    rc_whole = sse_run(s, n, NULL, 0, &whole);
    rc_chunked = sse_run(s, n, cuts, ncuts, &chunked);
    for (i = 0; i + 1 < n; i++) cuts[i] = i + 1;
    rc_bytes = sse_run(s, n, cuts, n ? n - 1 : 0, &bytes);
    rc_ref = ref_parse(s, n, &reference);
    FUZZ_CHECK(rc_whole == rc_chunked && rc_whole == rc_bytes);
    FUZZ_CHECK((rc_whole == RWP_SSE_TOO_LARGE) == (rc_ref == 1));
    FUZZ_CHECK(whole.n == chunked.n && whole.n == bytes.n);
    for (i = 0; i < whole.n; i++) {
        FUZZ_CHECK(strcmp(whole.text[i], chunked.text[i]) == 0);
        FUZZ_CHECK(strcmp(whole.text[i], bytes.text[i]) == 0);
    }
    if (rc_whole == 0) {
        FUZZ_CHECK(whole.n == reference.n);
        for (i = 0; i < whole.n; i++) FUZZ_CHECK(strcmp(whole.text[i], reference.text[i]) == 0);
    }
    return 0;
}
