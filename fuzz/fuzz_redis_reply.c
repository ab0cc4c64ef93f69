/*
 * What src/redis.c reads from a Redis server: bytes fed to its bounded
 * RESP reader (src/redis_reader.c: hiredis's, refusing huge arrays), in
 * the chunks a socket might deliver, and each reply walked as
 * redis_push_reply walks it. A count claimed in a header is never
 * allocated beyond the bound (the first run found "*1111111111" asking
 * hiredis for 8.9 GB).
 *
 * The same bytes give the same replies however they are cut; every reply
 * is a type redis.c knows, a string reply's bytes lie within its length, an
 * array's elements are all there and nested no deeper than hiredis's
 * bound; a protocol error is sticky and never comes with a reply.
 */
#include "fuzz.h"
#include "redis_reader.h"

#define REDIS_FUZZ_MAX_REPLIES 64

static struct { size_t size, cut; } checking;

static void redis_describe(void)
{
    fprintf(stderr, "input of %zu bytes, cut at %zu\n", checking.size, checking.cut);
}

/* A digest of a reply tree (type, lengths, bytes), to compare two readings. */
static unsigned long redis_digest(const redisReply *r, int depth, unsigned long h)
{
    size_t i;
    FUZZ_CHECK(r != NULL);
    FUZZ_CHECK(depth <= 8);
    h = h * 31u + (unsigned long)r->type;
    switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        FUZZ_CHECK(r->str != NULL);
        for (i = 0; i < r->len; i++) h = h * 131u + (unsigned char)r->str[i];
        FUZZ_CHECK(r->str[r->len] == '\0');
        break;
    case REDIS_REPLY_INTEGER:
        h = h * 31u + (unsigned long)r->integer;
        break;
    case REDIS_REPLY_ARRAY:
        FUZZ_CHECK(r->elements <= RW_REDIS_MAX_ELEMENTS);
        FUZZ_CHECK(r->elements == 0 || r->element != NULL);
        for (i = 0; i < r->elements; i++) h = redis_digest(r->element[i], depth + 1, h);
        break;
    case REDIS_REPLY_NIL:
        break;
    default:
        FUZZ_CHECK(!"a reply type redis.c does not know");
    }
    return h;
}

/* Feeds data in two pieces cut at `cut`; returns how many replies came
 * (their digests in out), or -1 on a protocol error. */
static int redis_read(const uint8_t *data, size_t size, size_t cut, unsigned long *out)
{
    rw_redis_reader bounded;
    redisReader *reader;
    int n = 0, failed = 0;
    size_t piece;
    FUZZ_CHECK(rw_redis_reader_init(&bounded) == 0);
    reader = bounded.reader;
    for (piece = 0; piece < 2 && !failed; piece++) {
        const char *from = (const char *)data + (piece ? cut : 0);
        size_t len = piece ? size - cut : cut;
        if (len > 0 && redisReaderFeed(reader, from, len) != REDIS_OK) failed = 1;
        while (!failed && n < REDIS_FUZZ_MAX_REPLIES) {
            void *reply = NULL;
            if (redisReaderGetReply(reader, &reply) != REDIS_OK) {
                FUZZ_CHECK(reply == NULL);
                failed = 1;
                break;
            }
            if (!reply) break;
            out[n++] = redis_digest((const redisReply *)reply, 0, 7);
            freeReplyObject(reply);
        }
    }
    rw_redis_reader_free(&bounded);
    return failed ? -1 : n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    unsigned long whole[REDIS_FUZZ_MAX_REPLIES], cut_up[REDIS_FUZZ_MAX_REPLIES];
    int a, b, i;
    fuzz_describe = redis_describe;
    checking.size = size;
    checking.cut = size ? (size_t)data[0] % (size + 1) : 0;
    a = redis_read(data, size, size, whole);
    b = redis_read(data, size, checking.cut, cut_up);
    /* an error may show before all replies of the whole reading came, so
     * compare the replies both readings gave */
    if (a >= 0 && b >= 0) FUZZ_CHECK(a == b);
    for (i = 0; i < (a < b ? a : b); i++) FUZZ_CHECK(whole[i] == cut_up[i]);
    return 0;
}
