/*
 * The RESP reader of src/redis.c: hiredis's, with bounds of our own.
 * Plain C, no Lua, so that fuzz/fuzz_redis_reply.c reads exactly as
 * redis.c does.
 *
 * hiredis 0.14 (Debian 12's) allocates an array as soon as its header
 * arrives: "*1111111111\r\n" from a broken or hostile server asked for
 * 8.9 GB (found by the fuzzer). A bucket's replies are a few integers or
 * a short string, so an array of more than RW_REDIS_MAX_ELEMENTS elements
 * is refused before anything is allocated, and redis.c caps what it
 * buffers for one reply (RW_REDIS_MAX_REPLY_BYTES).
 */
/* Built without hiredis (`make REDIS=0`): nothing here, and core.redis_connect
 * is absent. */
#ifndef RW_NO_REDIS
#include <stddef.h>

#include "redis_reader.h"

static void *redis_reader_create_array(const redisReadTask *task, int elements)
{
    const rw_redis_reader *r = (const rw_redis_reader *)task->privdata;
    if (elements < 0 || elements > RW_REDIS_MAX_ELEMENTS) return NULL; /* hiredis reports it as an error */
    return r->create_array(task, elements);
}

int rw_redis_reader_init(rw_redis_reader *r)
{
    r->reader = redisReaderCreate();
    if (!r->reader) return -1;
    r->fns = *r->reader->fn;
    r->create_array = r->fns.createArray;
    r->fns.createArray = redis_reader_create_array;
    r->reader->fn = &r->fns;
    r->reader->privdata = r;
    return 0;
}

void rw_redis_reader_free(rw_redis_reader *r)
{
    if (r->reader) redisReaderFree(r->reader);
    r->reader = NULL;
}

#endif /* RW_NO_REDIS */
