/*
 * rwp_header_next: the fields of a stored header block (status line, field
 * lines, obs-fold continuations, blank line; trailers alike), one per call.
 *
 * Every call that reports a line moves *pos forward, within the block, and
 * the end comes after at most one call per line, with *pos at the end.
 * Every span lies within the block; a name is non-empty and holds no SP,
 * HTAB, ':', CR, LF or NUL; a value holds no CR, LF or NUL and neither
 * starts nor ends with SP or HTAB; a continuation has no name and a
 * non-empty value, and never comes first. The answer is exactly what a
 * reference splitter written from the contract in src/ratewise.h gives (the
 * same spans), and the same fields (the same bytes) with every bare LF made
 * CRLF: line ends do not change what the fields are.
 */
#include "fuzz.h"

typedef struct fuzz_field {
    const char *name, *value;
    size_t name_len, value_len;
    int continuation;
} fuzz_field;

static struct { size_t size, index, got, want; } checking;

static void headers_describe(void)
{
    fprintf(stderr, "block of %zu bytes: field %zu, %zu reported, %zu expected\n",
            checking.size, checking.index, checking.got, checking.want);
}

/* Every field rwp_header_next reports, with the properties of each call
 * checked; returns how many (at most max). */
static size_t headers_iterate(const char *block, size_t len, fuzz_field *out, size_t max)
{
    size_t pos = 0, n = 0, calls = 0;
    rwp_header_field f;
    for (;;) {
        size_t before = pos;
        int more;
        memset(&f, 0xA5, sizeof f); /* garbage in what a call does not set */
        more = rwp_header_next(block, len, &pos, &f);
        FUZZ_CHECK(more == 0 || more == 1);
        FUZZ_CHECK(++calls <= max + 1);
        if (!more) {
            FUZZ_CHECK(pos == len);
            return n;
        }
        FUZZ_CHECK(pos > before && pos <= len);
        FUZZ_CHECK(f.continuation == 0 || f.continuation == 1);
        FUZZ_CHECK(f.value >= block + before && f.value_len <= len && f.value + f.value_len <= block + pos);
        FUZZ_CHECK(!memchr(f.value, '\r', f.value_len) && !memchr(f.value, '\n', f.value_len)
                   && !memchr(f.value, '\0', f.value_len));
        if (f.value_len > 0) FUZZ_CHECK(!fuzz_is_ows(f.value[0]) && !fuzz_is_ows(f.value[f.value_len - 1]));
        if (f.continuation) {
            FUZZ_CHECK(f.name == NULL && f.name_len == 0);
            FUZZ_CHECK(f.value_len > 0);
            FUZZ_CHECK(n > 0); /* something to continue */
        } else {
            size_t i;
            FUZZ_CHECK(f.name != NULL && f.name >= block + before && f.name_len > 0);
            FUZZ_CHECK(f.name + f.name_len < f.value); /* the colon between */
            for (i = 0; i < f.name_len; i++) {
                char c = f.name[i];
                FUZZ_CHECK(c != ' ' && c != '\t' && c != ':' && c != '\r' && c != '\n' && c != '\0');
            }
        }
        FUZZ_CHECK(n < max);
        out[n].name = f.name;
        out[n].name_len = f.name_len;
        out[n].value = f.value;
        out[n].value_len = f.value_len;
        out[n].continuation = f.continuation;
        n++;
    }
}

/* The contract of src/ratewise.h, line by line. */
static size_t headers_reference(const char *block, size_t len, fuzz_field *out)
{
    size_t start = 0, n = 0;
    int field_above = 0; /* a reported field that a continuation continues */
    while (start < len) {
        size_t end = start, i, colon;
        const char *line = block + start, *v;
        size_t line_len, vlen;
        int bad = 0;
        while (end < len && block[end] != '\n') end++;
        line_len = end - start;
        start = end < len ? end + 1 : len;
        if (line_len > 0 && line[line_len - 1] == '\r') line_len--;
        for (i = 0; i < line_len; i++)
            if (line[i] == '\r' || line[i] == '\0') bad = 1;
        if (line_len == 0 || bad || (line_len >= 5 && memcmp(line, "HTTP/", 5) == 0)) {
            field_above = 0;
            continue;
        }
        if (fuzz_is_ows(line[0])) {
            v = line;
            vlen = line_len;
            fuzz_trim(&v, &vlen);
            if (field_above && vlen > 0) {
                out[n].name = NULL;
                out[n].name_len = 0;
                out[n].value = v;
                out[n].value_len = vlen;
                out[n].continuation = 1;
                n++;
            }
            continue;
        }
        for (colon = 0; colon < line_len && line[colon] != ':'; colon++) {}
        for (i = 0; i < colon; i++)
            if (fuzz_is_ows(line[i])) bad = 1;
        if (colon == line_len || colon == 0 || bad) {
            field_above = 0;
            continue;
        }
        v = line + colon + 1;
        vlen = line_len - colon - 1;
        fuzz_trim(&v, &vlen);
        out[n].name = line;
        out[n].name_len = colon;
        out[n].value = v;
        out[n].value_len = vlen;
        out[n].continuation = 0;
        n++;
        field_above = 1;
    }
    return n;
}

static int headers_same_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_exact_copy(data, size), *crlf;
    size_t lines = 1, i, j, n, nref, ncrlf, crlf_len = size;
    fuzz_field *got, *want, *other;
    fuzz_describe = headers_describe;
    checking.size = size;

    for (i = 0; i < size; i++) {
        if (s[i] != '\n') continue;
        lines++;
        if (i == 0 || s[i - 1] != '\r') crlf_len++;
    }
    got = (fuzz_field *)calloc(lines, sizeof *got);
    want = (fuzz_field *)calloc(lines, sizeof *want);
    other = (fuzz_field *)calloc(lines, sizeof *other);
    crlf = (char *)malloc(crlf_len ? crlf_len : 1);
    if (!got || !want || !other || !crlf) abort();

    n = headers_iterate(s, size, got, lines);
    nref = headers_reference(s, size, want);
    checking.got = n;
    checking.want = nref;
    FUZZ_CHECK(n == nref);
    for (i = 0; i < n; i++) {
        checking.index = i;
        FUZZ_CHECK(got[i].continuation == want[i].continuation);
        FUZZ_CHECK(got[i].name == want[i].name && got[i].name_len == want[i].name_len);
        FUZZ_CHECK(got[i].value == want[i].value && got[i].value_len == want[i].value_len);
    }

    /* CRLF for every bare LF: the same fields, byte for byte. */
    for (i = 0, j = 0; i < size; i++) {
        if (s[i] == '\n' && (i == 0 || s[i - 1] != '\r')) crlf[j++] = '\r';
        crlf[j++] = s[i];
    }
    FUZZ_CHECK(j == crlf_len);
    ncrlf = headers_iterate(crlf, crlf_len, other, lines);
    checking.want = ncrlf;
    FUZZ_CHECK(ncrlf == n);
    for (i = 0; i < n; i++) {
        checking.index = i;
        FUZZ_CHECK(got[i].continuation == other[i].continuation);
        FUZZ_CHECK(headers_same_bytes(got[i].name, got[i].name_len, other[i].name, other[i].name_len));
        FUZZ_CHECK(headers_same_bytes(got[i].value, got[i].value_len, other[i].value, other[i].value_len));
    }

    free(crlf);
    free(other);
    free(want);
    free(got);
    free(s);
    return 0;
}
