/*
 * ratewise C core: declarations shared between the files of src/.
 *
 * Only luaopen_ratewise_core is exported from the shared object. Everything
 * declared here is hidden by the pragma below, not only by the Makefile's
 * -fvisibility=hidden: luarocks (and any other builder) compiles without that
 * flag, and every non-static function has its prototype here (the Makefile's
 * -Wmissing-prototypes makes sure), so the definitions inherit the hidden
 * visibility of their declarations whoever builds the module.
 * The parsers are plain C (no Lua) so that the fuzz targets can call them:
 * parse.c has them, lparse.c their Lua bindings.
 */
#ifndef RATEWISE_H
#define RATEWISE_H

#include <stddef.h>

/* lua.h's typedef names this same struct; declaring it here keeps this
 * header free of Lua, so parse.c and the fuzz targets build without it. */
struct lua_State;

/* Up to the pop at the end of this file: declarations added anywhere in
 * between are hidden too. No #include in between: a library's functions
 * declared hidden would be called as if they were in this object, and the
 * link fails. */
#pragma GCC visibility push(hidden)

#define RW_VERSION "0.1.0"

/* Longest wait any parser reports, in seconds (about 31 billion years).
 * A hint larger than this saturates instead of overflowing. */
#define RW_MAX_SECONDS 1e18

/* ---- parse.c: pure parsers, no Lua (the bindings are in lparse.c) ---- */

/* "success", "retryable" or "terminal" for an HTTP status code. */
const char *rwp_classify(long status);

/* A non-negative decimal number of seconds ("120", "1.5"); no sign, no
 * exponent, no inner space; surrounding SP/HTAB allowed. Saturates at
 * RW_MAX_SECONDS. Returns 1 and sets *out, or 0. */
int rwp_parse_seconds(const char *s, size_t len, double *out);

/* An HTTP-date in any of the three forms of RFC 9110 section 5.6.7.
 * now (epoch seconds) resolves two-digit years (RFC 850 form, refused when
 * now is outside the years 0000-9999). Returns 1 and sets *out to epoch
 * seconds, or 0. */
int rwp_parse_http_date(const char *s, size_t len, double now, double *out);

/* A Retry-After value: delta-seconds or HTTP-date, relative to now.
 * Returns 1 and sets *out to seconds >= 0, or 0. */
int rwp_parse_retry_after(const char *s, size_t len, double now, double *out);

/* A Go duration as time.Duration.String() writes it ("1s", "6m0s", "12ms",
 * "1h2m3.5s", "500us", "500\xc2\xb5s", "20ns"): one or more decimal numbers
 * (optional fraction, as Go reads them: "1.5h", ".5s", "1.s"), each followed
 * by a unit (ns, us, U+00B5 s, U+03BC s, ms, s, m, h); a bare "0" too.
 * No sign, no inner space; surrounding SP/HTAB allowed. Saturates at
 * RW_MAX_SECONDS. Returns 1 and sets *out to seconds, or 0. */
int rwp_parse_duration(const char *s, size_t len, double *out);

/* An RFC 3339 date-time ("2025-01-01T12:00:30Z", "...30.123Z",
 * "...30+02:00"; 'T' and 'Z' in either case), ranges checked (leap years,
 * second 60, offset hours <= 23); surrounding SP/HTAB allowed. Returns 1
 * and sets *out to epoch seconds (fraction kept), or 0. */
int rwp_parse_rfc3339(const char *s, size_t len, double *out);

/* One line of a stored header block, as rwp_header_next reports it: a
 * field line (name and value), or an obs-fold line continuing the field
 * reported before it (continuation = 1, name NULL). Spans point into the
 * block; name is never empty and holds no SP, HTAB, ':', CR, LF or NUL;
 * value is trimmed of SP and HTAB and holds no CR, LF or NUL; a field's
 * value may be empty, a continuation's never is. */
typedef struct rwp_header_field {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
    int continuation;
} rwp_header_field;

