/*
 * What the engine's files share with request.c (a request table turned
 * into libcurl's options) and response.c (what libcurl delivers turned
 * into Lua values); the engine's own files (engine.c, transfer.c, gate.c,
 * redirect.c, watch.c) share engine.h besides. Not part of the module's
 * interface.
 */
#ifndef RATEWISE_TRANSFER_H
#define RATEWISE_TRANSFER_H

#include <limits.h>
#include <math.h>
#include <stddef.h>

#include <curl/curl.h>

#include "compat.h"
#include "decode.h"
#include "ratewise.h"

#define ENGINE_MAX_HEADER_BYTES (256 * 1024) /* under libcurl's own 300 KiB */
#define ENGINE_DEFAULT_MAX_BODY (64.0 * 1024 * 1024)

/* A streamed response's body waits in the transfer's buffer until Lua reads
 * it; past this much, the transfer pauses (CURL_WRITEFUNC_PAUSE) until the
 * reader has taken it, instead of buffering without bound. */
#define ENGINE_STREAM_BUFFER (256 * 1024)

/* libcurl refuses a request line and headers over 1 MiB, and servers answer
 * 431 long before that: a request's header lines are capped at this. */
#define ENGINE_MAX_REQUEST_HEADER_BYTES (256 * 1024)

/* The method of a request, for what a redirect makes of it. */
enum transfer_method { METHOD_GET, METHOD_HEAD, METHOD_POST, METHOD_OTHER };

/* Options a request may move away from libcurl's defaults; a recycled
 * handle gets back only those the last request on it changed. */
#define DIRTY_BODY 1u       /* POSTFIELDS (and the POST it implies) */
#define DIRTY_METHOD 2u     /* NOBODY, POST or CUSTOMREQUEST */
#define DIRTY_FRESH 8u      /* FRESH_CONNECT (a libcurl without CURLOPT_PREREQFUNCTION) */
#define DIRTY_NOVERIFY 16u
#define DIRTY_HTTP1 32u     /* HTTP_VERSION 1.1 (a no_replay request over https) */

/* Whether a body goes through the transfer's decoder. */
#define DECODING_UNKNOWN 0 /* not looked at yet: at the body's first byte */
#define DECODING_ON 1
#define DECODING_OFF 2 /* identity alone */

/* Transfer user values */
#define TRANSFER_UV_ENGINE 1 /* keeps the engine alive while the transfer is */
#define TRANSFER_UV_BODY 2   /* keeps the request body alive while curl reads it */
#define TRANSFER_UV_OWNER 3  /* whom poll names with the transfer: its end, or a stream's news (engine:start) */
#define TRANSFER_NUV 3

/* The transfers' metatable's slot for the names of a response's fields
 * (rw_response_push_keys). */
#define TRANSFER_MT_RESPONSE_KEYS 1

typedef struct engine_buf {
    char *data;
    size_t len, cap;
} engine_buf;

enum transfer_state { TRANSFER_RUNNING, TRANSFER_DONE, TRANSFER_CLOSED };
/* Why a transfer ended that libcurl did not end itself. */
enum transfer_abort { ABORT_NONE, ABORT_CANCELLED, ABORT_ENGINE_CLOSED, ABORT_MULTI_FAILED };

struct engine;

/* A transfer's record: malloc'd, and pooled by its engine once closed.
 * Each group of fields has one writer, the file its comment names: another
 * file that needs one changed calls a function of that file (`make lint`
 * checks this, spec/support/writers.lua; docs/internals.md says who reads
 * each group). */
