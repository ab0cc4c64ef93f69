/*
 * What libcurl delivers, turned into what Lua sees. The write and header
 * callbacks only append to the transfer's C buffers (no Lua, nothing that
 * can raise); transfer:result() then builds the response table, its
 * headers (split by rwp_header_next in parse.c), header lists and trailers,
 * or the error table that says what failed and whether a retry may help.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transfer.h"

static int response_buf_append(engine_buf *b, const char *p, size_t n)
{
    if (n > (size_t)-1 - b->len - 1) return 0;
    if (!rw_buf_grow(b, b->len + n + 1)) return 0;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 1;
}

/* The largest body buffer made at once from a Content-Length: a server
 * that announces more and sends less gets no more memory than that; a body
 * that is larger grows the buffer as it comes. */
#define RESPONSE_RESERVE_MAX ((curl_off_t)8 * 1024 * 1024)

/* The first bytes of a body whose length the server announced: the
 * buffer is made that size (and the byte after it) at once, instead of
 * doubling its way there with a copy each time. A body that decodes to
 * more (Content-Encoding) grows from there. */
static void response_reserve(transfer *t)
{
    curl_off_t length = -1;
    size_t want;
    char *data;
    if (curl_easy_getinfo(t->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) != CURLE_OK || length <= 0)
        return;
    if (length > RESPONSE_RESERVE_MAX) length = RESPONSE_RESERVE_MAX;
    want = (size_t)length + 1;
    if (want > t->max_body) want = t->max_body + 1;
    if (want <= t->body.cap) return;
    data = (char *)realloc(t->body.data, want);
    if (!data) return; /* the append below grows it, or says out of memory */
    t->body.data = data;
    t->body.cap = want;
}

/* The body of a response with a Content-Encoding, at its first byte: the
 * decoder takes the codings of the header block's Content-Encoding fields,
 * in order (a folded line as more of its field's list). 0: refused (too
 * many codings) or out of memory. */
static int response_decode_start(transfer *t)
{
    rwp_header_field f;
    size_t pos = 0;
    int in_field = 0;
    if (!t->decoder && (t->decoder = rwd_new()) == NULL) {
        t->out_of_memory = 1;
        return 0;
    }
    rwd_reset(t->decoder);
    while (rwp_header_next(t->head.data, t->head_end, &pos, &f)) {
        if (!f.continuation) in_field = f.name_len == 16 && strncasecmp(f.name, "content-encoding", 16) == 0;
        if (in_field && rwd_add(t->decoder, f.value, f.value_len) != 0) {
            t->decode_failed = 1;
            return 0;
        }
    }
    t->decoding = rwd_active(t->decoder) ? DECODING_ON : DECODING_OFF;
    return 1;
}

/* The most decoded bytes made at once: a stream's buffer passes
 * ENGINE_STREAM_BUFFER by no more than this. */
#define RESPONSE_DECODE_STEP (16 * 1024)

/* The write callback's work for a body that is decoded: the decoded bytes
 * go to the body buffer, a step at a time, each step with room for the
 * byte past max_body that tells a body over it, so that a small body that
 * expands without end (a compression bomb) ends at max_body, nothing past
 * it made. A stream's reader that is behind pauses the transfer in the
 * middle of a chunk: libcurl hands the whole chunk over again, and the
 * bytes the decoder took already are passed over then. */
