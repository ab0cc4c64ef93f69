/*
 * A response's Content-Encoding undone as its body arrives: gzip and
 * deflate by zlib, br by libbrotlidec, zstd by libzstd (Debian's).
 *
 * libcurl 7.88 decodes these itself, but none of its four decoders checks
 * at the end that the compressed stream came to its end: a body cut short
 * whose Content-Length counted the bytes sent (libcurl compares it with
 * the compressed bytes, which match) came back as a success with bytes
 * missing. The libraries do the decoding; what is written here is what
 * libcurl's decoders did around them (the stacking of codings, the names,
 * the tolerances), the bounds, and knowing that each stream ended.
 *
 * Plain C, no Lua, no libcurl (response.c feeds it from the write
 * callback), so that fuzz/fuzz_decode.c can drive it.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <brotli/decode.h>
#define ZLIB_CONST /* next_in points to const bytes */
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "decode.h"

enum decode_coding { DECODE_GZIP, DECODE_DEFLATE, DECODE_BR, DECODE_ZSTD, DECODE_UNKNOWN };

static const char *const decode_names[] = { "gzip", "deflate", "br", "zstd" };

/* The most of one coding's output that waits for the next coding of a
 * stack: what a stack holds beyond its libraries' own state. */
#define DECODE_CHUNK (16 * 1024)
/* Bytes after the end of a raw deflate stream taken without complaint
 * (libcurl's tolerance: a zlib trailer a server put after raw data). */
#define DECODE_RAW_TAIL 4
/* RFC 9659: a zstd coding's window is at most 8 MiB, which decoders must
 * support and encoders must not pass; libzstd's own bound is 128 MiB of
 * memory for one response. */
#define DECODE_ZSTD_WINDOW_LOG 23
#define DECODE_NAME_MAX 32

typedef struct decode_stage {
    enum decode_coding coding;
    int started; /* its library's state exists */
    int fed;     /* it was given a byte */
    int ended;   /* its stream came to its end (a gzip member: until another starts) */
    int raw;     /* deflate without the zlib wrapper */
    unsigned tail; /* raw deflate: bytes after its end still taken */
    int in_frame;  /* zstd: a frame's magic number was taken, its frame not done */
    /* deflate: its first two bytes, taken before its form is known; zstd:
     * a frame's magic number, checked; then given to the library from
     * first_pos on */
    unsigned char first[4];
    size_t nfirst, first_pos;
    z_stream z;
    BrotliDecoderState *br;
    ZSTD_DStream *zs;
    size_t pos, len; /* its output waiting for the next coding: the decoder's bufs[k][pos..len) */
    char name[DECODE_NAME_MAX + 4]; /* a coding not known: its name as printed, "..." when cut */
} decode_stage;

struct rwd_decoder {
    /* In decoding order: stage[0] undoes the coding applied last. */
    decode_stage stage[RWD_MAX_CODINGS];
    unsigned char *bufs[RWD_MAX_CODINGS - 1];
    size_t nstages;  /* codings that change the bytes */
    size_t ncodings; /* and identity's */
    int begun, failed;
    char why[200];
};

/* d has failed: d->why, just written (`written`, snprintf's answer),
 * says why. DECODE_FAIL(d, format, ...) writes it and answers RWD_ERROR. */
static int decode_fail(rwd_decoder *d, int written)
{
    (void)written;
    d->failed = 1;
    return RWD_ERROR;
}
#define DECODE_FAIL(d, ...) decode_fail((d), snprintf((d)->why, sizeof (d)->why, __VA_ARGS__))

static const char *decode_name(const decode_stage *s)
{
    return s->coding == DECODE_UNKNOWN ? s->name : decode_names[s->coding];
}

rwd_decoder *rwd_new(void)
{
    return (rwd_decoder *)calloc(1, sizeof(rwd_decoder));
}

static void decode_stage_end(decode_stage *s)
{
    if (s->started) {
        if (s->coding == DECODE_GZIP || s->coding == DECODE_DEFLATE) (void)inflateEnd(&s->z);
        else if (s->coding == DECODE_BR) BrotliDecoderDestroyInstance(s->br);
        else if (s->coding == DECODE_ZSTD) (void)ZSTD_freeDStream(s->zs);
    }
    memset(s, 0, sizeof *s);
}

