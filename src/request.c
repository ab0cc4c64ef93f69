/*
 * A request table turned into libcurl's options for a transfer's easy
 * handle: the method and body, the header lines (checked, secret ones kept
 * apart for rw_redirect_follow), the timeout and the rest. In two halves:
 * request_read reads and checks the whole table (misuse raises, from
 * engine:start, before anything is sent or set), then request_apply sets
 * the options without a Lua call. A recycled handle gets back only the
 * defaults its last request changed.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transfer.h"

/* Request fields whose values are credentials: the engine never sends them
 * to another origin (scheme, host, port) after a redirect, and the Lua
 * layer keeps them out of every message (core.secret_header_names). A
 * request adds names of its own (request.secret_headers). */
static const char *const request_secret_names[] = {
    "authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-goog-api-key",
    "x-auth-token", "x-access-token", "x-amz-security-token", "private-token", "x-csrf-token", NULL
};

/* Fields libcurl writes itself: a caller's Content-Length or
 * Transfer-Encoding would override the real framing, and the body would be
 * read as a second, smuggled request on a pooled connection
 * (core.transport_header_names). */
static const char *const request_transport_names[] = {
    "content-length", "transfer-encoding", "host", "connection", "upgrade", "te", "expect", NULL
};

/* libcurl's sockets are inheritable: every program the process starts
 * (os.execute, io.popen) would get a copy of each connection, holding it
 * open past its close and using up the child's descriptors (a child run
 * under a low limit could not even load its libraries). Not inherited, as
 * Go's and Python's sockets are not. */
static int request_on_socket(void *ud, curl_socket_t fd, curlsocktype purpose)
{
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (purpose == CURLSOCKTYPE_IPCXN && ud) rw_gate_socket_opened((transfer *)ud, fd);
    return CURL_SOCKOPT_OK;
}

/* libcurl sends a request again, on its own, when the kept connection it
 * went out on closes before any byte of answer (Curl_retry_request:
 * "Connection died, retrying a fresh connect"), though the server may have
 * acted on it; and asks this callback first, each time it is about to send
 * it. For a request that must not be replayed (no_replay), a second sending
 * on this hop after bytes went out since the first was asked for
 * (CURLINFO_REQUEST_SIZE, which counts a proxy's CONNECT too: hence the
 * count at the first question, not 0) is refused: the transfer ends with
 * CURLE_ABORTED_BY_CALLBACK and replay_refused. A second sending when
 * nothing went out (the connection was found dead as the request was
 * written) goes ahead: the server cannot have seen it; through a proxy the
 * new tunnel's CONNECT counts, and it is refused too, the safe way. */
#if LIBCURL_VERSION_NUM >= 0x075000
static int request_on_prereq(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                             int conn_local_port)
{
    transfer *t = (transfer *)ud;
    long sent = 0;
    (void)conn_primary_ip;
    (void)conn_local_ip;
    (void)conn_primary_port;
    (void)conn_local_port;
    if (!t->no_replay) return CURL_PREREQFUNC_OK;
    if (curl_easy_getinfo(t->easy, CURLINFO_REQUEST_SIZE, &sent) != CURLE_OK) sent = 0;
    if (!t->prereq_asked) {
        /* Offered HTTP/1.1 alone, the server agreed on no protocol: an
         * HTTP/2-only server (nghttpd) closes the connection without reading
         * the request. Not a byte has gone out: the engine sends it again at
         * once offering HTTP/2 too (rw_transfer_again). */
        if (t->h1_key && rw_transfer_alpn_none(t)) {
            t->alpn_refused = 1;
            return CURL_PREREQFUNC_ABORT;
        }
        t->prereq_asked = 1;
        t->prereq_sent = sent;
        return CURL_PREREQFUNC_OK;
    }
    if (sent > t->prereq_sent) {
        t->replay_refused = 1;
        return CURL_PREREQFUNC_ABORT;
    }
    return CURL_PREREQFUNC_OK;
}
#endif

/* Never reads anything: see rw_request_configure. */
static size_t request_on_read(char *ptr, size_t size, size_t nmemb, void *ud)
{
    (void)ptr;
    (void)size;
    (void)nmemb;
    (void)ud;
    return 0;
}

/* Frees the request's header lines, whether their two parts are joined,
 * cut apart by a redirect, or never joined (a request that raised). */
static void request_free_headers(transfer *t)
{
    if (t->public_tail) t->public_tail->next = NULL;
    if (t->headers != t->secret_headers) curl_slist_free_all(t->headers);
    curl_slist_free_all(t->secret_headers);
    curl_slist_free_all(t->proxy_headers);
    t->headers = t->secret_headers = t->public_tail = t->proxy_headers = NULL;
    t->lines_ok = 0;
    t->lists_set = 0;
    t->lines.len = 0;
    t->nlines = 0;
}

void rw_request_free(transfer *t)
{
    curl_url_cleanup(t->uh); /* the handle used it until now */
    t->uh = NULL;
    request_free_headers(t);
    rw_buf_free(&t->lines);
    rw_buf_free(&t->url);
    rw_buf_free(&t->reset_sig);
    rw_buf_free(&t->reset_next);
}

void rw_request_clear(transfer *t)
{
    t->timeout = 0;
    t->stream = 0;
    t->gate_key = 0;
    t->no_replay = t->replay_refused = t->prereq_asked = t->alpn_refused = 0;
    t->h1_key = 0;
    t->first_byte_timeout = t->idle_timeout = 0;
}

void rw_request_read_whole(transfer *t)
{
    t->stream = 0;
    if (t->max_body == (size_t)-1) t->max_body = (size_t)ENGINE_DEFAULT_MAX_BODY;
}

/* What goes into a request's header lists besides the caller's lines. */
#define REQUEST_LINES_EXPECT 1u /* "Expect:" (a body) */
#define REQUEST_LINES_ENCODING 2u /* the engine's Accept-Encoding line */

/* The Accept-Encoding line of a request that decompresses: every coding
 * the engine decodes (decode.c), in the order libcurl 7.88 gave them when
 * it decoded them itself. One of the request's own lines, reused with its
 * list (rw_request_configure). */
#define REQUEST_ACCEPT_ENCODING "Accept-Encoding: deflate, gzip, br, zstd"

/* Pushes item i of the array at index idx (raw: read without metamethods)
 * and returns its type. */
