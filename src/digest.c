/* core.digest(key, data): HMAC-SHA256 of data under key, by OpenSSL's
 * libcrypto (the library libcurl already loads for TLS here).
 *
 * What it is for: rw.client keys its de-duplication and its cache by a
 * request's identity, which includes secrets (an Authorization header, a
 * URL's userinfo, a proxy's password). The key the client keeps is this
 * digest, under a random key of the client's own, so that a secret takes
 * part in the comparison without being kept or printed, and no one who
 * does not know the client's key can make two requests collide. */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include "compat.h"
#include "ratewise.h"

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

void rw_digest_register(lua_State *L)
{
    lua_pushcfunction(L, digest_l_digest);
    lua_setfield(L, -2, "digest");
}