void rwd_reset(rwd_decoder *d)
{
    size_t k;
    for (k = 0; k < d->nstages; k++) decode_stage_end(&d->stage[k]);
    d->nstages = d->ncodings = 0;
    d->begun = d->failed = 0;
    d->why[0] = '\0';
}

void rwd_free(rwd_decoder *d)
{
    size_t k;
    if (!d) return;
    rwd_reset(d);
    for (k = 0; k < RWD_MAX_CODINGS - 1; k++) free(d->bufs[k]);
    free(d);
}

static int decode_lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static int decode_is(const char *name, size_t len, const char *known)
{
    size_t i;
    if (strlen(known) != len) return 0;
    for (i = 0; i < len; i++)
        if (decode_lower((unsigned char)name[i]) != known[i]) return 0;
    return 1;
}

/* libcurl's ISSPACE, which its list of codings skips */
static int decode_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* A coding not known: its name kept for the error, printable and cut. */
static void decode_keep_name(decode_stage *s, const char *name, size_t len)
{
    size_t i;
    for (i = 0; i < len && i < DECODE_NAME_MAX; i++) {
        unsigned char c = (unsigned char)name[i];
        s->name[i] = (char)(c > ' ' && c < 127 && c != '"' && c != '\\' ? c : '?');
    }
    if (len > DECODE_NAME_MAX) memcpy(s->name + DECODE_NAME_MAX, "...", 3);
}

int rwd_add(rwd_decoder *d, const char *v, size_t len)
{
    const char *p = v, *end = v + len;
    if (d->failed) return RWD_ERROR;
    if (d->begun) return DECODE_FAIL(d, "a coding was added after the body began");
    while (p < end) {
        const char *name, *name_end;
        size_t name_len;
        decode_stage *s;
        enum decode_coding coding;
        while (p < end && (decode_space(*p) || *p == ',')) p++;
        name = p;
        while (p < end && *p != ',') p++;
        for (name_end = p; name_end > name && decode_space(name_end[-1]); name_end--) {}
        name_len = (size_t)(name_end - name);
        if (name_len == 0) continue;
        if (d->ncodings == RWD_MAX_CODINGS)
            return DECODE_FAIL(d, "the response has more than %d content codings (Content-Encoding)",
                               RWD_MAX_CODINGS);
        d->ncodings++;
        if (decode_is(name, name_len, "identity") || decode_is(name, name_len, "none")) continue;
        if (decode_is(name, name_len, "gzip") || decode_is(name, name_len, "x-gzip")) coding = DECODE_GZIP;
        else if (decode_is(name, name_len, "deflate")) coding = DECODE_DEFLATE;
        else if (decode_is(name, name_len, "br")) coding = DECODE_BR;
        else if (decode_is(name, name_len, "zstd")) coding = DECODE_ZSTD;
        else coding = DECODE_UNKNOWN;
        /* The coding named last was applied last: it is undone first. */
        memmove(&d->stage[1], &d->stage[0], d->nstages * sizeof d->stage[0]);
        d->nstages++;
        s = &d->stage[0];
        memset(s, 0, sizeof *s);
        s->coding = coding;
        if (coding == DECODE_UNKNOWN) decode_keep_name(s, name, name_len);
    }
    return 0;
}

int rwd_active(const rwd_decoder *d)
{
    return d->nstages > 0;
}

const char *rwd_why(const rwd_decoder *d)
{
    return d->why[0] ? d->why : "the body could not be decoded";
}

/* What one step of a coding works on: its input and room for its output,
 * both moved on as the step takes and gives. */
typedef struct decode_io {
    const unsigned char *in;
    size_t inlen;
    unsigned char *out;
    size_t avail;
} decode_io;

/* What a zlib header (RFC 1950) must be, as inflate checks it: method 8, a
 * window of at most 32 KiB, the check bits. */
static int decode_zlib_header(unsigned char cmf, unsigned char flg)
{
    return (cmf & 0x0f) == 8 && (cmf >> 4) <= 7 && ((unsigned)cmf * 256 + flg) % 31 == 0;
}

static int decode_after_end(rwd_decoder *d, const decode_stage *s)
{
    return DECODE_FAIL(d, "the %s body has bytes after its end", decode_name(s));
}

