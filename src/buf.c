/*
 * The growable byte buffers of a transfer (engine_buf): its response's
 * head and body, its request's header lines, URL and option signatures.
 */
#include <stdlib.h>

#include "transfer.h"

int rw_buf_grow(engine_buf *b, size_t need)
{
    size_t cap = b->cap ? b->cap : 256;
    char *data;
    if (need <= b->cap) return 1;
    while (cap < need) cap = cap > (size_t)-1 / 2 ? need : cap * 2;
    data = (char *)realloc(b->data, cap);
    if (!data) return 0;
    b->data = data;
    b->cap = cap;
    return 1;
}

void rw_buf_free(engine_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