/* The next field of a header block as libcurl stores it (a status line,
 * field lines, a blank line; trailers alike), from block[*pos] on. Lines
 * end at LF, with one CR before it dropped; a last line without LF counts.
 * A line that starts with SP or HTAB is an obs-fold continuation of the
 * field above it. Skipped: blank lines, status lines ("HTTP/..."), lines
 * with no ':', an empty name or a name holding SP or HTAB (RFC 9112
 * section 5.1), lines holding NUL or a bare CR (RFC 9110 section 5.5);
 * continuations holding nothing but SP/HTAB; and continuations with no
 * field to continue: at the start of the block, or after a line skipped
 * for one of the reasons before the semicolon, so that a dropped field's
 * continuation goes with it. *pos must be 0 at the start of a block and
 * otherwise what the last call left; it only grows, and reaches len when 0
 * is returned. Returns 1 and fills *out, or 0 at the end of the block. */
int rwp_header_next(const char *block, size_t len, size_t *pos, rwp_header_field *out);

/* One link-value of a Link header field (RFC 8288 section 3), as
 * rwp_link_next reports it. target spans the URI-Reference between "<" and
 * ">" (never holding ">"); rel spans the first "rel" parameter's value
 * (without its quotes when rel_quoted, and then possibly holding
 * backslash escapes), or is NULL when the link has none; has_anchor says
 * an "anchor" parameter gives it another context than the response. */
typedef struct rwp_link {
    const char *target;
    size_t target_len;
    const char *rel;
    size_t rel_len;
    int rel_quoted;
    int has_anchor;
} rwp_link;

/* The next link-value of a Link field value (several fields joined with
 * ", " read as one), from s[*pos] on. A link-value that does not parse
 * (no "<", a parameter without a name, text after a parameter, a quoted
 * string or a "<" that never closes) is skipped up to the next comma that
 * is outside a quoted string and "<...>". *pos must be 0 at the start; it
 * only grows, and reaches len when 0 is returned. Returns 1 and fills
 * *out, or 0 at the end. */
int rwp_link_next(const char *s, size_t len, size_t *pos, rwp_link *out);

/* Whether a link's rel names the relation type rel[0..rel_len): one of its
 * types separated by SP or HTAB, compared case-insensitively (RFC 8288
 * section 2.1). */
int rwp_link_has_rel(const rwp_link *link, const char *rel, size_t rel_len);

/* The target of the first link-value of s whose rel names rel and that
 * has no anchor: 1 with *target and *target_len set (spans into s), or 0. */
int rwp_link_find(const char *s, size_t len, const char *rel, size_t rel_len,
                  const char **target, size_t *target_len);

/* ---- server-sent events (sse.c) ---- */

/* What rwp_sse_feed answers besides 0, or what an emit callback answered. */
#define RWP_SSE_TOO_LARGE 1 /* a line, or an event's data, over the parser's max */
#define RWP_SSE_NO_MEMORY 2
/* A retry field is capped at this many milliseconds (a day). */
#define RWP_SSE_MAX_RETRY 86400000L

typedef struct rwp_sse_buf {
    char *data; /* NUL-terminated when not NULL */
    size_t len, cap;
} rwp_sse_buf;

/* An event as the stream dispatched it. event is "message" when the stream
 * named none; data is the event's data lines joined with LF (no CR in it);
 * id is the stream's last event id so far (NULL when it has set none; it
 * holds no NUL); retry is the event's own retry field in milliseconds, when
 * has_retry. The spans live until the next call of rwp_sse_feed. */
typedef struct rwp_sse_event {
    const char *event, *data, *id;
    size_t event_len, data_len, id_len;
    long retry;
    int has_retry;
} rwp_sse_event;

typedef int (*rwp_sse_emit)(void *ctx, const rwp_sse_event *ev);

/* A parser's state between chunks; rwp_sse_init before use, rwp_sse_free
 * after (then it may be used again, as new). */
typedef struct rwp_sse {
    rwp_sse_buf line, data, event, id;
    int has_id, has_retry, after_cr, past_bom;
    long retry;
    size_t max;
} rwp_sse;