/* gzip and deflate. */
static int decode_zlib(rwd_decoder *d, decode_stage *s, decode_io *io, int *moved)
{
    const unsigned char *from;
    size_t from_len;
    uInt in_n, out_n;
    int rc, first = 0;
    if (!s->started) {
        int bits = MAX_WBITS + 32; /* gzip, or a zlib wrapper, told by its header (as libcurl reads gzip) */
        if (s->coding == DECODE_DEFLATE) {
            /* The coding is zlib-wrapped deflate (RFC 9110 8.4.1.2), but
             * some servers send raw deflate: libcurl takes the bytes as raw
             * when they do not start with a zlib header, which the first
             * two bytes tell. */
            while (s->nfirst < 2 && io->inlen > 0) {
                s->first[s->nfirst++] = *io->in++;
                io->inlen--;
                *moved = 1;
            }
            if (s->nfirst < 2) return 0;
            s->raw = !decode_zlib_header(s->first[0], s->first[1]);
            bits = s->raw ? -MAX_WBITS : MAX_WBITS;
            s->tail = s->raw ? DECODE_RAW_TAIL : 0;
        }
        memset(&s->z, 0, sizeof s->z);
        rc = inflateInit2(&s->z, bits);
        if (rc == Z_MEM_ERROR) return RWD_NO_MEMORY;
        if (rc != Z_OK) return DECODE_FAIL(d, "zlib could not start (%d)", rc);
        s->started = 1;
        *moved = 1;
    }
    if (s->ended) {
        if (io->inlen == 0) return 0;
        if (s->coding == DECODE_GZIP) {
            /* A gzip body may be several members one after the other
             * (RFC 1952 2.2), as gzip and Go read it. */
            if (inflateReset(&s->z) != Z_OK) return DECODE_FAIL(d, "zlib could not start again");
            s->ended = 0;
        } else if (s->tail > 0) {
            size_t take = io->inlen < s->tail ? io->inlen : s->tail;
            s->tail -= (unsigned)take;
            io->in += take;
            io->inlen -= take;
            *moved = 1;
            return io->inlen > 0 ? decode_after_end(d, s) : 0;
        } else {
            return decode_after_end(d, s);
        }
    }
    if (s->first_pos < s->nfirst) {
        from = s->first + s->first_pos;
        from_len = s->nfirst - s->first_pos;
        first = 1;
    } else {
        from = io->in;
        from_len = io->inlen;
    }
    in_n = from_len > UINT_MAX ? UINT_MAX : (uInt)from_len;
    out_n = io->avail > UINT_MAX ? UINT_MAX : (uInt)io->avail;
    s->z.next_in = from;
    s->z.avail_in = in_n;
    s->z.next_out = io->out;
    s->z.avail_out = out_n;
    rc = inflate(&s->z, Z_NO_FLUSH);
    if (s->z.avail_in != in_n || s->z.avail_out != out_n) *moved = 1;
    if (first) {
        s->first_pos += in_n - s->z.avail_in;
    } else {
        io->in += in_n - s->z.avail_in;
        io->inlen -= in_n - s->z.avail_in;
    }
    io->out += out_n - s->z.avail_out;
    io->avail -= out_n - s->z.avail_out;
    switch (rc) {
    case Z_STREAM_END:
        s->ended = 1;
        *moved = 1;
        return 0;
    case Z_OK:
    case Z_BUF_ERROR: /* no room, or nothing to take: not an error */
        return 0;
    case Z_MEM_ERROR:
        return RWD_NO_MEMORY;
    case Z_NEED_DICT:
        return DECODE_FAIL(d, "the %s body needs a preset dictionary, which HTTP has no way to give", decode_name(s));
    default:
        return DECODE_FAIL(d, "the %s body is not valid %s (%s)", decode_name(s), decode_name(s),
                           s->z.msg ? s->z.msg : "corrupt data");
    }
}