static size_t response_decode(transfer *t, const char *ptr, size_t n)
{
    const unsigned char *in = (const unsigned char *)ptr;
    size_t left = n, gave = 0;
    int rc = RWD_FULL;
    if (n == 0) return 0;
    /* A chunk handed over again after a pause: the bytes the decoder took
     * already are passed over (decode_taken keeps those past this chunk,
     * were libcurl to hand it over in shorter pieces). */
    if (t->decode_taken > 0) {
        size_t skip = t->decode_taken < n ? t->decode_taken : n;
        in += skip;
        left -= skip;
        t->decode_taken -= skip;
    }
    if (t->body.len == 0 && !t->stream) response_reserve(t);
    while (rc == RWD_FULL) {
        size_t have = t->body.len + (t->stream ? t->delivered : 0), room, made = 0;
        if (t->stream && t->body.len >= ENGINE_STREAM_BUFFER) {
            t->decode_taken += n - left;
            t->paused = 1;
            if (gave > 0) {
                if (t->idle_timeout > 0) t->last_byte = rw_core_monotonic();
                rw_transfer_progress(t);
            }
            return CURL_WRITEFUNC_PAUSE;
        }
        room = t->max_body - have < RESPONSE_DECODE_STEP ? t->max_body - have + 1 : RESPONSE_DECODE_STEP;
        if (t->body.cap - t->body.len < room && !rw_buf_grow(&t->body, t->body.len + room)) {
            t->out_of_memory = 1;
            return 0;
        }
        rc = rwd_decode(t->decoder, &in, &left, (unsigned char *)t->body.data + t->body.len, room, &made);
        t->body.len += made;
        gave += made;
        if (made > t->max_body - have) {
            t->body_too_large = 1;
            return 0;
        }
        if (rc == RWD_NO_MEMORY) {
            t->out_of_memory = 1;
            return 0;
        }
        if (rc == RWD_ERROR) {
            t->decode_failed = 1;
            return 0;
        }
    }
    if (t->idle_timeout > 0) t->last_byte = rw_core_monotonic();
    if (t->stream && gave > 0) rw_transfer_progress(t);
    return n;
}

CURLcode rw_response_end(transfer *t, CURLcode code)
{
    if (t->decode_failed) {
        rw_transfer_why(t, "%s", rwd_why(t->decoder));
        return CURLE_BAD_CONTENT_ENCODING;
    }
    if (code == CURLE_OK && t->decoding == DECODING_ON && !rwd_finish(t->decoder)) {
        /* libcurl checked the length it was told against the bytes that
         * came, which are the compressed ones: only the decoder can tell
         * that they stop short. A body cut short, as libcurl says of one
         * shorter than its Content-Length (retried when replay-safe). */
        rw_transfer_why(t, "%s", rwd_why(t->decoder));
        return CURLE_PARTIAL_FILE;
    }
    return code;
}

void rw_response_drop_body(transfer *t) { t->body.len = 0; }

void rw_response_no_memory(transfer *t) { t->out_of_memory = 1; }

int rw_response_read(lua_State *L, transfer *t, int running)
{
    lua_pushlstring(L, t->body.data, t->body.len);
    t->delivered += t->body.len;
    t->body.len = 0;
    if (!t->paused || !running) return 0;
    t->paused = 0;
    t->last_byte = rw_core_monotonic(); /* the server was not idle: the reader was behind */
    return 1;
}

void rw_response_clear(transfer *t, size_t keep_head)
{
    if (t->head.cap > keep_head) rw_buf_free(&t->head);
    t->body.len = t->head.len = t->head_end = 0;
    t->headers_done = t->body_too_large = t->headers_too_large = t->out_of_memory = 0;
    t->head_ready = t->paused = 0;
    t->delivered = t->skipped = 0;
    t->encoded = t->decoding = t->decode_failed = 0;
    t->decode_taken = 0;
    if (t->decoder) rwd_reset(t->decoder); /* what a coding holds (a window of MiBs) is not kept */
    t->last_byte = 0;
}

void rw_response_keep_body(transfer *t, size_t keep)
{
    if (t->body.cap > keep) rw_buf_free(&t->body);
}

void rw_response_free(transfer *t)
{
    rw_buf_free(&t->body);
    rw_buf_free(&t->head);
    rwd_free(t->decoder);
    t->decoder = NULL;
}

size_t rw_response_on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    transfer *t = (transfer *)ud;
    size_t n = size * nmemb;
    size_t have;
    rw_engine_delivered(t);
    if (t->stream && !t->head_ready) {
        /* A redirect's body, which rw_redirect_follow would drop: not kept at
         * all, but counted, as what is read whole (a redirect that never
         * ends its body is cut at the limit, not read for ever). */
        size_t limit = t->max_body == (size_t)-1 ? (size_t)ENGINE_DEFAULT_MAX_BODY : t->max_body;
        if (n > limit || t->skipped > limit - n) {
            t->body_too_large = 1;
            return 0;
        }
        t->skipped += n;
        return n;
    }
    if (t->encoded && t->decompress) {
        if (t->decoding == DECODING_UNKNOWN && !response_decode_start(t)) return 0;
        if (t->decoding == DECODING_ON) return response_decode(t, ptr, n);
    }
    /* A stream's limit counts what Lua has read too. */
    have = t->body.len + (t->stream ? t->delivered : 0);
    if (have < t->body.len || n > t->max_body || have > t->max_body - n) {
        t->body_too_large = 1;
        return 0; /* aborts the transfer: nothing is buffered past the limit */
    }
    if (t->stream && t->body.len >= ENGINE_STREAM_BUFFER) {
        /* The reader is behind: libcurl keeps this chunk and hands it over
         * again once transfer:read() has taken the buffer and resumed. */
        t->paused = 1;
        return CURL_WRITEFUNC_PAUSE;
    }
    if (t->body.len == 0 && !t->stream) response_reserve(t);
    if (!response_buf_append(&t->body, ptr, n)) {
        t->out_of_memory = 1;
        return 0;
    }
    if (t->idle_timeout > 0) t->last_byte = rw_core_monotonic();
    if (t->stream) rw_transfer_progress(t);
    return n;
}

