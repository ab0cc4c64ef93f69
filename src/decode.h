/* The decoder of a response's Content-Encoding (src/decode.c): plain C, no
 * Lua, no libcurl, so that fuzz/fuzz_decode.c can drive it. */
#ifndef RATEWISE_DECODE_H
#define RATEWISE_DECODE_H

#include <stddef.h>

/* Internal to the module whoever builds it (see ratewise.h). */
#pragma GCC visibility push(hidden)

/* The most codings one response may stack, identity counted (libcurl
 * 7.88's bound: a response with more is refused). */
#define RWD_MAX_CODINGS 5

/* What rwd_decode answers. */
#define RWD_NEED_INPUT 0 /* every byte given was taken, and nothing more comes out without more */
#define RWD_FULL 1       /* out is full: call again (more may come out with no more input) */
#define RWD_ERROR (-1)   /* the body is not what its codings say, or they are refused: rwd_why */
#define RWD_NO_MEMORY (-2)

typedef struct rwd_decoder rwd_decoder;

/* A decoder with no coding; NULL when out of memory. */
rwd_decoder *rwd_new(void);
void rwd_free(rwd_decoder *d);
/* Back to no coding, for the next response; what its codings held is
 * freed. */
void rwd_reset(rwd_decoder *d);
/* Adds the codings of one Content-Encoding field value v[0..len) (a list
 * of names separated by commas, in the order they were applied), after
 * those of the fields before it. Names are matched as libcurl matches
 * them, without regard to case: gzip (x-gzip), deflate (zlib-wrapped or
 * raw), br, zstd; identity (none) leaves the bytes as they are; any other
 * name is kept, and refused once a byte comes to be decoded by it. Answers
 * 0, or RWD_ERROR past RWD_MAX_CODINGS. */
int rwd_add(rwd_decoder *d, const char *v, size_t len);
/* Whether a coding was added that changes the bytes (not identity alone). */
int rwd_active(const rwd_decoder *d);
/* Decodes bytes taken from *in (which moves on, *inlen going down) into
 * out[0..cap), cap > 0, *produced saying how many came out. Never writes
 * past cap, and keeps no more than a few buffers of its own whatever the
 * body expands to: the caller bounds the output. */
int rwd_decode(rwd_decoder *d, const unsigned char **in, size_t *inlen, unsigned char *out, size_t cap,
               size_t *produced);
/* After the body's last byte, once rwd_decode answered RWD_NEED_INPUT:
 * 1 when every coding that was given bytes came to its end; else 0, and
 * rwd_why names the first that did not (the body was cut short). */
int rwd_finish(rwd_decoder *d);
/* Why the last RWD_ERROR or rwd_finish's 0 (a sentence, no secrets: the
 * names come from the response). */
const char *rwd_why(const rwd_decoder *d);

#pragma GCC visibility pop

#endif