static int request_item(lua_State *L, int idx, lua_Integer i, int raw)
{
    return raw ? lua_rawgeti(L, idx, i) : lua_geti(L, idx, i);
}

/* Whether the n lines of the array at index idx are those t's lists were
 * built from, with the same extras: then the lists serve as they are. */
static int request_same_lines(lua_State *L, int idx, int raw, lua_Integer n, transfer *t, unsigned flags)
{
    size_t pos = 0;
    lua_Integer i;
    if (!t->lines_ok || t->lines_flags != flags || t->nlines != (size_t)n) return 0;
    for (i = 1; i <= n; i++) {
        size_t len;
        const char *line;
        int same;
        if (request_item(L, idx, i, raw) != LUA_TSTRING) {
            lua_pop(L, 1);
            return 0; /* the build says what is wrong with it */
        }
        line = lua_tolstring(L, -1, &len);
        same = len < t->lines.len - pos && memcmp(t->lines.data + pos, line, len) == 0
               && t->lines.data[pos + len] == '\n';
        lua_pop(L, 1);
        if (!same) return 0;
        pos += len + 1;
    }
    return pos == t->lines.len;
}

/* Keeps line[0..len) and a '\n' in t->lines; 0 when out of memory (the
 * lists are then not reused). */
static int request_keep_line(transfer *t, const char *line, size_t len)
{
    if (!rw_buf_grow(&t->lines, t->lines.len + len + 1)) return 0;
    memcpy(t->lines.data + t->lines.len, line, len);
    t->lines.data[t->lines.len + len] = '\n';
    t->lines.len += len + 1;
    return 1;
}

/* The fields of a request table. Their names are made Lua strings once per
 * engine (rw_request_push_keys), and each field is looked up with its
 * string: lua_getfield would make (hash and intern) the string again from
 * the C name for every lookup of every request. */
static const char *const request_field_names[] = {
#define REQUEST_FIELD(id, name) name,
    REQUEST_FIELDS
#undef REQUEST_FIELD
};

/* Pushes an array of the request fields' names, in REQUEST_FIELDS order,
 * which also maps each name to its place (for request.transport's list:
 * one lookup a name, not a comparison with each field's name): engine.c
 * keeps it with the engine, and gives its index to rw_request_configure. */
void rw_request_push_keys(lua_State *L)
{
    int i;
    lua_createtable(L, RF_COUNT, RF_COUNT);
    for (i = 0; i < RF_COUNT; i++) {
        lua_pushstring(L, request_field_names[i]);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, i + 1);
        lua_pushinteger(L, i + 1);
        lua_rawset(L, -3);
    }
}

/* A request table being read: the table at index req, and the array of
 * its fields' names at index keys. A table without a metatable (fetch's
 * and runtime's) is read raw: lua_gettable's way through the metamethods
 * is work that a table without them never needs. */
typedef struct request_src {
    lua_State *L;
    int req, keys, raw;
} request_src;

/* Pushes request field `field` and returns its type. */
static int request_get(const request_src *src, enum request_field field)
{
    rw_rawgeti(src->L, src->keys, (lua_Integer)field + 1);
    return src->raw ? lua_rawget(src->L, src->req) : lua_gettable(src->L, src->req);
}

/* Pushes request option `field` and returns 1, or pushes nothing and
 * returns 0 when it is nil. */
static int request_opt_field(const request_src *src, enum request_field field, int type, const char *what)
{
    lua_State *L = src->L;
    RW_STACK_MARK(L, mark);
    const char *name = request_field_names[field];
    int t = request_get(src, field);
    if (t == LUA_TNIL) {
        lua_pop(L, 1);
        RW_STACK_EXPECT(L, mark, 0);
        return 0;
    }
    if (t != type)
        luaL_error(L, "request option '%s' must be %s (got %s)", name, what, luaL_typename(L, -1));
    RW_STACK_EXPECT(L, mark, 1);
    return 1;
}

static double request_opt_seconds(const request_src *src, enum request_field field)
{
    lua_State *L = src->L;
    RW_STACK_MARK(L, mark);
    double v;
    if (!request_opt_field(src, field, LUA_TNUMBER, "a number of seconds")) return -1;
    v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (!(v > 0) || isnan(v)) luaL_error(L, "request option '%s' must be positive", request_field_names[field]);
    RW_STACK_EXPECT(L, mark, 0);
    return v;
}

/* Whether s[0..n) holds a control character or a space (RFC 3986 allows
 * neither in a URL; RFC 9110 none in a method). */
static int request_has_ctl(const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 32 || (unsigned char)s[i] == 127) return 1;
    return 0;
}

/* Whether name[0..n) is one of list's (lower-case) names, in any case. */
static int request_in_list(const char *const *list, const char *name, size_t n)
{
    for (; *list; list++)
        if (strlen(*list) == n && strncasecmp(*list, name, n) == 0) return 1;
    return 0;
}

/* Whether name[0..n) is one of the strings of the array at index idx. */
static int request_in_names(lua_State *L, int idx, const char *name, size_t n)
{
    lua_Integer i, count = (lua_Integer)lua_rawlen(L, idx);
    for (i = 1; i <= count; i++) {
        size_t len;
        const char *s;
        rw_rawgeti(L, idx, i);
        s = lua_tolstring(L, -1, &len);
        lua_pop(L, 1);
        if (len == n && strncasecmp(s, name, n) == 0) return 1;
    }
    return 0;
}

/* request.secret_headers: an array of names. */
static void request_check_names(lua_State *L, int idx)
{
    lua_Integer i, count = (lua_Integer)lua_rawlen(L, idx);
    for (i = 1; i <= count; i++) {
        if (lua_rawgeti(L, idx, i) != LUA_TSTRING)
            luaL_error(L, "request option 'secret_headers' must be an array of header names");
        lua_pop(L, 1);
    }
}

/* Checks header line i ("Name: value", or "Name;" for an empty value) and
 * returns the length of its name. Control characters other than HTAB are
 * refused (CR and LF would start another field), and so are the fields
 * libcurl owns. */