/* Whether the header block just ended (head[0..head_end)) names a
 * Location, as libcurl reads it: the first such field, not empty. */
static int response_has_location(const transfer *t)
{
    rwp_header_field f;
    size_t pos = 0;
    while (rwp_header_next(t->head.data, t->head_end, &pos, &f)) {
        if (!f.continuation && f.name_len == 8 && strncasecmp(f.name, "location", 8) == 0) return f.value_len > 0;
    }
    return 0;
}

/* Whether the header block just ended is the final response's: not a 1xx,
 * and not a redirect that the engine will follow (rw_redirect_follow). libcurl
 * sets CURLINFO_REDIRECT_URL only once the hop's body is done, too late to
 * ask here: a redirect status with a Location is a hop (rw_redirect_follow then
 * follows it, or ends the transfer saying why it does not). */
static int response_is_final(transfer *t, long status)
{
    if (status < 200) return 0;
    if (t->follow && (status == 301 || status == 302 || status == 303 || status == 307 || status == 308))
        return !response_has_location(t);
    return 1;
}

size_t rw_response_on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
    transfer *t = (transfer *)ud;
    size_t n = size * nmemb;
    rw_engine_delivered(t);
    /* Each response (interim 1xx, every redirect hop) starts with its status
     * line; keep only the headers of the last one. */
    if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0) {
        t->head.len = 0;
        t->head_end = 0;
        t->headers_done = 0;
        t->encoded = 0;
        t->decoding = DECODING_UNKNOWN;
        t->decode_taken = 0;
    } else if (!t->headers_done && n > 16 && transfer_lower((unsigned char)ptr[0]) == 'c'
               && strncasecmp(ptr, "content-encoding", 16) == 0) {
        t->encoded = 1; /* the field is read from the block at the body's first byte */
    }
    if (t->head.len + n > ENGINE_MAX_HEADER_BYTES) {
        t->headers_too_large = 1;
        return 0;
    }
    if (!response_buf_append(&t->head, ptr, n)) {
        t->out_of_memory = 1;
        return 0;
    }
    /* libcurl hands a chunked body's trailer lines over after the body, as
     * more header lines: what follows the blank line is kept apart, so that
     * a trailer cannot pass for a header (a Retry-After steering a wait). */
    if ((n == 2 && ptr[0] == '\r') || (n == 1 && ptr[0] == '\n')) {
        if (!t->headers_done) {
            long status = 0;
            t->head_end = t->head.len;
            curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
            if (!t->head_ready && response_is_final(t, status)) {
                int streamed = t->stream;
                t->head_ready = 1;
                /* Only a 2xx is streamed. */
                if (t->stream && (status < 200 || status > 299)) rw_request_read_whole(t);
                if (t->idle_timeout > 0) t->last_byte = rw_core_monotonic();
                if (streamed || t->idle_timeout > 0) rw_transfer_progress(t);
            }
            /* The probed origin has answered, if only with a redirect: its
             * protocol is known. */
            if (status >= 200 && t->gate_probe) rw_gate_answered(t);
        }
        t->headers_done = 1;
    }
    return n;
}

/* Pushes the field name name[0..n) lower-cased. */
static void response_push_name(lua_State *L, const char *name, size_t n)
{
    char small[128]; /* field names are short: lower-cased on the C stack */
    luaL_Buffer big;
    char *dst = small;
    size_t i;
    if (n > sizeof small) {
        luaL_buffinit(L, &big);
        dst = luaL_prepbuffsize(&big, n);
    }
    for (i = 0; i < n; i++) dst[i] = (char)transfer_lower((unsigned char)name[i]);
    if (dst == small) {
        lua_pushlstring(L, small, n);
    } else {
        luaL_addsize(&big, n);
        luaL_pushresult(&big);
    }
}

