/* core.digest(key, data): SipHash-2-4 with a 128-bit output of data under
 * a 16-byte key, by OpenSSL's libcrypto (the library libcurl already loads
 * for TLS here: its default provider's EVP_MAC "SIPHASH").
 * core.digester(key): the same under one key, of a list of strings, with
 * one MAC context kept for every digest.
 *
 * What it is for: rw.client keys its de-duplication and its cache by a
 * request's identity, which includes secrets (an Authorization header, a
 * URL's userinfo, a proxy's password). The key the client keeps is this
 * digest, under a random key of the client's own, so that a secret takes
 * part in the comparison without being kept or printed, and no one who
 * does not know the client's key can make two requests collide.
 *
 * Why SipHash: it is a keyed pseudorandom function made for exactly this,
 * the keys of a hash table that an attacker must not be able to make
 * collide, and it costs a fraction of a keyed cryptographic hash (HMAC)
 * for short inputs. Its 128-bit output makes an accidental collision
 * among a client's requests negligible. */
#include <stdint.h>
#include <string.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include "compat.h"
#include "ratewise.h"

#define DIGEST_MT "ratewise.Digester"
#define DIGEST_KEY_SIZE 16 /* SipHash's key */
#define DIGEST_SIZE 16     /* and the output asked of it */
#define DIGEST_LENGTH_BYTES 10 /* the most a 64-bit length takes, 7 bits a byte */

/* A MAC context of SipHash-2-4, 128-bit output, keyed with key (16
 * bytes), or NULL. */
static EVP_MAC_CTX *digest_keyed(const unsigned char *key)
{
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
    EVP_MAC_CTX *ctx = mac != NULL ? EVP_MAC_CTX_new(mac) : NULL;
    size_t size = DIGEST_SIZE;
    OSSL_PARAM params[2];
    EVP_MAC_free(mac); /* (the context keeps its own reference) */
    if (ctx == NULL) return NULL;
    params[0] = OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size);
    params[1] = OSSL_PARAM_construct_end();
    if (!EVP_MAC_init(ctx, key, DIGEST_KEY_SIZE, params)) {
        EVP_MAC_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static int digest_l_digest(lua_State *L)
{
    size_t key_len, data_len, out_len = 0;
    const char *key = luaL_checklstring(L, 1, &key_len);
    const char *data = luaL_checklstring(L, 2, &data_len);
    unsigned char out[DIGEST_SIZE];
    EVP_MAC_CTX *ctx;
    int ok;
    luaL_argcheck(L, key_len == DIGEST_KEY_SIZE, 1, "must be 16 bytes");
    ctx = digest_keyed((const unsigned char *)key);
    ok = ctx != NULL && EVP_MAC_update(ctx, (const unsigned char *)data, data_len)
        && EVP_MAC_final(ctx, out, &out_len, sizeof out) && out_len == DIGEST_SIZE;
    EVP_MAC_CTX_free(ctx);
    if (!ok) {
        lua_pushnil(L);
        lua_pushliteral(L, "libcrypto could not compute SipHash");
        return 2;
    }
    lua_pushlstring(L, (const char *)out, out_len);
    return 1;
}

/* A context keyed once; each digest starts it again from that key. */
typedef struct digester {
    EVP_MAC_CTX *ctx;
} digester;

/* What is absorbed is gathered here and handed to libcrypto in pieces of
 * this size: one update per piece rather than two per string. */
typedef struct digest_feed {
    EVP_MAC_CTX *ctx;
    size_t used;
    int ok;
    unsigned char buf[1024];
} digest_feed;

static void digest_feed_add(digest_feed *f, const void *p, size_t n)
{
    const unsigned char *bytes = (const unsigned char *)p;
    if (f->used + n > sizeof f->buf) {
        f->ok = f->ok && EVP_MAC_update(f->ctx, f->buf, f->used);
        f->used = 0;
        if (n > sizeof f->buf) {
            f->ok = f->ok && EVP_MAC_update(f->ctx, bytes, n);
            return;
        }
    }
    memcpy(f->buf + f->used, bytes, n);
    f->used += n;
}

static int digest_l_gc(lua_State *L)
{
    digester *d = (digester *)luaL_checkudata(L, 1, DIGEST_MT);
    EVP_MAC_CTX_free(d->ctx);
    d->ctx = NULL;
    return 0;
}

/* d = core.digester(key): key is 16 bytes. */
static int digest_l_new(lua_State *L)
{
    size_t key_len;
    const unsigned char *key = (const unsigned char *)luaL_checklstring(L, 1, &key_len);
    digester *d;
    luaL_argcheck(L, key_len == DIGEST_KEY_SIZE, 1, "must be 16 bytes");
    d = (digester *)lua_newuserdatauv(L, sizeof *d, 0);
    d->ctx = NULL;
    luaL_setmetatable(L, DIGEST_MT);
    d->ctx = digest_keyed(key);
    if (d->ctx == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "libcrypto could not start SipHash");
        return 2;
    }
    return 1;
}

