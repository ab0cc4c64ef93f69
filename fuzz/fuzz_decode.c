/*
 * rwd_decode (src/decode.c): a response body undone from its codings.
 *
 * The input's first byte picks what is checked, its second seeds how the
 * body is cut into pieces and how much room each call gets; the rest is
 * the body. Two kinds of input:
 *
 *   - even first byte: the rest is a plain text, which the target
 *     compresses itself (zlib, libbrotlienc, libzstd) with one of a set of
 *     stacks of codings. Decoded, it comes back exactly, and every coding
 *     ended (rwd_finish); every strict prefix of the compressed body (a
 *     body cut short) is an error or does not finish, and what it gives is
 *     a prefix of the text;
 *   - odd first byte: the rest is a Content-Encoding value (up to a line
 *     feed) and a body, both as a hostile server would send them.
 *
 * For both: the answer does not depend on the cutting (whole, or in seeded
 * pieces with seeded room, down to a byte at a time): the same bytes come
 * out and the same verdict; every output buffer is exactly its size, so
 * that AddressSanitizer reports a byte written past the room given; a call
 * answering RWD_FULL filled its room, one answering RWD_NEED_INPUT took
 * every byte; and no more than the target's bound comes out (a bomb is cut
 * there, as max_body cuts it).
 */
#include <brotli/encode.h>
#include <zlib.h>
#include <zstd.h>

#include "decode.h"
#include "fuzz.h"

/* The most decoded bytes a run takes, as max_body would. */
#define DEC_LIMIT (256 * 1024)

typedef struct dec_rng {
    uint32_t s;
} dec_rng;

static uint32_t dec_next(dec_rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 17;
    r->s ^= r->s << 5;
    return r->s;
}

/* What one run of the decoder over a body gave. */
typedef struct dec_run {
    unsigned char *out;
    size_t len, cap;
    int error;   /* RWD_ERROR or RWD_NO_MEMORY came */
    int capped;  /* stopped at DEC_LIMIT */
    int finished; /* rwd_finish said every coding ended (no error) */
} dec_run;

/* Decodes body[0..n) with the codings of header[0..hlen): whole with
 * rng NULL, else in pieces and with room drawn from rng. */
static void dec_decode(const char *header, size_t hlen, const unsigned char *body, size_t n, dec_rng *rng,
                       dec_run *run)
{
    rwd_decoder *d = rwd_new();
    size_t at = 0;
    int rc = RWD_NEED_INPUT, last = 0;
    FUZZ_CHECK(d != NULL);
    memset(run, 0, sizeof *run);
    if (rwd_add(d, header, hlen) != 0) {
        run->error = 1;
        rwd_free(d);
        return;
    }
    while (!last) {
        size_t piece = n - at;
        const unsigned char *in;
        size_t inlen;
        if (rng && piece > 0) piece = 1 + dec_next(rng) % (piece < 64 ? piece : 64);
        last = at + piece == n; /* the body's last piece (or none): then drained */
        in = body + at;
        inlen = piece;
        do {
            size_t cap = rng ? 1 + dec_next(rng) % 300 : 65536, made = 0, took;
            unsigned char *room;
            const unsigned char *before = in;
            if (cap > DEC_LIMIT + 1 - run->len) cap = DEC_LIMIT + 1 - run->len;
            room = (unsigned char *)malloc(cap); /* exactly cap: a byte past it is reported */
            FUZZ_CHECK(room != NULL);
            rc = rwd_decode(d, &in, &inlen, room, cap, &made);
            took = (size_t)(in - before);
            FUZZ_CHECK(made <= cap && took <= piece);
            if (rc == RWD_FULL) FUZZ_CHECK(made == cap);
            if (rc == RWD_NEED_INPUT) FUZZ_CHECK(inlen == 0);
            if (made > DEC_LIMIT - run->len) {
                run->capped = 1;
                made = DEC_LIMIT - run->len;
            }
            if (run->len + made > run->cap) {
                while (run->cap < run->len + made) run->cap = run->cap ? run->cap * 2 : 4096;
                run->out = (unsigned char *)realloc(run->out, run->cap);
                FUZZ_CHECK(run->out != NULL);
            }
            if (made) memcpy(run->out + run->len, room, made);
            run->len += made;
            free(room);
            if (rc < 0) run->error = 1;
        } while (rc == RWD_FULL && !run->capped);
        if (run->error || run->capped) break;
        at += piece;
    }
    if (!run->error && !run->capped) {
        run->finished = rwd_finish(d);
        if (!run->finished) FUZZ_CHECK(strstr(rwd_why(d), "ended before its end") != NULL);
    }
    rwd_free(d);
}

static int dec_prefix(const dec_run *a, const dec_run *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    return n == 0 || memcmp(a->out, b->out, n) == 0;
}

/* Whole, then in seeded pieces: the same bytes and the same verdict. */
static void dec_check_cutting(const char *header, size_t hlen, const unsigned char *body, size_t n, uint32_t seed,
                              dec_run *whole)
{
    dec_run pieces;
    dec_rng rng;
    rng.s = seed | 1;
    dec_decode(header, hlen, body, n, NULL, whole);
    dec_decode(header, hlen, body, n, &rng, &pieces);
    if (!whole->capped && !pieces.capped) {
        FUZZ_CHECK(whole->error == pieces.error);
        if (whole->error) {
            /* a library may give out more or less of what came before the
             * fault, depending on the cutting: never anything else */
            FUZZ_CHECK(dec_prefix(whole, &pieces));
        } else {
            FUZZ_CHECK(whole->len == pieces.len && dec_prefix(whole, &pieces));
            FUZZ_CHECK(whole->finished == pieces.finished);
        }
    } else {
        FUZZ_CHECK(dec_prefix(whole, &pieces));
    }
    free(pieces.out);
}