/* Sets fields[name] = value for the first field of a name. A repeated one
 * goes to lists[name] = {v1, v2, ...} instead, the lists table replacing
 * the nil at index lists at the first repeat: joining there and then,
 * value by value, would copy the joined value once per repeat, which is
 * quadratic. Expects name and value on the stack; pops both. */
static void response_add_field(lua_State *L, int fields, int lists)
{
    if (lua_type(L, lists) == LUA_TTABLE) {
        lua_pushvalue(L, -2);
        if (lua_rawget(L, lists) == LUA_TTABLE) { /* name, value, list */
            lua_insert(L, -2);
            lua_rawseti(L, -2, (lua_Integer)lua_rawlen(L, -2) + 1);
            lua_pop(L, 2);
            return;
        }
        lua_pop(L, 1);
    }
    lua_pushvalue(L, -2);
    if (lua_rawget(L, fields) == LUA_TNIL) {
        lua_pop(L, 1);
        lua_rawset(L, fields);
        return;
    }
    if (lua_type(L, lists) != LUA_TTABLE) { /* the block's first repeat */
        lua_createtable(L, 0, 1);
        lua_replace(L, lists);
    }
    lua_createtable(L, 4, 0); /* name, value, first, list */
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 2);
    lua_rawset(L, lists);
}

/* Pushes a table of the fields of block[0..len) (see rwp_header_next):
 * lower-case names, repeated fields joined with ", ", obs-fold lines joined
 * to their field with a space; then, when a name came more than once, a
 * table of every value of each such name in order, or else nil.
 * other_lines: the lines of the block that are no fields (status line,
 * blank line), for sizing the table. */
static void response_push_fields(lua_State *L, const char *block, size_t len, size_t other_lines)
{
    rwp_header_field f, next;
    size_t pos = 0, lines = 0;
    const char *q, *end = block ? block + len : NULL;
    int fields, lists, have;
    for (q = block; q && (q = (const char *)memchr(q, '\n', (size_t)(end - q))) != NULL; q++) lines++;
    lua_createtable(L, 0, lines > other_lines ? (int)(lines - other_lines) : 0);
    fields = lua_gettop(L);
    lua_pushnil(L); /* no repeats so far: nothing allocated for them */
    lists = fields + 1;
    have = block && rwp_header_next(block, len, &pos, &f);
    while (have) {
        have = rwp_header_next(block, len, &pos, &next);
        if (f.continuation) { /* not reported before a field; ignored if it were */
            f = next;
            continue;
        }
        response_push_name(L, f.name, f.name_len);
        if (have && next.continuation) {
            luaL_Buffer b;
            int nonempty = f.value_len > 0;
            luaL_buffinit(L, &b);
            luaL_addlstring(&b, f.value, f.value_len);
            do {
                if (nonempty) luaL_addchar(&b, ' ');
                luaL_addlstring(&b, next.value, next.value_len);
                nonempty = 1;
                have = rwp_header_next(block, len, &pos, &next);
            } while (have && next.continuation);
            luaL_pushresult(&b);
        } else {
            lua_pushlstring(L, f.value, f.value_len);
        }
        response_add_field(L, fields, lists);
        f = next;
    }
    if (lua_type(L, lists) == LUA_TTABLE) { /* fields[name]: its values joined once */
        lua_pushnil(L);
        while (lua_next(L, lists)) {
            luaL_Buffer b;
            int list = lua_gettop(L);
            lua_Integer i, n = (lua_Integer)lua_rawlen(L, list);
            lua_pushvalue(L, -2);
            luaL_buffinit(L, &b);
            for (i = 1; i <= n; i++) {
                if (i > 1) luaL_addlstring(&b, ", ", 2);
                rw_rawgeti(L, list, i);
                luaL_addvalue(&b);
            }
            luaL_pushresult(&b);
            lua_rawset(L, fields);
            lua_pop(L, 1);
        }
    }
}

/* Sets res.headers (and res.header_lists, when a name repeats) from the
 * final response's header block, and res.trailers from the lines that came
 * after it, if any is a field, in the table at the top of the stack. */
/* Sets headers, header_lists and trailers in the table at the top from a
 * stored header block block[0..len) whose header section ends at head_end
 * (0: all of it). */