void rwp_sse_init(rwp_sse *p, size_t max);
void rwp_sse_free(rwp_sse *p);
/* Reads s[0..n), the next bytes of the stream, and calls emit for each
 * event a blank line completes (an event with no data is not dispatched,
 * as the standard says). Lines end at CRLF, LF or CR (a CRLF split between
 * two chunks counts once); a UTF-8 BOM at the very start is skipped;
 * comments (":...") and unknown fields are ignored. A line or an event's
 * data longer than max bytes answers RWP_SSE_TOO_LARGE. Returns 0, an
 * RWP_SSE_* code, or the first non-zero answer of emit (the rest of s is
 * then not read). An event not yet ended by a blank line when the stream
 * ends is never dispatched: the standard discards it. */
int rwp_sse_feed(rwp_sse *p, const char *s, size_t n, rwp_sse_emit emit, void *ctx);

enum rwp_jitter { RWP_JITTER_NONE, RWP_JITTER_FULL, RWP_JITTER_EQUAL, RWP_JITTER_DECORRELATED };

/* Capped exponential backoff. u is a uniform random number in [0,1);
 * previous is the last delay (decorrelated jitter only). */
double rwp_backoff(double attempt, double base, double max_delay,
                   enum rwp_jitter jitter, double u, double previous);

/* ---- registration of each file's Lua functions into the module table ---- */
void rw_lparse_register(struct lua_State *L); /* lparse.c */
void rw_bucket_register(struct lua_State *L);
void rw_engine_register(struct lua_State *L);
void rw_redis_register(struct lua_State *L); /* redis.c */
void rw_term_register(struct lua_State *L);  /* term.c: the command-line tool's */
void rw_digest_register(struct lua_State *L); /* digest.c */
void rw_json_register(struct lua_State *L); /* json.c */

/* ---- options.c: tables of options, checked as lua/ratewise/options.lua
 * checks them ---- */

/* The place in known (an array of names ending in NULL) of the name at idx,
 * or -1: not a string, or not exactly one of them. */
int rw_options_key(struct lua_State *L, int idx, const char *const *known);

/* Raises "who: unknown <noun> 'name' (did you mean 'nearest'?)" for the
 * value at name_idx (a table's key), options.unknown's wording; known: the
 * names the table takes, ending in NULL; noun NULL: "option". */
int rw_options_unknown(struct lua_State *L, const char *who, int name_idx, const char *const *known,
                       const char *noun);

/* Clocks in seconds (core.c): monotonic for deadlines and buckets, the wall
 * clock only to compare with dates the server sent. */
double rw_core_monotonic(void);
double rw_core_realtime(void);

/* ---- Lua stack checks: builds with -DRW_STACK_CHECK (make test-asan) ----
 *
 * A slot pushed and never popped, or popped twice, is a bug that Lua itself
 * seldom notices: a C function's caller only takes the values on top, so
 * the stack below is not checked, and a helper that pops one slot too many
 * just eats its caller's argument. These builds check two promises, and
 * abort with the function, line and heights on the first one broken:
 *
 * - Every C function registered with Lua (module functions, methods and
 *   metamethods alike) leaves its arguments where they were and pushes
 *   exactly the values it returns: on return, the stack's height is the
 *   number of arguments plus the number of results. luaopen_ratewise_core
 *   wraps each such function once everything is registered (core.c), so a
 *   function added later is checked without doing anything; a function
 *   that must return one of its arguments pushes a copy of it.
 *
 * - A helper that pushes or pops on its caller's behalf states its net
 *   effect: RW_STACK_MARK(L, m) records the height on entry and
 *   RW_STACK_EXPECT(L, m, delta) checks it is m + delta at the point where
 *   the helper says it is done. This names the helper itself, where the
 *   entry check would only name the C function that called it.
 *
 * In other builds both macros are empty statements and cost nothing. */
#ifdef RW_STACK_CHECK
void rw_core_stack_fail(const char *where, int line, int want, int got);
#define RW_STACK_MARK(L, m) int m = lua_gettop(L)
#define RW_STACK_EXPECT(L, m, delta) \
    (lua_gettop(L) == (m) + (delta) ? (void)0 : rw_core_stack_fail(__func__, __LINE__, (m) + (delta), lua_gettop(L)))
#else
#define RW_STACK_MARK(L, m) ((void)0)
#define RW_STACK_EXPECT(L, m, delta) ((void)0)
#endif

#pragma GCC visibility pop

#endif