/* ---- compressing, for the round trip ---- */

enum dec_coding { C_GZIP, C_ZLIB, C_RAW, C_BR, C_ZSTD };

static unsigned char *dec_zlib(const unsigned char *p, size_t n, int bits, int level, size_t *out_len)
{
    z_stream z;
    uLong bound;
    unsigned char *out;
    memset(&z, 0, sizeof z);
    FUZZ_CHECK(deflateInit2(&z, level, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    bound = deflateBound(&z, (uLong)n) + 32;
    out = (unsigned char *)malloc(bound);
    FUZZ_CHECK(out != NULL);
    z.next_in = (Bytef *)(uintptr_t)p;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)bound;
    FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    *out_len = bound - z.avail_out;
    deflateEnd(&z);
    return out;
}

static unsigned char *dec_compress(enum dec_coding c, const unsigned char *p, size_t n, int level, size_t *out_len)
{
    unsigned char *out;
    size_t bound;
    switch (c) {
    case C_GZIP:
        return dec_zlib(p, n, MAX_WBITS + 16, 1 + level % 9, out_len);
    case C_ZLIB:
        return dec_zlib(p, n, MAX_WBITS, 1 + level % 9, out_len);
    case C_RAW:
        return dec_zlib(p, n, -MAX_WBITS, 1 + level % 9, out_len);
    case C_BR:
        bound = BrotliEncoderMaxCompressedSize(n) + 16;
        out = (unsigned char *)malloc(bound);
        FUZZ_CHECK(out != NULL);
        *out_len = bound;
        FUZZ_CHECK(BrotliEncoderCompress(level % 3, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, n, p, out_len, out));
        return out;
    default:
        bound = ZSTD_compressBound(n);
        out = (unsigned char *)malloc(bound);
        FUZZ_CHECK(out != NULL);
        *out_len = ZSTD_compress(out, bound, p, n, 1 + level % 3);
        FUZZ_CHECK(!ZSTD_isError(*out_len));
        return out;
    }
}

/* The stacks tried, in the order the codings are applied, and what
 * Content-Encoding says of each. */
static const struct {
    int n;
    enum dec_coding c[3];
    const char *header;
} dec_stacks[] = {
    { 1, { C_GZIP }, "gzip" },
    { 1, { C_ZLIB }, "deflate" },
    { 1, { C_RAW }, "Deflate" },
    { 1, { C_BR }, "br" },
    { 1, { C_ZSTD }, " zstd " },
    { 2, { C_GZIP, C_BR }, "gzip, br" },
    { 2, { C_ZSTD, C_RAW }, "zstd,,deflate" },
    { 3, { C_GZIP, C_ZSTD, C_GZIP }, "x-gzip, identity, zstd, gzip" },
};

static void dec_round_trip(uint8_t pick, uint8_t seed, const unsigned char *text, size_t n)
{
    size_t which = (size_t)(pick >> 1) % (sizeof dec_stacks / sizeof dec_stacks[0]);
    const char *header = dec_stacks[which].header;
    unsigned char *body = NULL;
    size_t len = n, cut;
    dec_run whole;
    dec_rng rng;
    int i;
    for (i = 0; i < dec_stacks[which].n; i++) {
        unsigned char *next = dec_compress(dec_stacks[which].c[i], body ? body : text, len, seed + i, &len);
        free(body);
        body = next;
    }
    dec_check_cutting(header, strlen(header), body, len, (uint32_t)seed * 2654435761u + n, &whole);
    FUZZ_CHECK(!whole.error && !whole.capped && whole.finished);
    FUZZ_CHECK(whole.len == n && (n == 0 || memcmp(whole.out, text, n) == 0));
    free(whole.out);
    /* Cut short: never a whole body. */
    rng.s = (uint32_t)seed * 40503u + 7u;
    for (i = 0; i < 3 && len > 1; i++) {
        dec_run part;
        cut = i == 0 ? len - 1 : 1 + dec_next(&rng) % (len - 1);
        dec_decode(header, strlen(header), body, cut, i == 2 ? &rng : NULL, &part);
        FUZZ_CHECK(part.error || !part.finished);
        FUZZ_CHECK(part.len <= n && (part.len == 0 || memcmp(part.out, text, part.len) == 0));
        free(part.out);
    }
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const unsigned char *rest;
    size_t n;
    if (size < 2) return 0;
    rest = data + 2;
    n = size - 2;
    if ((data[0] & 1) == 0) {
        dec_round_trip(data[0], data[1], rest, n);
    } else {
        const unsigned char *nl = (const unsigned char *)memchr(rest, '\n', n < 64 ? n : 64);
        size_t hlen = nl ? (size_t)(nl - rest) : 0;
        const unsigned char *body = nl ? nl + 1 : rest;
        char *header = fuzz_exact_copy(rest, hlen);
        dec_run whole;
        dec_check_cutting(header, hlen, body, n - (size_t)(body - rest), data[1], &whole);
        free(whole.out);
        free(header);
    }
    return 0;
}