static void response_set_headers_of(lua_State *L, const char *block, size_t len, size_t head_end)
{
    size_t head = head_end ? head_end : len;
    response_push_fields(L, block, head, 2); /* less the status line and the blank line */
    if (lua_isnil(L, -1)) lua_pop(L, 1);
    else lua_setfield(L, -3, "header_lists");
    lua_setfield(L, -2, "headers");
    if (len > head) {
        /* Less their blank line. A trailer's repeats are only joined. */
        response_push_fields(L, block + head, len - head, 1);
        lua_pop(L, 1);
        lua_pushnil(L);
        if (lua_next(L, -2)) {
            lua_pop(L, 2);
            lua_setfield(L, -2, "trailers");
        } else {
            lua_pop(L, 1);
        }
    }
}

static void response_set_headers(lua_State *L, const transfer *t)
{
    response_set_headers_of(L, t->head.data, t->head.len, t->head_end);
}

/* core.response_headers(res): the header fields of a response that
 * transfer:result(true) left as its raw block (res._head, res._head_end),
 * made into res.headers, res.header_lists and res.trailers, the raw block
 * dropped. Responses whose headers nobody reads never pay for the tables. */
int rw_response_l_headers(lua_State *L)
{
    size_t len;
    const char *block;
    lua_Integer head_end;
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
    lua_getfield(L, 1, "_head");
    block = lua_tolstring(L, 2, &len);
    if (!block) {
        lua_pop(L, 1);
        return 0;
    }
    lua_getfield(L, 1, "_head_end");
    head_end = lua_isnil(L, 3) ? (lua_Integer)len : lua_tointeger(L, 3); /* nil: no trailers */
    if (head_end < 0 || (size_t)head_end > len) return luaL_argerror(L, 1, "_head_end is not within _head");
    lua_pushvalue(L, 1);
    response_set_headers_of(L, block, len, (size_t)head_end);
    lua_pushnil(L);
    lua_setfield(L, -2, "_head");
    lua_pushnil(L);
    lua_setfield(L, -2, "_head_end");
    lua_settop(L, 1);
    return 0;
}

static int response_retryable(const transfer *t)
{
    if (t->replay_refused) return 1; /* as CURLE_GOT_NOTHING: retried only if replay-safe (fetch) */
    switch (t->code) {
    case CURLE_UNSUPPORTED_PROTOCOL:
        /* With no status line, the server answered with something that is
         * not HTTP ("HTTP/0.9"); with one, a redirect pointed to a scheme
         * that is refused, which no retry will change. */
        return t->status == 0 && t->request_size > 0;
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
        /* libcurl 7.88 reports a proxy URL it cannot parse ("Unsupported
         * proxy syntax in ...", "Unsupported proxy scheme for ...") with the
         * codes of a proxy that did not resolve or answer; no retry mends
         * the URL, and curl's --retry does not retry it either. */
        return strncmp(t->errbuf, "Unsupported proxy", 17) != 0;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
    case CURLE_PROXY:
        return 1;
    default:
        return 0;
    }
}

static int response_tls_failure(CURLcode code)
{
    switch (code) {
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CRL_BADFILE:
        return 1;
    default:
        return 0;
    }
}