static int decode_brotli(rwd_decoder *d, decode_stage *s, decode_io *io, int *moved)
{
    size_t avail_in = io->inlen, avail_out = io->avail;
    const uint8_t *next_in = io->in;
    uint8_t *next_out = io->out;
    BrotliDecoderResult r;
    if (!s->started) {
        s->br = BrotliDecoderCreateInstance(NULL, NULL, NULL);
        if (!s->br) return RWD_NO_MEMORY;
        s->started = 1;
    }
    if (s->ended) return io->inlen > 0 ? decode_after_end(d, s) : 0;
    r = BrotliDecoderDecompressStream(s->br, &avail_in, &next_in, &avail_out, &next_out, NULL);
    if (avail_in != io->inlen || avail_out != io->avail) *moved = 1;
    io->in = next_in;
    io->inlen = avail_in;
    io->out = next_out;
    io->avail = avail_out;
    switch (r) {
    case BROTLI_DECODER_RESULT_SUCCESS:
        s->ended = 1;
        *moved = 1;
        return 0;
    case BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT:
    case BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT:
        return 0;
    default: {
        BrotliDecoderErrorCode code = BrotliDecoderGetErrorCode(s->br);
        const char *what = BrotliDecoderErrorString(code);
        if (code <= BROTLI_DECODER_ERROR_ALLOC_CONTEXT_MODES && code >= BROTLI_DECODER_ERROR_ALLOC_BLOCK_TYPE_TREES)
            return RWD_NO_MEMORY;
        while (*what == '_') what++;
        return DECODE_FAIL(d, "the br body is not valid br (%s)", what);
    }
    }
}

static int decode_zstd(rwd_decoder *d, decode_stage *s, decode_io *io, int *moved)
{
    ZSTD_inBuffer in;
    ZSTD_outBuffer out;
    size_t r;
    int first = 0;
    if (!s->started) {
        s->zs = ZSTD_createDStream();
        if (!s->zs) return RWD_NO_MEMORY;
        s->started = 1;
        if (ZSTD_isError(ZSTD_DCtx_setParameter(s->zs, ZSTD_d_windowLogMax, DECODE_ZSTD_WINDOW_LOG)))
            return DECODE_FAIL(d, "libzstd refused its window bound");
    }
    if (!s->in_frame) {
        /* Frames may follow one another (RFC 8878 3): after one ends, more
         * bytes start the next. Each starts with a magic number, taken
         * here first: libzstd also decodes the formats that came before
         * RFC 8878, and tells one of those from a bad number only when it
         * has the whole number, so that a body's verdict would depend on
         * where the network cut it. */
        unsigned long magic;
        if (io->inlen == 0) return 0;
        while (s->nfirst < 4 && io->inlen > 0) {
            s->first[s->nfirst++] = *io->in++;
            io->inlen--;
            *moved = 1;
        }
        s->ended = 0;
        if (s->nfirst < 4) return 0;
        magic = s->first[0] | (unsigned long)s->first[1] << 8 | (unsigned long)s->first[2] << 16
                | (unsigned long)s->first[3] << 24;
        if (magic != ZSTD_MAGICNUMBER && (magic & ZSTD_MAGIC_SKIPPABLE_MASK) != ZSTD_MAGIC_SKIPPABLE_START)
            return DECODE_FAIL(d, "the zstd body is not valid zstd (a frame does not start with zstd's magic number)");
        s->in_frame = 1;
        s->first_pos = 0;
    }
    if (s->first_pos < s->nfirst) {
        in.src = s->first + s->first_pos;
        in.size = s->nfirst - s->first_pos;
        first = 1;
    } else {
        in.src = io->in;
        in.size = io->inlen;
    }
    in.pos = 0;
    out.dst = io->out;
    out.size = io->avail;
    out.pos = 0;
    r = ZSTD_decompressStream(s->zs, &out, &in);
    if (in.pos > 0 || out.pos > 0) *moved = 1;
    if (first) {
        s->first_pos += in.pos;
    } else {
        io->in += in.pos;
        io->inlen -= in.pos;
    }
    io->out += out.pos;
    io->avail -= out.pos;
    if (ZSTD_isError(r)) {
        ZSTD_ErrorCode code = ZSTD_getErrorCode(r);
        if (code == ZSTD_error_memory_allocation) return RWD_NO_MEMORY;
        if (code == ZSTD_error_frameParameter_windowTooLarge)
            return DECODE_FAIL(d, "the zstd body needs a window over %d MiB (RFC 9659's bound)",
                               1 << (DECODE_ZSTD_WINDOW_LOG - 20));
        return DECODE_FAIL(d, "the zstd body is not valid zstd (%s)", ZSTD_getErrorName(r));
    }
    if (r == 0) { /* the frame is whole and all of it given out */
        s->ended = 1;
        s->in_frame = 0;
        s->nfirst = s->first_pos = 0;
        *moved = 1;
    }
    return 0;
}

