/* The bounded RESP reader of src/redis.c (src/redis_reader.c). */
#ifndef RATEWISE_REDIS_READER_H
#define RATEWISE_REDIS_READER_H

#include <hiredis/hiredis.h>

/* Internal to the module whoever builds it (see ratewise.h). */
#pragma GCC visibility push(hidden)

/* The most elements one array of a reply may have, and the most bytes
 * buffered for one reply: a bucket's replies are a few integers. */
#define RW_REDIS_MAX_ELEMENTS 1024
#define RW_REDIS_MAX_REPLY_BYTES (1024 * 1024)

typedef struct rw_redis_reader {
    redisReader *reader;
    redisReplyObjectFunctions fns; /* hiredis's, with createArray bounded */
    void *(*create_array)(const redisReadTask *, int); /* hiredis's own */
} rw_redis_reader;

/* 0, or -1 when out of memory. The struct must not move afterwards (the
 * reader points into it). */
int rw_redis_reader_init(rw_redis_reader *r);
void rw_redis_reader_free(rw_redis_reader *r);

#pragma GCC visibility pop

#endif
