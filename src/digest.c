/* core.digest(key, data): HMAC-SHA256 of data under key, by OpenSSL's
 * libcrypto (the library libcurl already loads for TLS here).
 * core.digester(key): the same under one key, of a list of strings, with
 * the key's part of the work done once.
 *
 * What it is for: rw.client keys its de-duplication and its cache by a
 * request's identity, which includes secrets (an Authorization header, a
 * URL's userinfo, a proxy's password). The key the client keeps is this
 * digest, under a random key of the client's own, so that a secret takes
 * part in the comparison without being kept or printed, and no one who
 * does not know the client's key can make two requests collide. */
#include <stdint.h>
#include <string.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include "compat.h"
#include "ratewise.h"

#define DIGEST_MT "ratewise.digester"
#define DIGEST_BLOCK 64 /* SHA-256's block */
#define DIGEST_SIZE 32  /* and its output */
#define DIGEST_LENGTH_BYTES 10 /* the most a 64-bit length takes, 7 bits a byte */

static int digest_l_digest(lua_State *L)
{
    size_t key_len, data_len;
    const char *key = luaL_checklstring(L, 1, &key_len);
    const char *data = luaL_checklstring(L, 2, &data_len);
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int out_len = 0;
    luaL_argcheck(L, key_len >= 16 && key_len <= 64, 1, "must be 16 to 64 bytes");
    if (HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)data, data_len, out, &out_len) == NULL) {
        lua_pushnil(L);
        lua_pushliteral(L, "libcrypto could not compute HMAC-SHA256");
        return 2;
    }
    lua_pushlstring(L, (const char *)out, out_len);
    return 1;
}

/* HMAC (RFC 2104) kept as SHA-256 states: inner has absorbed the key's
 * block xor ipad, outer the key's block xor opad; each digest starts from
 * copies of them. */
typedef struct digester {
    EVP_MD_CTX *inner, *outer, *work;
} digester;

/* What is absorbed is gathered here and handed to libcrypto in pieces of
 * this size: one update per piece rather than two per string. */
typedef struct digest_feed {
    EVP_MD_CTX *ctx;
    size_t used;
    int ok;
    unsigned char buf[1024];
} digest_feed;

static void digest_feed_add(digest_feed *f, const void *p, size_t n)
{
    const unsigned char *bytes = (const unsigned char *)p;
    if (f->used + n > sizeof f->buf) {
        f->ok = f->ok && EVP_DigestUpdate(f->ctx, f->buf, f->used);
        f->used = 0;
        if (n > sizeof f->buf) {
            f->ok = f->ok && EVP_DigestUpdate(f->ctx, bytes, n);
            return;
        }
    }
    memcpy(f->buf + f->used, bytes, n);
    f->used += n;
}

static void digest_free(digester *d)
{
    EVP_MD_CTX_free(d->inner);
    EVP_MD_CTX_free(d->outer);
    EVP_MD_CTX_free(d->work);
    d->inner = d->outer = d->work = NULL;
}

static int digest_l_gc(lua_State *L)
{
    digest_free((digester *)luaL_checkudata(L, 1, DIGEST_MT));
    return 0;
}

/* Starts ctx on the key's block xor pad. */
static int digest_start(EVP_MD_CTX *ctx, const unsigned char *key, size_t key_len, unsigned char pad)
{
    unsigned char block[DIGEST_BLOCK];
    size_t i;
    for (i = 0; i < DIGEST_BLOCK; i++) block[i] = (unsigned char)((i < key_len ? key[i] : 0) ^ pad);
    return EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, block, sizeof block);
}

/* d = core.digester(key): key is 16 to 64 bytes (no longer than a block,
 * so it is used as it is, as HMAC does with such a key). */
static int digest_l_new(lua_State *L)
{
    size_t key_len;
    const unsigned char *key = (const unsigned char *)luaL_checklstring(L, 1, &key_len);
    digester *d;
    luaL_argcheck(L, key_len >= 16 && key_len <= 64, 1, "must be 16 to 64 bytes");
    d = (digester *)lua_newuserdatauv(L, sizeof *d, 0);
    d->inner = d->outer = d->work = NULL;
    luaL_setmetatable(L, DIGEST_MT);
    d->inner = EVP_MD_CTX_new();
    d->outer = EVP_MD_CTX_new();
    d->work = EVP_MD_CTX_new();
    if (d->inner == NULL || d->outer == NULL || d->work == NULL || !digest_start(d->inner, key, key_len, 0x36)
        || !digest_start(d->outer, key, key_len, 0x5c)) {
        digest_free(d);
        lua_pushnil(L);
        lua_pushliteral(L, "libcrypto could not start HMAC-SHA256");
        return 2;
    }
    return 1;
}

/* mac = d(parts): HMAC-SHA256 under d's key of the strings of the array
 * parts, each taken as its length (LEB128: 7 bits a byte, least
 * significant first, the high bit set on all but the last) and then its
 * bytes, so that no two lists of strings give the same data: the
 * same as core.digest(key, data) of those bytes. */
static int digest_l_call(lua_State *L)
{
    digester *d = (digester *)luaL_checkudata(L, 1, DIGEST_MT);
    digest_feed f;
    unsigned char inner[EVP_MAX_MD_SIZE], out[EVP_MAX_MD_SIZE];
    unsigned int inner_len = 0, out_len = 0;
    lua_Integer i, n;
    luaL_checktype(L, 2, LUA_TTABLE);
    luaL_argcheck(L, d->inner != NULL, 1, "no longer usable");
    n = (lua_Integer)lua_rawlen(L, 2);
    f.ctx = d->work;
    f.used = 0;
    f.ok = EVP_MD_CTX_copy_ex(d->work, d->inner);
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
    if (f.used > 0) f.ok = f.ok && EVP_DigestUpdate(d->work, f.buf, f.used);
    if (!f.ok || !EVP_DigestFinal_ex(d->work, inner, &inner_len) || !EVP_MD_CTX_copy_ex(d->work, d->outer)
        || !EVP_DigestUpdate(d->work, inner, inner_len) || !EVP_DigestFinal_ex(d->work, out, &out_len)) {
        lua_pushnil(L);
        lua_pushliteral(L, "libcrypto could not compute HMAC-SHA256");
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