/* mac = d(parts): SipHash under d's key of the strings of the array
 * parts, each taken as its length (LEB128: 7 bits a byte, least
 * significant first, the high bit set on all but the last) and then its
 * bytes, so that no two lists of strings give the same data: the
 * same as core.digest(key, data) of those bytes. */
static int digest_l_call(lua_State *L)
{
    digester *d = (digester *)luaL_checkudata(L, 1, DIGEST_MT);
    digest_feed f;
    unsigned char out[DIGEST_SIZE];
    size_t out_len = 0;
    lua_Integer i, n;
    luaL_checktype(L, 2, LUA_TTABLE);
    luaL_argcheck(L, d->ctx != NULL, 1, "no longer usable");
    n = (lua_Integer)lua_rawlen(L, 2);
    f.ctx = d->ctx;
    f.used = 0;
    /* no key: started again under the key it was given (and its size) */
    f.ok = EVP_MAC_init(d->ctx, NULL, 0, NULL);
    for (i = 1; i <= n; i++) {
        unsigned char length[DIGEST_LENGTH_BYTES];
        size_t len, rest, j = 0;
        const char *s;
        lua_rawgeti(L, 2, i);
        if (lua_type(L, -1) != LUA_TSTRING) return luaL_error(L, "digest: part %d is not a string", (int)i);
        s = lua_tolstring(L, -1, &len);
        /* 7 bits a byte, least significant first, the high bit set on all
         * but the last (LEB128): a short part takes one byte */
        for (rest = len; rest >= 0x80; rest >>= 7) length[j++] = (unsigned char)(0x80 | (rest & 0x7f));
        length[j++] = (unsigned char)rest;
        digest_feed_add(&f, length, j);
        digest_feed_add(&f, s, len);
        lua_pop(L, 1);
    }
    if (f.used > 0) f.ok = f.ok && EVP_MAC_update(d->ctx, f.buf, f.used);
    if (!f.ok || !EVP_MAC_final(d->ctx, out, &out_len, sizeof out) || out_len != DIGEST_SIZE) {
        lua_pushnil(L);
        lua_pushliteral(L, "libcrypto could not compute SipHash");
        return 2;
    }
    lua_pushlstring(L, (const char *)out, out_len);
    return 1;
}

void rw_digest_register(lua_State *L)
{
    static const luaL_Reg metamethods[] = {
        { "__call", digest_l_call },
        { "__gc", digest_l_gc },
        { NULL, NULL }
    };
    luaL_newmetatable(L, DIGEST_MT);
    luaL_setfuncs(L, metamethods, 0);
    lua_pop(L, 1);
    lua_pushcfunction(L, digest_l_digest);
    lua_setfield(L, -2, "digest");
    lua_pushcfunction(L, digest_l_new);
    lua_setfield(L, -2, "digester");
}