/* One step of stage s. *moved: it took or gave a byte, or its state went on. */
static int decode_run(rwd_decoder *d, decode_stage *s, decode_io *io, int *moved)
{
    if (io->inlen > 0) s->fed = 1;
    switch (s->coding) {
    case DECODE_GZIP:
    case DECODE_DEFLATE:
        return decode_zlib(d, s, io, moved);
    case DECODE_BR:
        return decode_brotli(d, s, io, moved);
    case DECODE_ZSTD:
        return decode_zstd(d, s, io, moved);
    default:
        /* As libcurl: refused once a byte comes, so that an empty body
         * (HEAD, 204, 304) with an odd Content-Encoding is no error. */
        if (io->inlen == 0) return 0;
        return DECODE_FAIL(d, "the response's Content-Encoding \"%s\" is not one ratewise decodes (gzip, deflate, "
                              "br, zstd; decompress = false takes the body as sent)", s->name);
    }
}

/* Fills out[0..cap) from stage k, whose input is stage k-1's waiting
 * output (refilled from it, recursively) or, for stage 0, the caller's. */
static int decode_pull(rwd_decoder *d, size_t k, const unsigned char **in, size_t *inlen, unsigned char *out,
                       size_t cap, size_t *produced)
{
    decode_stage *s = &d->stage[k], *up = k > 0 ? &d->stage[k - 1] : NULL;
    decode_io io;
    io.out = out;
    io.avail = cap;
    while (io.avail > 0) {
        size_t before;
        int rc, moved = 0;
        if (up) {
            if (up->pos == up->len) {
                size_t got = 0;
                up->pos = up->len = 0;
                rc = decode_pull(d, k - 1, in, inlen, d->bufs[k - 1], DECODE_CHUNK, &got);
                up->len = got;
                if (rc < 0) {
                    *produced = cap - io.avail;
                    return rc;
                }
            }
            io.in = d->bufs[k - 1] + up->pos;
            io.inlen = up->len - up->pos;
        } else {
            io.in = *in;
            io.inlen = *inlen;
        }
        before = io.inlen;
        rc = decode_run(d, s, &io, &moved);
        if (up) {
            up->pos += before - io.inlen;
        } else {
            *in = io.in;
            *inlen = io.inlen;
        }
        if (rc < 0) {
            *produced = cap - io.avail;
            return rc;
        }
        if (!moved) {
            /* Each library takes its input while it has room to give;
             * one that would leave bytes untaken would lose them. */
            if (io.inlen > 0) return DECODE_FAIL(d, "the %s decoder stopped taking bytes", decode_name(s));
            break;
        }
    }
    *produced = cap - io.avail;
    return io.avail == 0 ? RWD_FULL : RWD_NEED_INPUT;
}

int rwd_decode(rwd_decoder *d, const unsigned char **in, size_t *inlen, unsigned char *out, size_t cap,
               size_t *produced)
{
    size_t k;
    int rc;
    *produced = 0;
    if (d->failed) return RWD_ERROR;
    d->begun = 1;
    if (d->nstages == 0) { /* identity */
        size_t n = *inlen < cap ? *inlen : cap;
        if (n) memcpy(out, *in, n);
        *in += n;
        *inlen -= n;
        *produced = n;
        return *inlen > 0 ? RWD_FULL : RWD_NEED_INPUT;
    }
    for (k = 0; k + 1 < d->nstages; k++) {
        if (!d->bufs[k] && !(d->bufs[k] = (unsigned char *)malloc(DECODE_CHUNK))) return RWD_NO_MEMORY;
    }
    rc = decode_pull(d, d->nstages - 1, in, inlen, out, cap, produced);
    if (rc == RWD_NO_MEMORY) {
        d->failed = 1;
        (void)snprintf(d->why, sizeof d->why, "out of memory decoding the body");
    }
    return rc;
}

int rwd_finish(rwd_decoder *d)
{
    size_t k;
    if (d->failed) return 0;
    for (k = 0; k < d->nstages; k++) {
        const decode_stage *s = &d->stage[k];
        if ((s->fed && !s->ended) || s->pos < s->len) {
            (void)snprintf(d->why, sizeof d->why, "the %s body ended before its end (truncated)", decode_name(s));
            return 0;
        }
    }
    return 1;
}