typedef struct transfer {
    /* transfer.c writes these: the record's life (taken, started, finished,
     * reported, given back) and how it ended. */
    struct engine *engine; /* set while running, and while finished but not yet reported by poll */
    CURL *easy;            /* the record's own, for its whole life */
    long recv_buffer;      /* CURLOPT_BUFFERSIZE of the handle */
    int may_multiplex;     /* counted in its engine's nmultiplex (rw_transfer_may_multiplex) */
    int ref;               /* its box in the engine's table, until poll reports it */
    enum transfer_state state;
    enum transfer_abort aborted;
    CURLcode code;
    CURLMcode multi_code; /* ABORT_MULTI_FAILED: what the multi handle reported */
    char errbuf[CURL_ERROR_SIZE]; /* libcurl's error text, or the engine's (rw_transfer_why) */
    /* monotonic: when it started; when the engine ends it if libcurl has
     * not (0: no timeout), see ENGINE_EXPIRY_GRACE */
    double started, expires;
    /* gathered from the easy handle when the transfer ends (request_size,
     * total_time: over every hop of a redirect, rw_transfer_hop_ended) */
    long status, request_size;
    long http_version; /* CURLINFO_HTTP_VERSION of the last response */
    double total_time;
    int notify;         /* stream: Lua waits for news of it (rw_transfer_progress) */
    int in_news;        /* on its engine's list of transfers with news */
    struct transfer *news_next;
    int bounded;        /* stream: its timeout applies after the headers too (transfer:bound) */

    /* request.c writes these: the request's options as the handle has them. */
    unsigned dirty; /* DIRTY_* options the request set */
    /* The request's header lines: those without secrets first, then the
     * secret ones (from secret_headers on), so that cutting the list after
     * public_tail leaves the lines another origin may see. public_tail is
     * NULL when no line comes before the secret ones. */
    struct curl_slist *headers, *secret_headers, *public_tail, *proxy_headers;
    /* The header lines those lists were built from, each followed by '\n',
     * and what else went into them (REQUEST_LINES_*): a request with the
     * same lines reuses the lists (rw_request_configure). lines_ok is 0
     * when they cannot be reused (never built, built with secret_headers,
     * cut by a redirect). */
    engine_buf lines;
    size_t nlines;
    /* The URL the handle has, when url_ok: a request for the same URL does
     * not set it again. uh: that URL parsed, the handle's CURLOPT_CURLU
     * (request_set_url); NULL until a request needs it. */
    engine_buf url;
    CURLU *uh;
    /* The options the handle has that libcurl cannot put back one by one
     * (TLS files, a pin, a TLS version, a proxy), as a
     * signature (rw_request_configure), when reset_ok: a request with the
     * same ones leaves them set, one with others starts the handle again
     * from curl_easy_reset (rw_transfer_reset). reset_next: the next
     * request's, being compared. */
    engine_buf reset_sig, reset_next;
    int reset_ok;
    unsigned lines_flags;
    int lines_ok;
    int lists_set; /* the handle's CURLOPT_HTTPHEADER and PROXYHEADER are those lists */
    int url_ok;
    /* no_replay: libcurl must never send this request twice; replay_refused:
     * request_on_prereq refused a second sending; prereq_asked, prereq_sent:
     * libcurl asked it on this hop, and the request bytes counted then. */
    int no_replay, replay_refused, prereq_asked;
    long prereq_sent;
    /* A no_replay request held to HTTP/1.1 over https: its origin's gate
     * key (0: not held so), and whether request_on_prereq ended it before a
     * byte went out, its server having agreed on no protocol when offered
     * HTTP/1.1 alone (rw_transfer_again sends it again offering HTTP/2). */
    unsigned long long h1_key;
    int alpn_refused;
    int follow;                  /* follow redirects (the engine does: rw_redirect_follow) */
    enum transfer_method method; /* as sent on the last hop */
    /* stream: the body is handed to Lua as it arrives (transfer:read); a
     * final answer that is not a 2xx unsets it, to be read whole
     * (rw_request_read_whole) */
    int stream;
    size_t max_body;
    double timeout; /* seconds, over every hop (0: none) */
    /* CURLOPT_TIMEOUT_MS and CURLOPT_CONNECTTIMEOUT_MS as the handle has
     * them (0: libcurl's default): a request with the same ones (most, as
     * fetch's budget is far from its end) sets neither again. */
    long timeout_ms, connect_timeout_ms;
    /* 0: none. Until the final headers are in, from the start; between body
     * bytes, while the reader keeps up. */
    double first_byte_timeout, idle_timeout;
    int decompress; /* undo the body's Content-Encoding (decode.c) */
    /* https: a hash of the URL's "host:port" (0: none), by which the engine
     * holds a burst to an origin it knows nothing of until the first
     * answer says whether it multiplexes (rw_gate_hold) */
    unsigned long long gate_key;

    /* response.c writes these: what libcurl delivered of the response. */
    int headers_done; /* the blank line after the last response's headers came */
    size_t head_end;  /* head[0..head_end) is that header block, trailers follow; 0 until it ends */
    engine_buf body, head;
    int body_too_large, headers_too_large, out_of_memory;
    /* The final response's headers are in (not a 1xx's, not a redirect's
     * that is followed): what a streamed response waits for. */
    int head_ready;
    int paused;         /* the write callback paused it, the buffer being full */
    size_t delivered;   /* stream: body bytes transfer:read() has handed over */
    size_t skipped;     /* stream: body bytes of redirects, not kept (rw_response_on_body) */
    /* Content-Encoding, undone by the engine (decode.c), not by libcurl:
     * encoded: a Content-Encoding line came in the header block being
     * read; decoding: DECODING_* for its body; decode_taken: of the chunk
     * libcurl hands over again after a pause, the bytes the decoder took
     * already; decode_failed: the decoder refused the body (rwd_why says
     * why). The decoder is the record's own, made when first needed. */
    int encoded, decoding, decode_failed;
    size_t decode_taken;
    rwd_decoder *decoder;
    double last_byte; /* monotonic: when body bytes last came (idle_timeout) */

    /* redirect.c writes these: the hops followed. */
    char *origin; /* the first URL's origin, from the first redirect on */
    long redirects;
    char *effective_url;

    /* gate.c writes these: its place in a gate (rw_gate_hold). */
    int gate_slot;  /* 1 + the engine's gate it probes for or is held by; 0: none */
    int gate_probe; /* it is that gate's probe */
    int held;       /* held by that gate: not on the multi handle yet */
    struct transfer *held_next;

    /* engine.h writes these (engine_list_add, engine_list_remove). */
    struct transfer *prev, *next; /* in its engine's running or finished list */
} transfer;