static size_t request_check_line(lua_State *L, const char *line, size_t len, int i)
{
    size_t k, name_len = 0;
    while (name_len < len && line[name_len] != ':' && line[name_len] != ';' && line[name_len] != ' ') name_len++;
    if (name_len == 0 || name_len == len) luaL_error(L, "request header %d is not \"Name: value\"", i);
    for (k = 0; k < len; k++) {
        unsigned char c = (unsigned char)line[k];
        if ((c < 32 && c != '\t') || c == 127)
            luaL_error(L, "request header %d contains a control character (CR, LF, NUL or another)", i);
    }
    if (request_in_list(request_transport_names, line, name_len))
        luaL_error(L, "request header %d (%s) is set by libcurl, not by the caller", i,
                   lua_pushlstring(L, line, name_len));
    return name_len;
}

/* The rarer options (TLS files, a proxy, decompression, the stream and its
 * timeouts, and those a plain GET does not have: an empty body, redirects
 * not followed, a body limit, no TLS checks, no replay by libcurl, more
 * secret header names), as bits of request fields: a request's `transport`
 * says which of them to look for (request_transport). */
#define RF_BIT(f) (1ULL << (f))
#define RF_TRANSPORT_FIELDS \
    (RF_BIT(RF_DECOMPRESS) | RF_BIT(RF_CONNECT_TIMEOUT) | RF_BIT(RF_FIRST_BYTE_TIMEOUT) | RF_BIT(RF_IDLE_TIMEOUT) \
     | RF_BIT(RF_STREAM) | RF_BIT(RF_CA_FILE) | RF_BIT(RF_CA_PATH) | RF_BIT(RF_CLIENT_CERT) | RF_BIT(RF_CLIENT_KEY) \
     | RF_BIT(RF_CLIENT_KEY_PASSWORD) | RF_BIT(RF_PINNED_PUBLIC_KEY) | RF_BIT(RF_PROXY) | RF_BIT(RF_PROXY_CA_FILE) \
     | RF_BIT(RF_TLS_MIN_VERSION) | RF_BIT(RF_EMPTY_BODY) | RF_BIT(RF_FOLLOW_REDIRECTS) | RF_BIT(RF_MAX_BODY) \
     | RF_BIT(RF_VERIFY_TLS) | RF_BIT(RF_NO_REPLAY) | RF_BIT(RF_SECRET_HEADERS))

/* Raises for item i of the transport list at idx, which names no transport
 * option: "request: unknown transport option 'name' (did you mean ...?)". */
static void request_unknown_transport(lua_State *L, int idx, lua_Integer i)
{
    const char *names[RF_COUNT + 1];
    int f, n = 0;
    for (f = 0; f < RF_COUNT; f++)
        if (RF_TRANSPORT_FIELDS & RF_BIT(f)) names[n++] = request_field_names[f];
    names[n] = NULL;
    lua_rawgeti(L, idx, i);
    rw_options_unknown(L, "request", -1, names, "transport option");
}

/* Which of the rarer options to look for: request.transport is false
 * (none), true or absent (all: each is looked up), or an array of the names
 * the request has (fetch's: those only, as looking up every transport
 * option on every request is a cost most requests need not pay). */
static unsigned long long request_transport(const request_src *src)
{
    lua_State *L = src->L;
    unsigned long long fields = RF_TRANSPORT_FIELDS;
    int type = request_get(src, RF_TRANSPORT);
    if (type == LUA_TBOOLEAN) {
        if (!lua_toboolean(L, -1)) fields = 0;
    } else if (type == LUA_TTABLE) {
        lua_Integer i, n = (lua_Integer)lua_rawlen(L, -1);
        fields = 0;
        for (i = 1; i <= n; i++) {
            lua_Integer f = -1;
            if (lua_rawgeti(L, -1, i) == LUA_TSTRING && lua_rawget(L, src->keys) == LUA_TNUMBER)
                f = lua_tointeger(L, -1) - 1; /* the field's place, by its name */
            if (f >= 0 && f < RF_COUNT && (RF_TRANSPORT_FIELDS & RF_BIT(f)))
                fields |= RF_BIT(f);
            else
                request_unknown_transport(L, lua_gettop(L) - 1, i);
            lua_pop(L, 1);
        }
    } else if (type != LUA_TNIL) {
        luaL_error(L, "request option 'transport' must be a boolean or an array of names (got %s)",
                   luaL_typename(L, -1));
    }
    lua_pop(L, 1);
    return fields;
}

/* The options given as strings that libcurl copies, each a file, a pin or
 * a proxy URL. */
static const struct request_string_option {
    enum request_field field;
    CURLoption option;
} request_string_options[] = {
    { RF_CA_FILE, CURLOPT_CAINFO },
    { RF_CA_PATH, CURLOPT_CAPATH },
    { RF_CLIENT_CERT, CURLOPT_SSLCERT },
    { RF_CLIENT_KEY, CURLOPT_SSLKEY },
    { RF_CLIENT_KEY_PASSWORD, CURLOPT_KEYPASSWD },
    { RF_PINNED_PUBLIC_KEY, CURLOPT_PINNEDPUBLICKEY },
    { RF_PROXY, CURLOPT_PROXY },
    { RF_PROXY_CA_FILE, CURLOPT_PROXY_CAINFO }, /* an https:// proxy's own CA */
};

/* Adds option `field`, with value v[0..len), to the signature in b: the
 * field, the length, the bytes and a NUL (libcurl takes C strings). */
static void request_sig_add(lua_State *L, engine_buf *b, enum request_field field, const char *v, size_t len)
{
    if (!rw_buf_grow(b, b->len + 1 + sizeof len + len + 1)) luaL_error(L, "out of memory reading request options");
    b->data[b->len++] = (char)(unsigned char)field;
    memcpy(b->data + b->len, &len, sizeof len);
    b->len += sizeof len;
    memcpy(b->data + b->len, v, len);
    b->len += len;
    b->data[b->len++] = '\0';
}

/* Builds in t->reset_next the signature of the request's options that
 * libcurl cannot put back one by one (TLS files, a pin, a proxy, a TLS
 * version: those of `fields` it has), each value checked. Each is read
 * from the request once: request_set_reset_options sets them from it. */