static void response_setfield_bool(lua_State *L, const char *k, int v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

/* Pushes the version of the final response, as fetch reports it. */
static void response_push_version(lua_State *L, long version)
{
    lua_pushstring(L, version == CURL_HTTP_VERSION_2_0 ? "2"
                      : version == CURL_HTTP_VERSION_1_0 ? "1.0"
                      : version == 30 /* CURL_HTTP_VERSION_3 */ ? "3" : "1.1");
}

/* transfer:head() of a streamed response whose headers are in: a table
 * like transfer:result()'s, without the body and its time. */
void rw_response_head(lua_State *L, transfer *t)
{
    long status = 0, version = 0;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(t->easy, CURLINFO_HTTP_VERSION, &version);
    lua_createtable(L, 0, 10);
    lua_pushinteger(L, status);
    lua_setfield(L, -2, "status");
    response_set_headers(L, t);
    if (t->effective_url) {
        lua_pushstring(L, t->effective_url);
        lua_setfield(L, -2, "url");
    }
    lua_pushinteger(L, t->redirects);
    lua_setfield(L, -2, "redirects");
    response_push_version(L, version);
    lua_setfield(L, -2, "http_version");
}

/* The fields of a successful transfer's response table. Their names are
 * made Lua strings once (rw_response_push_keys) and set with them:
 * lua_setfield would make each string again from its C name (under LuaJIT,
 * a hash and a look-up in the string table for each of a response's four
 * to seven fields). */
#define RESPONSE_FIELDS \
    RESPONSE_FIELD(RK_STATUS, "status") \
    RESPONSE_FIELD(RK_HEAD, "_head") \
    RESPONSE_FIELD(RK_HEAD_END, "_head_end") \
    RESPONSE_FIELD(RK_BODY, "body") \
    RESPONSE_FIELD(RK_URL, "url") \
    RESPONSE_FIELD(RK_REDIRECTS, "redirects") \
    RESPONSE_FIELD(RK_HTTP_VERSION, "http_version") \
    RESPONSE_FIELD(RK_TIME, "time")

enum response_key {
#define RESPONSE_FIELD(id, name) id,
    RESPONSE_FIELDS
#undef RESPONSE_FIELD
    RK_COUNT
};

/* Pushes the array of the names (transfer.c keeps it in the transfers'
 * metatable, at TRANSFER_MT_RESPONSE_KEYS: rw_response_result, a method of
 * theirs, finds it in its first upvalue, with no look-up in the registry). */
void rw_response_push_keys(lua_State *L)
{
    static const char *const names[] = {
#define RESPONSE_FIELD(id, name) name,
        RESPONSE_FIELDS
#undef RESPONSE_FIELD
    };
    int i;
    lua_createtable(L, RK_COUNT, 0);
    for (i = 0; i < RK_COUNT; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

/* Pushes the name of field `key` (keys: the index of the array of names),
 * for lua_rawset(L, -3) to set once its value is pushed. */
static void response_key(lua_State *L, int keys, enum response_key key)
{
    rw_rawgeti(L, keys, (lua_Integer)key + 1);
}

/* transfer:result([lazy]) -> response table | nil, error table. lazy: the
 * header block is kept raw (res._head, res._head_end) for
 * core.response_headers to make into tables when they are first read.
 * url_idx (0: none): the index of the value res.url gets when no redirect
 * was followed (fetch's URL as it shows it), set here rather than by a
 * look of the caller's at the table (raw, as its metatable answers for
 * what it lacks: a call) and a field added after. */
int rw_response_result(lua_State *L, transfer *t, int lazy, int url_idx)
{
    int line_too_long, request_too_large;
    if (t->state != TRANSFER_DONE) return luaL_argerror(L, 1, "transfer is still running");
    /* libcurl's own cap on a response's headers (300 KiB since 8.3.0, and
     * in distributions' CVE-2023-38039 backports) fails with RECV_ERROR. */
    if (t->code == CURLE_RECV_ERROR && strncmp(t->errbuf, "Too large response headers", 26) == 0)
        t->headers_too_large = 1;
    /* A response header line over CURL_MAX_HTTP_HEADER (100 KiB) fails as
     * OUT_OF_MEMORY; so does a request whose line and headers pass 1 MiB
     * (a long URL), before anything is sent. */
    request_too_large = t->code == CURLE_OUT_OF_MEMORY && !t->out_of_memory && t->request_size == 0;
    line_too_long = t->code == CURLE_OUT_OF_MEMORY && !t->out_of_memory && !t->headers_done && !request_too_large;
    if (t->code == CURLE_OK && !t->aborted) {
        /* lazy (for fetch, which adds four fields of its own): what most
         * responses have (no redirect, HTTP/1.1, no trailers) is left out,
         * for response.lua to answer, and the table has 8 slots, not 16. */
        int plain_version = t->http_version != CURL_HTTP_VERSION_2_0 && t->http_version != CURL_HTTP_VERSION_1_0
                            && t->http_version != 30;
        int keys;
        rw_rawgeti(L, lua_upvalueindex(1), TRANSFER_MT_RESPONSE_KEYS);
        keys = lua_gettop(L);
        lua_createtable(L, 0, lazy ? 8 : 10);
        response_key(L, keys, RK_STATUS);
        lua_pushinteger(L, t->status);
        lua_rawset(L, -3);
        if (lazy) {
            response_key(L, keys, RK_HEAD);
            lua_pushlstring(L, t->head.data ? t->head.data : "", t->head.len);
            lua_rawset(L, -3);
            if (t->head_end != 0 && t->head_end != t->head.len) { /* trailers follow (nil: none) */
                response_key(L, keys, RK_HEAD_END);
                lua_pushinteger(L, (lua_Integer)t->head_end);
                lua_rawset(L, -3);
            }
        } else {
            response_set_headers(L, t);
        }
        response_key(L, keys, RK_BODY);
        lua_pushlstring(L, t->body.data ? t->body.data : "", t->body.len);
        lua_rawset(L, -3);
        if (t->effective_url) {
            response_key(L, keys, RK_URL);
            lua_pushstring(L, t->effective_url);
            lua_rawset(L, -3);
        } else if (url_idx) {
            response_key(L, keys, RK_URL);
            lua_pushvalue(L, url_idx);
            lua_rawset(L, -3);
        }
        if (!lazy || t->redirects) {
            response_key(L, keys, RK_REDIRECTS);
            lua_pushinteger(L, t->redirects);
            lua_rawset(L, -3);
        }
        if (!lazy || !plain_version) {
            response_key(L, keys, RK_HTTP_VERSION);
            response_push_version(L, t->http_version);
            lua_rawset(L, -3);
        }
        response_key(L, keys, RK_TIME);
        lua_pushnumber(L, t->total_time);
        lua_rawset(L, -3);
        lua_replace(L, keys);
        return 1;
    }
    lua_pushnil(L);
    lua_createtable(L, 0, 8);
    lua_pushinteger(L, t->code);
    lua_setfield(L, -2, "code");
    if (t->aborted == ABORT_CANCELLED) lua_pushliteral(L, "transfer cancelled");
    else if (t->aborted == ABORT_ENGINE_CLOSED) lua_pushliteral(L, "engine closed during the transfer");
    else if (t->aborted == ABORT_MULTI_FAILED)
        lua_pushfstring(L, "libcurl's multi handle failed (%s); the transfer was ended",
                        curl_multi_strerror(t->multi_code));
    else if (t->body_too_large) {
        /* Not lua_pushfstring's %I: Lua 5.1 and LuaJIT have no such
         * conversion. */
        char limit[32];
        (void)snprintf(limit, sizeof limit, "%zu", t->max_body);
        lua_pushfstring(L, "response body too large (limit %s bytes)", limit);
    }
    else if (t->headers_too_large)
        lua_pushfstring(L, "response headers too large (limit %d bytes)", ENGINE_MAX_HEADER_BYTES);
    else if (t->out_of_memory) lua_pushliteral(L, "out of memory buffering the response");
    else if (line_too_long) lua_pushliteral(L, "a response header line too large (libcurl's limit is 100 KiB)");
    else if (t->replay_refused)
        /* libcurl went to send it again (request_on_prereq, request.c) */
        lua_pushliteral(L, "the kept connection closed with no answer after the request went out");
    else if (request_too_large)
        lua_pushliteral(L, "the request is too large to send (libcurl's limit is 1 MiB for the request line "
                           "and headers: a long URL?)");
    else if (t->errbuf[0]) lua_pushstring(L, t->errbuf);
    else lua_pushstring(L, curl_easy_strerror(t->code));
    lua_setfield(L, -2, "message");
    lua_pushstring(L, curl_easy_strerror(t->code));
    lua_setfield(L, -2, "curl");
    response_setfield_bool(L, "retryable", !t->aborted && !t->body_too_large
                           && !t->headers_too_large && response_retryable(t));
    /* Nothing reached the server: safe to try again whatever the method. */
    response_setfield_bool(L, "sent", t->request_size > 0 || t->replay_refused);
    response_setfield_bool(L, "timeout", t->code == CURLE_OPERATION_TIMEDOUT);
    response_setfield_bool(L, "tls", response_tls_failure(t->code));
    response_setfield_bool(L, "too_large", t->body_too_large || t->headers_too_large);
    response_setfield_bool(L, "cancelled", t->aborted == ABORT_CANCELLED || t->aborted == ABORT_ENGINE_CLOSED);
    if (t->aborted == ABORT_MULTI_FAILED) {
        lua_pushstring(L, curl_multi_strerror(t->multi_code));
        lua_setfield(L, -2, "multi");
    }
    if (t->status > 0) {
        lua_pushinteger(L, t->status);
        lua_setfield(L, -2, "status");
    }
    return 2;
}