/* Milliseconds for libcurl from seconds: rounded up, at least 1. */
static inline long transfer_ms(double seconds)
{
    double ms = ceil(seconds * 1000.0);
    if (ms < 1) ms = 1;
    return ms > (double)LONG_MAX / 2 ? LONG_MAX / 2 : (long)ms;
}

static inline int transfer_lower(int c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

#pragma GCC visibility push(hidden)

/* request.c: the fields of a request table, in the order of the array of
 * their names that rw_request_push_keys makes, whose index
 * rw_request_configure takes (keys). */
#define REQUEST_FIELDS \
    REQUEST_FIELD(RF_URL, "url") \
    REQUEST_FIELD(RF_METHOD, "method") \
    REQUEST_FIELD(RF_BODY, "body") \
    REQUEST_FIELD(RF_EMPTY_BODY, "empty_body") \
    REQUEST_FIELD(RF_TRANSPORT, "transport") \
    REQUEST_FIELD(RF_DECOMPRESS, "decompress") \
    REQUEST_FIELD(RF_SECRET_HEADERS, "secret_headers") \
    REQUEST_FIELD(RF_HEADERS, "headers") \
    REQUEST_FIELD(RF_TIMEOUT, "timeout") \
    REQUEST_FIELD(RF_CONNECT_TIMEOUT, "connect_timeout") \
    REQUEST_FIELD(RF_FIRST_BYTE_TIMEOUT, "first_byte_timeout") \
    REQUEST_FIELD(RF_IDLE_TIMEOUT, "idle_timeout") \
    REQUEST_FIELD(RF_STREAM, "stream") \
    REQUEST_FIELD(RF_FOLLOW_REDIRECTS, "follow_redirects") \
    REQUEST_FIELD(RF_MAX_BODY, "max_body") \
    REQUEST_FIELD(RF_NO_REPLAY, "no_replay") \
    REQUEST_FIELD(RF_VERIFY_TLS, "verify_tls") \
    REQUEST_FIELD(RF_CA_FILE, "ca_file") \
    REQUEST_FIELD(RF_CA_PATH, "ca_path") \
    REQUEST_FIELD(RF_CLIENT_CERT, "client_cert") \
    REQUEST_FIELD(RF_CLIENT_KEY, "client_key") \
    REQUEST_FIELD(RF_CLIENT_KEY_PASSWORD, "client_key_password") \
    REQUEST_FIELD(RF_PINNED_PUBLIC_KEY, "pinned_public_key") \
    REQUEST_FIELD(RF_PROXY, "proxy") \
    REQUEST_FIELD(RF_PROXY_CA_FILE, "proxy_ca_file") \
    REQUEST_FIELD(RF_TLS_MIN_VERSION, "tls_min_version")
enum request_field {
#define REQUEST_FIELD(id, name) id,
    REQUEST_FIELDS
#undef REQUEST_FIELD
    RF_COUNT
};
void rw_request_push_keys(lua_State *L);
void rw_request_configure(lua_State *L, struct engine *e, transfer *t, int req, int keys, int tidx, int fresh);
/* request.c: the handle of t, a redirect followed, set up for its next hop
 * to url (copied): to_get, the method becomes a GET without a body; the
 * secret header lines go on only to the same origin; what is left (left
 * seconds) of the request's timeout is the next hop's. */
void rw_request_next_hop(transfer *t, const char *url, int to_get, int same_origin, double left);
void rw_request_register(lua_State *L);
/* request.c: what the last request set on t forgotten, its record going
 * back to the pool (the handle keeps its options: rw_request_configure
 * compares against them). */
void rw_request_clear(transfer *t);
/* request.c: what t's request holds let go of, its record being freed. */
void rw_request_free(transfer *t);
/* request.c: a final answer that is not a 2xx is read whole, as without
 * stream, and so bounded as a whole read is (max_body, the request's
 * timeout). */
void rw_request_read_whole(transfer *t);

/* request.c: t, ended by request_on_prereq before a byte went out
 * (alpn_refused), offers HTTP/2 as well when it goes again. */
void rw_request_offer_h2(transfer *t);

/* transfer.c: whether e remembers the https origin of gate key `key` as one
 * that does not speak HTTP/1.1 (rw_transfer_again). */
int rw_transfer_h2_only(const struct engine *e, unsigned long long key);
/* transfer.c: whether t's TLS connection agreed on no ALPN protocol (a
 * libcurl on OpenSSL; 0 when that cannot be known). */
int rw_transfer_alpn_none(transfer *t);

/* transfer.c: the text of why t ends, as libcurl's error buffer would say
 * it (t->errbuf, which libcurl writes too). */
void rw_transfer_why(transfer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* engine.c: what response.c's callbacks tell the engine when a transfer's
 * final headers or body bytes arrive: a reader waiting on the transfer is
 * told (the engine's next poll reports it), and the engine's next expiry
 * comes no later than the transfer's own (an idle timeout that starts). */
void rw_transfer_progress(transfer *t);
/* engine.c: t's handle forgets every option (its connections stay) and is
 * set up as a new one of engine e, for rw_request_configure to set up. */
void rw_transfer_reset(struct engine *e, transfer *t);
/* engine.c: the final headers of a transfer are in (response.c's header
 * callback): if it probes an origin for the engine's gate, the transfers
 * held for that origin go on (after libcurl returns). */
void rw_gate_answered(transfer *t);
/* libcurl delivered bytes of t's response (an all-at-once pass made progress). */
void rw_engine_delivered(transfer *t);
/* engine.c: libcurl opened socket fd for t's connection (request.c's
 * socket callback): the engine counts it for t's origin, so that it
 * forgets what it knows of an origin once its last connection is closed. */
void rw_gate_socket_opened(transfer *t, int fd);

/* response.c: makes room for `need` bytes in b, keeping what it holds (its
 * capacity doubles from 256); 0 when out of memory. */
int rw_buf_grow(engine_buf *b, size_t need);
/* response.c: b's memory freed, b empty. */
void rw_buf_free(engine_buf *b);

/* response.c: libcurl's write and header callbacks (C only, no Lua), and
 * transfer:result() */
size_t rw_response_on_body(char *ptr, size_t size, size_t nmemb, void *ud);
size_t rw_response_on_header(char *ptr, size_t size, size_t nmemb, void *ud);
/* engine.c, when a transfer ends as libcurl ended it (code): the code it
 * ends with, once its decoded body is checked (a coding that did not come
 * to its end is a body cut short), t->errbuf saying why. */
CURLcode rw_response_end(transfer *t, CURLcode code);
/* Called from a method of the transfers (its first upvalue: their
 * metatable, which holds the names of a response's fields). */
int rw_response_result(lua_State *L, transfer *t, int lazy, int url_idx);
/* Pushes an array of the names of a response's fields, for
 * rw_response_result (rw_transfer_register keeps it in the transfers'
 * metatable, at TRANSFER_MT_RESPONSE_KEYS). */
void rw_response_push_keys(lua_State *L);
int rw_response_l_headers(lua_State *L);
/* transfer:head(): a streamed response's status and headers */
void rw_response_head(lua_State *L, transfer *t);
/* transfer:read()'s share: pushes the body bytes buffered since the last
 * read (some must be) as one string and empties the buffer. Answers 1
 * when the write callback had paused t and it runs: it counts as resumed
 * (the reader was behind, not the server idle), for the caller to tell
 * libcurl. */
int rw_response_read(lua_State *L, transfer *t, int running);
/* response.c: a redirect's body dropped, not the answer (rw_redirect_follow). */
void rw_response_drop_body(transfer *t);
/* response.c: the transfer ends out of memory on the engine's side, not
 * for a request too large for libcurl (rw_response_result tells them
 * apart). */
void rw_response_no_memory(transfer *t);
/* response.c: the last response forgotten, t's record going back to the
 * pool: its body buffer is kept (rw_response_keep_body decides), its
 * header buffer when no larger than keep_head. */
void rw_response_clear(transfer *t, size_t keep_head);
/* response.c: t's body buffer freed when its capacity is over keep. */
void rw_response_keep_body(transfer *t, size_t keep);
/* response.c: t's buffers and decoder freed, its record being freed. */
void rw_response_free(transfer *t);

#pragma GCC visibility pop

#endif