static void request_read_reset_sig(const request_src *src, transfer *t, unsigned long long fields)
{
    lua_State *L = src->L;
    engine_buf *b = &t->reset_next;
    size_t i, len;
    b->len = 0;
    for (i = 0; i < sizeof request_string_options / sizeof request_string_options[0]; i++) {
        enum request_field field = request_string_options[i].field;
        if ((fields & RF_BIT(field)) && request_opt_field(src, field, LUA_TSTRING, "a string")) {
            const char *v = lua_tolstring(L, -1, &len);
            if (strlen(v) != len) luaL_error(L, "request option '%s' contains a NUL byte", request_field_names[field]);
            request_sig_add(L, b, field, v, len);
            lua_pop(L, 1);
        }
    }
    if ((fields & RF_BIT(RF_TLS_MIN_VERSION))
        && request_opt_field(src, RF_TLS_MIN_VERSION, LUA_TSTRING, "a string")) {
        const char *v = lua_tolstring(L, -1, &len);
        if (len != 3 || (memcmp(v, "1.2", 3) != 0 && memcmp(v, "1.3", 3) != 0)) /* "1.2\0x" too */
            luaL_error(L, "request option 'tls_min_version' must be \"1.2\" or \"1.3\"");
        request_sig_add(L, b, RF_TLS_MIN_VERSION, v, len);
        lua_pop(L, 1);
    }
}

/* What a request table says, read and checked by request_read before any
 * of it reaches libcurl (request_apply): misuse raises while the handle is
 * as the last request left it, and setting the options makes no Lua call
 * that could raise. The strings point into values request_read leaves on
 * the Lua stack until the request is configured (a request table with
 * metamethods may make each value afresh). Reading also builds what the
 * request keeps in t of its own: the header lists (request_read_headers)
 * and the signature of the options a reset puts back (t->reset_next). */
typedef struct request_values {
    unsigned long long transport; /* the rarer options it may have (request_transport) */
    int decompress;
    const char *url;
    size_t url_len;
    enum transfer_method method;
    const char *custom_method; /* METHOD_OTHER: as given */
    int post;                  /* "POST" named: a POST, with a body or not */
    const char *body;          /* NULL: none */
    size_t body_len;
    int body_idx;   /* the body's place on the stack */
    int empty_body; /* no body, but "Content-Length: 0" */
    /* seconds (0: none) */
    double timeout, connect_timeout, first_byte_timeout, idle_timeout;
    int stream, follow, no_replay, verify_tls;
    size_t max_body;
} request_values;

/* Whether url[0..len) is the URL the handle has (t->url, when url_ok). */
static int request_same_url(const transfer *t, const char *url, size_t len)
{
    return t->url_ok && t->url.len == len && memcmp(t->url.data, url, len) == 0;
}

/* The URL, left on the stack. */
static void request_read_url(const request_src *src, const transfer *t, request_values *v)
{
    lua_State *L = src->L;
    request_opt_field(src, RF_URL, LUA_TSTRING, "a string");
    v->url = lua_tolstring(L, -1, &v->url_len);
    if (!v->url) {
        luaL_error(L, "request option 'url' is required");
        return; /* not reached; lauxlib.h does not tell the analyzer so */
    }
    /* The URL the handle holds passed the check as it was set: only
     * another is scanned. */
    if (!request_same_url(t, v->url, v->url_len) && request_has_ctl(v->url, v->url_len))
        luaL_error(L, "request url contains a space or a control character");
}

/* The method and the body, each left on the stack when given. */
static void request_read_method_body(const request_src *src, request_values *v)
{
    lua_State *L = src->L;
    size_t len;
    int get = 0;
    /* No method: GET, or POST when there is a body (libcurl's way). */
    v->method = METHOD_GET;
    if (request_opt_field(src, RF_METHOD, LUA_TSTRING, "a string")) {
        const char *method = lua_tolstring(L, -1, &len);
        if (len == 0 || request_has_ctl(method, len))
            luaL_error(L, "request method is not a valid HTTP method");
        if (strcmp(method, "GET") == 0) {
            /* libcurl would send a GET with a body as a POST, while the
             * caller decided replay safety on GET. */
            get = 1;
        } else if (strcmp(method, "HEAD") == 0) {
            v->method = METHOD_HEAD;
        } else if (strcmp(method, "POST") == 0) {
            v->method = METHOD_POST;
            v->post = 1;
        } else {
            v->method = METHOD_OTHER;
            v->custom_method = method;
        }
    }
    /* One lookup of the body, then the checks in the order that names the
     * worse mistake first. */
    if (request_get(src, RF_BODY) == LUA_TNIL) {
        lua_pop(L, 1);
        if ((v->transport & RF_BIT(RF_EMPTY_BODY))
            && request_opt_field(src, RF_EMPTY_BODY, LUA_TBOOLEAN, "a boolean")) {
            v->empty_body = lua_toboolean(L, -1);
            lua_pop(L, 1);
        }
        return;
    }
    if (get || v->method == METHOD_HEAD)
        luaL_error(L, "request with method %s cannot carry a body", v->method == METHOD_HEAD ? "HEAD" : "GET");
    if (lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "request option 'body' must be a string (got %s)", luaL_typename(L, -1));
    v->body = lua_tolstring(L, -1, &v->body_len);
    v->body_idx = lua_gettop(L);
    if (v->method == METHOD_GET) v->method = METHOD_POST;
}

/* The header lines, checked and sorted into t's public, secret and proxy
 * lists (kept when the lines are the last request's): the lists are
 * libcurl's own type, but setting them on the handle is request_apply's. */
