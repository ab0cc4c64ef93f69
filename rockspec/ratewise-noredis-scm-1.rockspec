rockspec_format = "3.0"
-- ratewise without Redis support (`make REDIS=0`): no hiredis needed;
-- rw.redis_bucket takes a client object (resty.redis) but no redis:// URL.
package = "ratewise-noredis"
version = "scm-1"
source = {
   url = "git+file://.",
}
description = {
   summary = "Calls to rate-limited web APIs that wait the way the server asks",
   detailed = [[
ratewise classifies every response, turns the server's own hints (Retry-After,
x-ratelimit-reset) into waits that are never shorter than asked, falls back to
capped exponential backoff with jitter, never replays an unsafe request, and
keeps a client-side token bucket. A C core on libcurl; the waiting is in Lua.
]],
   license = "MIT",
}
-- lua-cjson makes res:json() fast (ratewise loads it on first use); without
-- it ratewise reads JSON with its own pure-Lua decoder. Debian's lua-cjson package is
-- not a rock luarocks can see, so an offline install from this tree passes
-- --deps-mode=none (as `make install` does) and relies on that package.
dependencies = {
   "lua >= 5.1",
   "lua-cjson",
}
external_dependencies = {
   -- Debian keeps curl.h in /usr/include/x86_64-linux-gnu, which luarocks does
   -- not search, so only the library is looked up.
   CURL = { library = "curl" },
   -- the engine decodes Content-Encoding itself (src/decode.c)
   ZLIB = { header = "zlib.h", library = "z" },
   BROTLIDEC = { header = "brotli/decode.h", library = "brotlidec" },
   ZSTD = { header = "zstd.h", library = "zstd" },
   -- rw.client's request keys: SipHash-2-4 (src/digest.c)
   OPENSSL = { header = "openssl/hmac.h", library = "crypto" },
   LIBSSL = { header = "openssl/ssl.h", library = "ssl" },
}
build = {
   type = "builtin",
   -- the command-line tool (lua/ratewise/cli.lua does the work)
   install = { bin = { ratewise = "bin/ratewise" } },
   -- Copied into the rock's directory (`luarocks show --rock-dir ratewise`):
   -- the docs, and the editor types (types/library, a LuaLS addon).
   copy_directories = { "docs", "types" },
   -- The Lua modules need no list: builtin copies the top-level lua/ folder,
   -- whose paths mirror the module names (ratewise/init.lua, ratewise/*.lua,
   -- ratewise/providers/*.lua, ratewise/hosts/*.lua, ratewise/cli/*.lua,
   -- ratewise/fetch/*.lua, ratewise/json/pure.lua).
   modules = {
      ["ratewise.core"] = {
         sources = { "src/bucket.c", "src/buf.c", "src/core.c", "src/decode.c", "src/digest.c", "src/engine.c", "src/gate.c", "src/json.c", "src/lparse.c", "src/options.c", "src/parse.c",
                     "src/request.c", "src/poller.c", "src/redirect.c", "src/response.c", "src/redis.c", "src/redis_reader.c", "src/sse.c",
                     "src/term.c", "src/transfer.c", "src/wake.c", "src/watch.c" },
         libraries = { "curl", "z", "brotlidec", "zstd", "ssl", "crypto", "pthread" },
         -- On Lua 5.1 and LuaJIT the C core needs lua-compat-5.3's header
         -- (Debian's lua-compat53-dev keeps it beside Lua 5.1's own).
         incdirs = { "$(CURL_INCDIR)", "/usr/include/x86_64-linux-gnu", "$(ZLIB_INCDIR)",
                     "$(BROTLIDEC_INCDIR)", "$(ZSTD_INCDIR)", "$(OPENSSL_INCDIR)", "$(LIBSSL_INCDIR)", "$(LUA_INCDIR)", "/usr/include/lua5.1" },
         libdirs = { "$(CURL_LIBDIR)", "$(ZLIB_LIBDIR)", "$(BROTLIDEC_LIBDIR)", "$(ZSTD_LIBDIR)", "$(OPENSSL_LIBDIR)", "$(LIBSSL_LIBDIR)" },
         defines = { "_POSIX_C_SOURCE=200809L", "RW_NO_REDIS" },
      },
   },
}
test = {
   type = "command",
   command = "make test REDIS=0",
}