static void request_read_headers(const request_src *src, transfer *t, const request_values *v)
{
    lua_State *L = src->L;
    size_t len;
    int extra_secrets = 0, hidx = 0, hraw = 1;
    lua_Integer nlines = 0;
    unsigned flags;
    if ((v->transport & RF_BIT(RF_SECRET_HEADERS))
        && request_opt_field(src, RF_SECRET_HEADERS, LUA_TTABLE, "a table of header names")) {
        extra_secrets = lua_gettop(L);
        request_check_names(L, extra_secrets);
    }
    flags = (v->body || v->empty_body || v->post ? REQUEST_LINES_EXPECT : 0)
            | (v->decompress ? REQUEST_LINES_ENCODING : 0);
    if (request_opt_field(src, RF_HEADERS, LUA_TTABLE, "a table")) {
        hidx = lua_gettop(L);
        hraw = !lua_getmetatable(L, hidx);
        if (!hraw) lua_pop(L, 1);
        nlines = hraw ? (lua_Integer)lua_rawlen(L, hidx) : luaL_len(L, hidx);
    }
    /* The same lines as the last request on this handle (most programs
     * send the same few on every call): its lists serve again. Never with
     * secret_headers, whose names sort the lines differently. */
    if (!extra_secrets && request_same_lines(L, hidx, hraw, nlines, t, flags)) {
        if (hidx) lua_pop(L, 1);
    } else {
        lua_Integer i;
        int keep = !extra_secrets, given_encoding = 0;
        size_t header_bytes = 0;
        request_free_headers(t);
        for (i = 1; i <= nlines; i++) {
            struct curl_slist **list, *next;
            const char *line;
            size_t name_len;
            if (request_item(L, hidx, i, hraw) != LUA_TSTRING)
                luaL_error(L, "request header %d must be a string", (int)i);
            line = lua_tolstring(L, -1, &len);
            name_len = request_check_line(L, line, len, (int)i);
            header_bytes += len + 2;
            if (header_bytes > ENGINE_MAX_REQUEST_HEADER_BYTES)
                luaL_error(L, "request headers too large (over %d KiB)", ENGINE_MAX_REQUEST_HEADER_BYTES / 1024);
            if (name_len == 15 && strncasecmp(line, "accept-encoding", 15) == 0) given_encoding = 1;
            /* Proxy-Authorization goes to a proxy only, never to an origin
             * (libcurl would hand it to every host a redirect leads to). */
            if (name_len == 19 && strncasecmp(line, "proxy-authorization", 19) == 0)
                list = &t->proxy_headers;
            else if (request_in_list(request_secret_names, line, name_len)
                     || (extra_secrets && request_in_names(L, extra_secrets, line, name_len)))
                list = &t->secret_headers;
            else
                list = &t->headers;
            next = curl_slist_append(*list, line); /* copied */
            if (!next) luaL_error(L, "out of memory building request headers");
            *list = next;
            if (keep && !request_keep_line(t, line, len)) keep = 0;
            lua_pop(L, 1);
        }
        if (hidx) lua_pop(L, 1);
        if (flags & REQUEST_LINES_EXPECT) {
            /* Without this, libcurl waits up to a second for "100 Continue"
             * before sending a large body. */
            struct curl_slist *next = curl_slist_append(t->headers, "Expect:");
            if (!next) luaL_error(L, "out of memory building request headers");
            t->headers = next;
        }
        if ((flags & REQUEST_LINES_ENCODING) && !given_encoding) {
            /* first, where libcurl itself prints it */
            struct curl_slist *line = curl_slist_append(NULL, REQUEST_ACCEPT_ENCODING);
            if (!line) luaL_error(L, "out of memory building request headers");
            else {
                line->next = t->headers;
                t->headers = line;
            }
        }
        if (t->secret_headers) { /* the secret lines after the others: see transfer */
            struct curl_slist *tail = t->headers;
            while (tail && tail->next) tail = tail->next;
            t->public_tail = tail;
            if (tail) tail->next = t->secret_headers;
            else t->headers = t->secret_headers;
        }
        t->nlines = (size_t)nlines;
        t->lines_flags = flags;
        t->lines_ok = keep;
    }
    if (extra_secrets) lua_pop(L, 1);
}

/* Timeouts, streaming, redirects and the body limit. */
static void request_read_timeouts(const request_src *src, request_values *v)
{
    lua_State *L = src->L;
    unsigned long long transport = v->transport;
    double seconds;
    if ((seconds = request_opt_seconds(src, RF_TIMEOUT)) > 0) v->timeout = seconds;
    if ((transport & RF_BIT(RF_CONNECT_TIMEOUT)) && (seconds = request_opt_seconds(src, RF_CONNECT_TIMEOUT)) > 0)
        v->connect_timeout = seconds;
    if ((transport & RF_BIT(RF_FIRST_BYTE_TIMEOUT))
        && (seconds = request_opt_seconds(src, RF_FIRST_BYTE_TIMEOUT)) > 0)
        v->first_byte_timeout = seconds;
    if ((transport & RF_BIT(RF_IDLE_TIMEOUT)) && (seconds = request_opt_seconds(src, RF_IDLE_TIMEOUT)) > 0)
        v->idle_timeout = seconds;
    if ((transport & RF_BIT(RF_STREAM)) && request_opt_field(src, RF_STREAM, LUA_TBOOLEAN, "a boolean")) {
        v->stream = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    v->follow = 1;
    if ((transport & RF_BIT(RF_FOLLOW_REDIRECTS))
        && request_opt_field(src, RF_FOLLOW_REDIRECTS, LUA_TBOOLEAN, "a boolean")) {
        v->follow = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    /* A stream is read as it comes, and may go on for hours: no limit but
     * the one the request names. What of it is read whole (a redirect's
     * body, an answer that is not a 2xx) is held to the default limit
     * (rw_response_on_body, rw_response_on_header). */
    v->max_body = v->stream ? (size_t)-1 : (size_t)ENGINE_DEFAULT_MAX_BODY;
    if ((transport & RF_BIT(RF_MAX_BODY)) && request_opt_field(src, RF_MAX_BODY, LUA_TNUMBER, "a number of bytes")) {
        lua_Number mb = lua_tonumber(L, -1);
        /* The integer half of SIZE_MAX, then as a float: meant. */
        if (!(mb >= 0) || mb > (lua_Number)((size_t)-1 / 2)) /* NOLINT(bugprone-integer-division) */
            luaL_error(L, "request option 'max_body' must be a non-negative number of bytes");
        v->max_body = (size_t)mb;
        lua_pop(L, 1);
    }
}

/* Reads and checks the request table, in the order that decides which
 * mistake an error names when there are several. */
static void request_read(const request_src *src, transfer *t, request_values *v)
{
    lua_State *L = src->L;
    luaL_checkstack(L, 8, "reading a request");
    memset(v, 0, sizeof *v);
    /* The rarer options the request may have: most of fetch's calls have
     * none, and say so (transport = false). */
    v->transport = request_transport(src);
    v->decompress = 1;
    if ((v->transport & RF_BIT(RF_DECOMPRESS))
        && request_opt_field(src, RF_DECOMPRESS, LUA_TBOOLEAN, "a boolean")) {
        v->decompress = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    request_read_reset_sig(src, t, v->transport);
    request_read_url(src, t, v);
    request_read_method_body(src, v);
    request_read_headers(src, t, v);
    request_read_timeouts(src, v);
    if ((v->transport & RF_BIT(RF_NO_REPLAY)) && request_opt_field(src, RF_NO_REPLAY, LUA_TBOOLEAN, "a boolean")) {
        v->no_replay = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
    v->verify_tls = 1;
    if ((v->transport & RF_BIT(RF_VERIFY_TLS)) && request_opt_field(src, RF_VERIFY_TLS, LUA_TBOOLEAN, "a boolean")) {
        v->verify_tls = lua_toboolean(L, -1);
        lua_pop(L, 1);
    }
}

/* ---- Setting libcurl's options: no Lua from here to rw_request_configure ---- */

/* Whether the handle has exactly the options of the signature
 * t->reset_next already (t->reset_sig, when reset_ok). */
static int request_same_reset(const transfer *t)
{
    const engine_buf *b = &t->reset_next;
    return t->reset_ok && b->len == t->reset_sig.len && (b->len == 0 || memcmp(b->data, t->reset_sig.data, b->len) == 0);
}

/* Sets on t's handle the options of the signature t->reset_next, which
 * then describes the handle (t->reset_sig). Answers -1, or the field
 * libcurl refused; then reset_ok stays 0 and the next request resets the
 * handle. */
static int request_set_reset_options(transfer *t)
{
    const char *p = t->reset_next.data, *end = p + t->reset_next.len;
    engine_buf was;
    t->reset_ok = 0;
    while (p < end) {
        enum request_field field = (enum request_field)(unsigned char)*p++;
        const char *v;
        size_t len;
        memcpy(&len, p, sizeof len);
        v = p + sizeof len;
        p = v + len + 1;
        if (field == RF_TLS_MIN_VERSION) {
            curl_easy_setopt(t->easy, CURLOPT_SSLVERSION,
                             strcmp(v, "1.3") == 0 ? (long)CURL_SSLVERSION_TLSv1_3 : (long)CURL_SSLVERSION_TLSv1_2);
        } else {
            size_t i = 0;
            while (request_string_options[i].field != field) i++;
            if (curl_easy_setopt(t->easy, request_string_options[i].option, v) != CURLE_OK) return (int)field;
        }
    }
    was = t->reset_sig;
    t->reset_sig = t->reset_next;
    t->reset_next = was;
    t->reset_ok = 1;
    return -1;
}

/* Whether the environment has any of the variables libcurl 7.88 reads to
 * choose a proxy for an http or https URL (it ignores HTTP_PROXY). libcurl
 * looks them up for every transfer, five to seven getenv calls that each
 * scan the whole environment, and copies what it finds. A handle made while none is set is
 * told so (an empty CURLOPT_PROXY and CURLOPT_NOPROXY) and skips them; with
 * any set, libcurl reads them as it always does. */
static int request_proxy_env(void)
{
    static const char *const names[] = { "http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                                         "no_proxy", "NO_PROXY" };
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++)
        if (getenv(names[i]) != NULL) return 1;
    return 0;
}

/* The handle gets its URL parsed, as a CURLU kept with the record, rather
 * than as CURLOPT_URL's text, which libcurl parses and prints back for every
 * transfer (curl_url_set, then curl_url_get through its printf). The next request for the same URL
 * on this handle (a task looping on an endpoint) then sets nothing, and
 * libcurl only copies the parsed parts. The flags are those libcurl
 * parses CURLOPT_URL with, so a URL means what it did. A URL that does not
 * parse goes to libcurl as text, which refuses it with its own error. */
static void request_set_url(transfer *t, const char *url, size_t len)
{
    CURL *easy = t->easy;
    t->url_ok = 0;
    /* One the record had is emptied first: a CURLU that holds a URL takes a
     * new one that is not absolute ("host:port/x", without a scheme) as
     * relative to the last, and the request would go to the last one's host. */
    if (!t->uh) t->uh = curl_url();
    else (void)curl_url_set(t->uh, CURLUPART_URL, NULL, 0);
    if (t->uh && curl_url_set(t->uh, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK) {
        /* No text first: libcurl 7.88 derives its own copy of the URL (the
         * effective URL, the base of a relative Location) from the CURLU
         * only when it has none, and would keep the last one's. */
        curl_easy_setopt(easy, CURLOPT_URL, (char *)NULL);
        curl_easy_setopt(easy, CURLOPT_CURLU, t->uh);
        if (rw_buf_grow(&t->url, len + 1)) {
            memcpy(t->url.data, url, len);
            t->url.len = len;
            t->url_ok = 1;
        }
    } else {
        curl_easy_setopt(easy, CURLOPT_CURLU, (CURLU *)NULL);
        curl_easy_setopt(easy, CURLOPT_URL, url); /* copied by libcurl */
    }
}

/* The handle: options the request shares with the handle's last (same
 * signature) stay; others start from a reset handle (rw_transfer_reset); a
 * fresh handle gets what every transfer sets alike; a reused one gets back
 * the defaults the last request changed. Answers whether the options of
 * the reset signature are the handle's already. */
static int request_apply_handle(struct engine *e, transfer *t, int fresh)
{
    CURL *easy = t->easy;
    int same_reset;
    /* The options libcurl cannot put back one by one: a request with the
     * same ones as the handle's last (a CA file on every call) leaves them
     * set, one with others starts from a reset handle: resetting for every
     * such request would cost each of them the whole set-up again. */
    if (fresh) {
        t->reset_sig.len = 0;
        t->reset_ok = 1;
    }
    same_reset = request_same_reset(t);
    if (!same_reset && !(t->reset_ok && t->reset_sig.len == 0)) {
        rw_transfer_reset(e, t); /* it has others, which cannot be unset one by one */
        t->dirty = 0;
        t->timeout_ms = t->connect_timeout_ms = 0;
        t->url_ok = t->lists_set = 0; /* the handle has neither any more */
        fresh = 1;
        t->reset_sig.len = 0;
        t->reset_ok = 1;
        same_reset = t->reset_next.len == 0;
    }

    if (fresh) {
        const char *env;
        /* Only http and https (libcurl itself never follows a redirect
         * here: rw_redirect_follow does). */
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
#else
        curl_easy_setopt(easy, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
        curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(easy, CURLOPT_HEADEROPT, CURLHEADER_SEPARATE);
        curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, rw_response_on_body);
        curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, rw_response_on_header);
        /* The record and its handle stay together for good (the error
         * buffer too: transfer_handle_init). */
        curl_easy_setopt(easy, CURLOPT_WRITEDATA, t);
        curl_easy_setopt(easy, CURLOPT_HEADERDATA, t);
        curl_easy_setopt(easy, CURLOPT_PRIVATE, t);
        /* libcurl's default read callback is fread(stdin): a request whose
         * body libcurl would have to read (a POST without POSTFIELDS, an
         * upload) would send the process's standard input. Every body is
         * POSTFIELDS, so the read callback only ever says "no more". */
        curl_easy_setopt(easy, CURLOPT_READFUNCTION, request_on_read);
#if LIBCURL_VERSION_NUM >= 0x075000
        curl_easy_setopt(easy, CURLOPT_PREREQFUNCTION, request_on_prereq);
        curl_easy_setopt(easy, CURLOPT_PREREQDATA, t);
#endif
        curl_easy_setopt(easy, CURLOPT_SOCKOPTFUNCTION, request_on_socket);
        curl_easy_setopt(easy, CURLOPT_SOCKOPTDATA, t);
        /* The engine decodes the body (decode.c), not libcurl, whose
         * decoders take a compressed body cut short for a whole one: libcurl
         * hands the bytes over as they came (with CURLOPT_ACCEPT_ENCODING
         * unset, it never decodes; this says so once more). */
        curl_easy_setopt(easy, CURLOPT_HTTP_CONTENT_DECODING, 0L);
        /* The standard variables of OpenSSL's tools, which libcurl itself
         * does not read: the CAs an internal service's users point to. */
        if ((env = getenv("SSL_CERT_FILE")) != NULL && *env) curl_easy_setopt(easy, CURLOPT_CAINFO, env);
        if ((env = getenv("SSL_CERT_DIR")) != NULL && *env) curl_easy_setopt(easy, CURLOPT_CAPATH, env);
        if (!request_proxy_env()) {
            curl_easy_setopt(easy, CURLOPT_PROXY, "");
            curl_easy_setopt(easy, CURLOPT_NOPROXY, "");
        }
    } else if (t->dirty) {
        /* Back to the defaults of what the last request changed, rather
         * than curl_easy_reset and the whole set-up again. POSTFIELDS first:
         * setting it turns the method to POST, which HTTPGET then undoes. */
        if (t->dirty & DIRTY_BODY) {
            curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
            curl_easy_setopt(easy, CURLOPT_POSTFIELDS, (char *)NULL);
        }
        if (t->dirty & (DIRTY_BODY | DIRTY_METHOD)) {
            curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
            curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, (char *)NULL);
        }
        if (t->dirty & DIRTY_FRESH) curl_easy_setopt(easy, CURLOPT_FRESH_CONNECT, 0L);
        if (t->dirty & DIRTY_HTTP1) curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
        if (t->dirty & DIRTY_NOVERIFY) {
            curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
            curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
        }
    }
    t->dirty = 0;
    return same_reset;
}

/* The URL, and the gate's key for an https origin. */
static void request_apply_url(transfer *t, const request_values *v)
{
    const char *url = v->url;
    size_t len = v->url_len;
    if (!request_same_url(t, url, len)) request_set_url(t, url, len);
    t->gate_key = 0;
    if (len > 8 && strncasecmp(url, "https://", 8) == 0) {
        /* FNV-1a of the authority, lower-cased: the gate's key */
        unsigned long long h = 1469598103934665603ULL;
        size_t i;
        for (i = 8; i < len && url[i] != '/' && url[i] != '?' && url[i] != '#'; i++)
            h = (h ^ (unsigned char)transfer_lower((unsigned char)url[i])) * 1099511628211ULL;
        t->gate_key = h ? h : 1;
    }
    /* HTTPS speaks HTTP/2 where the server offers it (libcurl's default);
     * a request multiplexes onto a connection that has said it can. Never
     * CURLOPT_PIPEWAIT: with it, concurrent requests to an origin not yet
     * known wait for the first connection, and libcurl 7.88 lets the waiting
     * ones go one at a time as transfers end, so on an HTTP/1.1 server a
     * burst can end up sent one after another on a single connection (seen
     * in the suite on a loaded machine). The engine's gate holds them instead
     * (rw_gate_hold), keyed by this hash of the origin. */
}

/* The method and the body (which the transfer keeps alive: libcurl does
 * not copy it). */
static void request_apply_method_body(transfer *t, const request_values *v)
{
    CURL *easy = t->easy;
    t->method = v->method;
    if (v->method == METHOD_HEAD) {
        t->dirty |= DIRTY_METHOD;
        curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
    } else if (v->method == METHOD_OTHER) {
        t->dirty |= DIRTY_METHOD;
        curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, v->custom_method); /* copied */
    } else if (v->post) {
        t->dirty |= DIRTY_METHOD; /* the body options below make it a POST */
    }
    if (v->body) {
        t->dirty |= DIRTY_BODY;
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)v->body_len);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, v->body);
    } else if (v->empty_body || v->post) {
        /* "Content-Length: 0", as servers expect of a POST or PUT
         * (CURLOPT_POST alone would make libcurl read the body from stdin). */
        t->dirty |= DIRTY_BODY;
        curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
        curl_easy_setopt(easy, CURLOPT_POSTFIELDS, "");
    }
}

/* Timeouts, streaming, redirects and the body limit. */
static void request_apply_timeouts(transfer *t, const request_values *v)
{
    long ms = v->connect_timeout > 0 ? transfer_ms(v->connect_timeout) : 0;
    if (ms != t->connect_timeout_ms) {
        t->connect_timeout_ms = ms;
        curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT_MS, ms);
    }
    t->timeout = v->timeout;
    /* libcurl has no timer for these: the engine ends the transfer itself
     * (engine_expiry). */
    t->first_byte_timeout = v->first_byte_timeout;
    t->idle_timeout = v->idle_timeout;
    /* The body is handed to Lua as it arrives (transfer:read), the
     * transfer pausing when the reader falls behind. */
    t->stream = v->stream;
    /* A stream's timeout is the engine's (engine_expiry): it ends when a
     * 2xx's headers are in, and libcurl's could not. */
    ms = t->timeout > 0 && !t->stream ? transfer_ms(t->timeout) : 0;
    if (ms != t->timeout_ms) {
        t->timeout_ms = ms;
        curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, ms);
    }
    t->follow = v->follow;
    t->max_body = v->max_body;
}

/* Whether libcurl may ever send the request twice. */
static void request_apply_replay(const struct engine *e, transfer *t, const request_values *v)
{
    /* A request that must not be replayed keeps its kept connection; libcurl
     * is kept from sending it twice by request_on_prereq. A libcurl older
     * than 7.80 has no such callback: the request asks for a connection of
     * its own, where libcurl never retries. */
    t->no_replay = v->no_replay;
    t->replay_refused = t->prereq_asked = t->alpn_refused = 0;
    t->h1_key = 0;
    if (!t->no_replay) return;
#if LIBCURL_VERSION_NUM < 0x075000
    (void)e;
    t->dirty |= DIRTY_FRESH;
    curl_easy_setopt(t->easy, CURLOPT_FRESH_CONNECT, 1L);
#else
    /* Over HTTP/1.1 only (on every hop: a redirect may lead to https).
     * On an HTTP/2 connection libcurl also sends a request again when
     * the server refused its stream (REFUSED_STREAM, or above a GOAWAY's
     * last stream, as nginx sends every 1,000 requests): the server has
     * not acted on it, but request_on_prereq cannot tell that retry from
     * one after the connection died, and would fail it. An HTTP/1.1
     * connection has no such retry; and libcurl 7.88 loses an HTTP/2
     * answer that comes before the body has gone (docs/http.md). Not on
     * the gate either: such a request never multiplexes, and must not
     * teach the engine that its origin does not.
     * An origin whose server would not agree on HTTP/1.1 is offered
     * HTTP/2 as well, and goes through the gate as other requests do:
     * request_on_prereq still refuses a second sending. */
    if (t->gate_key && rw_transfer_h2_only(e, t->gate_key)) return;
    t->dirty |= DIRTY_HTTP1;
    t->h1_key = t->gate_key;
    t->gate_key = 0;
    curl_easy_setopt(t->easy, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
#endif
}

void rw_request_offer_h2(transfer *t)
{
    /* DIRTY_HTTP1 stays: the next request on the handle gets the default back */
    curl_easy_setopt(t->easy, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    t->alpn_refused = t->prereq_asked = t->replay_refused = 0;
    t->h1_key = 0;
}

/* Sets t->easy from what request_read found, in the order the options
 * depend on each other. Answers -1, or the field this libcurl refused. */
static int request_apply(struct engine *e, transfer *t, const request_values *v, int fresh)
{
    int same_reset = request_apply_handle(e, t, fresh), refused = -1;
    t->decompress = v->decompress;
    request_apply_url(t, v);
    request_apply_method_body(t, v);
    if (!t->lists_set) {
        curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
        curl_easy_setopt(t->easy, CURLOPT_PROXYHEADER, t->proxy_headers);
        t->lists_set = 1;
    }
    request_apply_timeouts(t, v);
    request_apply_replay(e, t, v);
    /* TLS and proxy options (those of the reset signature when they are
     * not the handle's already), and verify_tls. */
    if (!same_reset) refused = request_set_reset_options(t);
    if (!v->verify_tls) {
        t->dirty |= DIRTY_NOVERIFY;
        curl_easy_setopt(t->easy, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(t->easy, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    return refused;
}

void rw_request_next_hop(transfer *t, const char *url, int to_get, int same_origin, double left)
{
    if (to_get) {
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
        curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, (char *)NULL);
        curl_easy_setopt(t->easy, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(t->easy, CURLOPT_CUSTOMREQUEST, (char *)NULL);
        t->dirty |= DIRTY_BODY | DIRTY_METHOD;
        t->method = METHOD_GET;
    }
    t->lines_ok = 0; /* the lists below may be cut: built afresh for the next request */
    t->url_ok = 0;   /* the handle goes elsewhere */
    if (t->secret_headers) {
        if (t->public_tail) t->public_tail->next = same_origin ? t->secret_headers : NULL;
        curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, same_origin || t->public_tail ? t->headers : NULL);
    }
    curl_easy_setopt(t->easy, CURLOPT_CURLU, (CURLU *)NULL); /* it would take precedence */
    curl_easy_setopt(t->easy, CURLOPT_URL, url);             /* copied */
    if (t->timeout > 0 && !t->stream) { /* a stream's is the engine's (engine_expiry) */
        t->timeout_ms = transfer_ms(left);
        curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, t->timeout_ms);
    }
    t->prereq_asked = 0; /* a new hop: its first sending is its own (request_on_prereq) */
}

/* Sets up t->easy from the request table at index req: read and checked
 * whole first (misuse raises there, before any option is set), then set. */
void rw_request_configure(lua_State *L, struct engine *e, transfer *t, int req, int keys, int tidx, int fresh)
{
    int top = lua_gettop(L), refused;
    request_values values;
    request_src src = { L, req, keys, 1 };

    if (lua_getmetatable(L, req)) {
        lua_pop(L, 1);
        src.raw = 0;
    }
    request_read(&src, t, &values);
    if (values.body) {
        lua_pushvalue(L, values.body_idx);
        lua_setiuservalue(L, tidx, TRANSFER_UV_BODY);
    }
    refused = request_apply(e, t, &values, fresh);
    lua_settop(L, top); /* what request_read kept for request_apply */
    if (refused >= 0)
        luaL_error(L, "request option '%s' is not supported by this libcurl", request_field_names[refused]);
}

/* Pushes a list of names as an array. */
static void request_push_names(lua_State *L, const char *const *list)
{
    lua_Integer i = 0;
    lua_newtable(L);
    for (; *list; list++) {
        lua_pushstring(L, *list);
        lua_rawseti(L, -2, ++i);
    }
}

/* The module's fields for the Lua layer's own checks: the same lists. */
void rw_request_register(lua_State *L)
{
    request_push_names(L, request_secret_names);
    lua_setfield(L, -2, "secret_header_names");
    request_push_names(L, request_transport_names);
    lua_setfield(L, -2, "transport_header_names");
    lua_pushinteger(L, ENGINE_MAX_REQUEST_HEADER_BYTES);
    lua_setfield(L, -2, "max_request_header_bytes");
}
