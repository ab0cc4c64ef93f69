# ratewise: build, test, demo and benchmark.
# `make demo` and `make test` do all the set-up on a fresh Debian 12 machine.

# The interpreter: lua5.4 (the default), lua5.3, lua5.2, lua5.1 or luajit (OpenResty's
# LuaJIT 2.1 from Debian's luajit2: never Debian's luajit package, which
# removes nginx's Lua module). Each builds into a folder of its own, so that
# builds never mix: `make test LUA=luajit` builds build-luajit/ and runs the
# whole suite under luajit.
LUA       ?= lua5.4
ifeq ($(LUA),lua5.4)
  LUA_PKG := lua5.4
  DEB_LUA := lua5.4 liblua5.4-dev
  BUILD   ?= build$(VARIANT)
else ifeq ($(LUA),lua5.3)
  LUA_PKG := lua5.3
  DEB_LUA := lua5.3 liblua5.3-dev
  BUILD   ?= build-lua5.3$(VARIANT)
else ifeq ($(LUA),lua5.2)
  # (mpv's Lua; lua-compat-5.3's header is in Lua 5.2's folder)
  LUA_PKG := lua5.2
  DEB_LUA := lua5.2 liblua5.2-dev lua-compat53-dev
  BUILD   ?= build-lua5.2$(VARIANT)
else ifeq ($(LUA),lua5.1)
  LUA_PKG := lua5.1
  DEB_LUA := lua5.1 liblua5.1-0-dev lua-compat53-dev
  BUILD   ?= build-lua5.1$(VARIANT)
else ifeq ($(LUA),luajit)
  LUA_PKG := luajit # the pkg-config name, from libluajit2-5.1-dev
  # lua-compat-5.3's header lives with Lua 5.1's, searched after LuaJIT's own.
  LUA_EXTRA_INC := -I/usr/include/lua5.1
  DEB_LUA := luajit2 libluajit2-5.1-dev lua-compat53-dev
  BUILD   ?= build-luajit$(VARIANT)
else
  $(error LUA must be lua5.4, lua5.3, lua5.2, lua5.1 or luajit (got $(LUA)))
endif

# The OS wait (src/poller.c): POLLER=epoll (Linux's default) or poll (any
# POSIX system's; the default elsewhere). REDIS=0 builds without hiredis:
# rw.redis_bucket then takes only a client object (such as resty.redis).
# Each variant builds into a folder of its own: `make test POLLER=poll`
# into build-poll/, `make test REDIS=0` into build-noredis/.
UNAME     := $(shell uname -s)
POLLER    ?= $(if $(filter Linux,$(UNAME)),epoll,poll)
REDIS     ?= 1
ifeq ($(POLLER),epoll)
  POLLER_DEF := -DRW_POLLER_EPOLL
else ifeq ($(POLLER),poll)
  POLLER_DEF := -DRW_POLLER_POLL
else
  $(error POLLER must be epoll or poll (got $(POLLER)))
endif
ifneq ($(REDIS),$(filter $(REDIS),0 1))
  $(error REDIS must be 0 or 1 (got $(REDIS)))
endif
VARIANT   := $(if $(filter Linux,$(UNAME)),$(if $(filter poll,$(POLLER)),-poll),$(if $(filter epoll,$(POLLER)),-epoll))$(if $(filter 0,$(REDIS)),-noredis)
CC        ?= cc
PKG_LUA    = $(shell pkg-config --cflags $(LUA_PKG) 2>/dev/null) $(LUA_EXTRA_INC)
PKG_LUA_LIBS = $(shell pkg-config --libs $(LUA_PKG) 2>/dev/null)
PKG_CURL_CFLAGS = $(shell pkg-config --cflags libcurl 2>/dev/null)
PKG_CURL_LIBS   = $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)
WARN      := -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes -Wstrict-prototypes \
             -Wpointer-arith -Wcast-qual -Wformat=2 -Wundef
CFLAGS    ?= -O2 -g
ALL_CFLAGS = -std=c99 -D_POSIX_C_SOURCE=200809L -fPIC -fvisibility=hidden $(WARN) \
             $(POLLER_DEF) $(REDIS_DEF) $(PKG_LUA) $(PKG_CURL_CFLAGS) $(CFLAGS)
LDFLAGS   ?=
# Not -llua5.4: the lua5.4 binary already contains Lua, a second copy breaks it.
REDIS_DEF := $(if $(filter 0,$(REDIS)),-DRW_NO_REDIS)
REDIS_LIB := $(if $(filter 1,$(REDIS)),-lhiredis)
# zlib, libbrotlidec and libzstd: the engine decodes Content-Encoding itself
# (src/decode.c).
DECODE_LIBS := -lz -lbrotlidec -lzstd
# libcrypto (OpenSSL): rw.client's request keys are SipHash digests (src/digest.c).
# libssl: what ALPN agreed on, read as the TLS handshake ends (src/transfer.c).
CRYPTO_LIBS := -lssl -lcrypto
# POSIX threads: the engine's wake-up line has a helper thread (src/wake.c).
THREAD_LIBS := -pthread
LIBS      = $(PKG_CURL_LIBS) $(REDIS_LIB) $(DECODE_LIBS) $(CRYPTO_LIBS) $(THREAD_LIBS) -lm
# A module is a bundle on macOS, whose symbols from Lua are found at load.
SHARED    := $(if $(filter Darwin,$(UNAME)),-bundle -undefined dynamic_lookup,-shared)

CORE      := $(BUILD)/ratewise/core.so
# examples/host.c built for this interpreter (examples/host is the default's)
HOST      := $(BUILD)/host
SRC       := $(wildcard src/*.c)
HDR       := $(wildcard src/*.h)

# Run from the work tree: our Lua modules and the freshly built core first.
LUA_ENV   = LUA_PATH="./lua/?.lua;./lua/?/init.lua;./?.lua;;" LUA_CPATH="./$(BUILD)/?.so;;"

# Debian packages each target needs; installed by `make deps` when missing.
DEB_BUILD := gcc make pkg-config $(DEB_LUA) libcurl4-openssl-dev $(if $(filter 1,$(REDIS)),libhiredis-dev) \
             zlib1g-dev libbrotli-dev libzstd-dev libssl-dev
# The hosts the suite runs ratewise in: OpenResty (nginx with the Lua
# module, whose LuaJIT is luajit2's), cqueues, luv, and LÖVE (on the same
# LuaJIT) under a virtual X server.
DEB_HOSTS := nginx libnginx-mod-http-lua lua-resty-core luajit2 libluajit2-5.1-dev lua-compat53-dev \
             lua-cqueues lua-luv lua-nginx-redis love xvfb
DEB_TEST  := lua-busted lua-socket lua-cjson python3 openssl redis-server redis-sentinel brotli zstd nghttp2-server $(DEB_HOSTS)
# spec/limit_window_spec.lua runs the limiters against HAProxy's stick table.
DEB_TEST  += haproxy
# spec/nvim_spec.lua runs a plugin in Neovim (whose LuaJIT is luajit2's).
DEB_TEST  += neovim
# The embedded-Lua hosts the suite runs ratewise in for real (spec/host_*_spec.lua),
# each on the Lua it links: HAProxy (above), Apache's mod_lua and WeeChat
# (Lua 5.3), Prosody (5.4), Tarantool (its LuaJIT) and mpv (5.2). Installed
# without their recommends (WeeChat's would bring Ruby, mpv's a desktop);
# none removes a package (apt-get -s).
DEB_REAL_HOSTS := apache2 weechat-headless weechat-lua prosody tarantool mpv \
                  lua5.3 liblua5.3-dev lua5.2 liblua5.2-dev lua-compat53-dev
DEB_TOOLS := lua-check luarocks
# For lint, fuzz, test-asan and test-valgrind (`make deps-check`);
# libclang-rt-14-dev has libFuzzer and the sanitizer runtimes.
DEB_CHECK := clang libclang-rt-14-dev clang-tidy cppcheck valgrind \
             lua5.1 liblua5.1-0-dev lua5.2 liblua5.2-dev lua5.3 liblua5.3-dev luajit2 libluajit2-5.1-dev \
             lua-compat53-dev

.PHONY: all deps deps-build deps-check test demo bench examples install lint clean soak nvim \
        fuzz test-asan test-valgrind luajit-core nvim-core host-cores bench-hosts bench-rate bench-redis bench-http2 \
        bench-openresty bench-baseline bench-instructions bench-fast-paths bench-peers \
        bench-llm

all: $(CORE)

$(CORE): $(SRC) $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(SHARED) -o $@ $(SRC) $(LDFLAGS) $(LIBS)

# Installs the Debian packages that are missing (needs root, as on a fresh machine).
define install_missing
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) $$missing >/dev/null; \
	fi
endef

deps:
	$(call install_missing,$(DEB_BUILD) $(DEB_TEST) $(DEB_TOOLS))
	$(call install_missing,$(DEB_REAL_HOSTS),--no-install-recommends)

deps-build:
	$(call install_missing,$(DEB_BUILD) luarocks)

deps-check:
	$(call install_missing,$(DEB_CHECK))

# --ignore-lua: .busted names lua5.4, which would re-run busted under it;
# RATEWISE_* tell the specs how to start this interpreter, this build and
# this host in processes of their own, and how to build C against this Lua.
SPEC_ENV = RATEWISE_LUA="$$(command -v $(LUA))" RATEWISE_CPATH="./$(BUILD)/?.so" RATEWISE_HOST="$(HOST)" \
           RATEWISE_LUA_CFLAGS="$(PKG_LUA)" RATEWISE_LUA_LIBS="$(PKG_LUA_LIBS)" \
           RATEWISE_CORE_CFLAGS="$(POLLER_DEF) $(REDIS_DEF)" RATEWISE_CORE_LIBS="$(PKG_CURL_LIBS) $(REDIS_LIB) $(DECODE_LIBS) $(CRYPTO_LIBS) $(THREAD_LIBS) -lm" \
           RATEWISE_LUAJIT_CPATH="./$(LUAJIT_BUILD)/?.so" RATEWISE_REAL_HOSTS=$(REAL_HOSTS)
# The real-host specs run in the default build only (Lua 5.4, epoll, Redis):
# the other variants change nothing a host loads. They load the core built
# for the Lua each host links.
REAL_HOSTS := $(if $(and $(filter lua5.4,$(LUA)),$(if $(VARIANT),,yes)),1,0)
host-cores: luajit-core
	@$(MAKE) -s --no-print-directory LUA=lua5.3 build-lua5.3/ratewise/core.so
	@$(MAKE) -s --no-print-directory LUA=lua5.2 build-lua5.2/ratewise/core.so
# spec/openresty_spec.lua runs nginx's Lua module, and spec/love_spec.lua
# LÖVE, both LuaJIT: they load the LuaJIT build of the core (of the same
# variant), whichever Lua the suite runs under.
LUAJIT_BUILD := build-luajit$(VARIANT)
LUAJIT_CORE := $(LUAJIT_BUILD)/ratewise/core.so
luajit-core:
	@$(MAKE) -s --no-print-directory LUA=luajit BUILD=$(LUAJIT_BUILD) $(LUAJIT_CORE)

# A Neovim plugin tree in this checkout (lazy.nvim: build = "make nvim"):
# the core built against LuaJIT where Neovim's runtimepath loader looks for
# it, lua/ratewise/core.so (git-ignored). A new file takes the old one's
# name (mv): a Neovim that has the old one loaded keeps it, where writing
# over it in place would crash that Neovim.
# Without hiredis unless asked (`make nvim REDIS=1`): a plugin rarely
# shares a limit through Redis, and an editor's machine seldom has
# hiredis' headers.
NVIM_CORE := lua/ratewise/core.so
NVIM_REDIS := $(if $(filter file,$(origin REDIS)),0,$(REDIS))
nvim:
	@$(MAKE) -s --no-print-directory LUA=luajit REDIS=$(NVIM_REDIS) nvim-core
nvim-core: $(CORE)
	@cmp -s $(CORE) $(NVIM_CORE) || { cp $(CORE) $(NVIM_CORE).new && mv -f $(NVIM_CORE).new $(NVIM_CORE); }

# SPECS names a part of the suite: `make test SPECS="spec/cli_spec.lua"`.
SPECS ?= spec/
test: deps $(CORE) $(HOST) luajit-core nvim $(if $(filter 1,$(REAL_HOSTS)),host-cores)
	$(LUA_ENV) $(SPEC_ENV) $(LUA) /usr/bin/busted --ignore-lua --cpath="./$(BUILD)/?.so" \
	  -o spec/support/summary.lua $(SPECS)

demo: deps $(CORE)
	@$(LUA_ENV) $(LUA) examples/demo.lua

# examples/host embeds Lua itself, so it links the Lua library (the module
# does not).
examples: examples/host

examples/host: examples/host.c $(CORE)
	$(CC) -std=c99 $(WARN) $(PKG_LUA) $(CFLAGS) -o $@ examples/host.c $(PKG_LUA_LIBS) -lm

$(HOST): examples/host.c $(CORE)
	$(CC) -std=c99 $(WARN) $(PKG_LUA) $(CFLAGS) -o $@ examples/host.c $(PKG_LUA_LIBS) -lm

# The soak (bench/soak.lua): requests through a fault-injecting server;
# CI runs it with SOAK_REQUESTS=1000.
SOAK_REQUESTS ?= 10000
soak: deps $(CORE)
	@SOAK_REQUESTS=$(SOAK_REQUESTS) $(LUA_ENV) $(LUA) bench/soak.lua

bench: deps $(CORE)
	@$(MAKE) -s -C bench
	@$(LUA_ENV) $(LUA) bench/run.lua

# This tree against an earlier revision (BASELINE_REV, by default the last
# one before the waiting seam's engine), the 64-task loop and the
# sequential loop, in alternating rounds (bench/baseline.lua): a regression
# told apart from the machine's noise.
bench-baseline: deps $(CORE)
	@$(LUA_ENV) $(LUA) bench/baseline.lua

# Each shape's instructions a request, ratewise against plain libcurl, as
# valgrind's callgrind counts them (bench/instructions.lua): a figure that a
# busy machine does not move, beside `make bench`'s rates.
bench-instructions: deps $(CORE) luajit-core
	@$(MAKE) -s -C bench
	@$(LUA_ENV) $(LUA) bench/instructions.lua

# What fetch's and rw.client's fast-path caches are worth in wall time:
# ratewise against itself with RATEWISE_FAST_PATHS=off, in alternating
# rounds (bench/fast_paths.lua). Issue 38 keeps a cache only where this
# shows more than 5 %.
bench-fast-paths: deps $(CORE)
	@$(LUA_ENV) $(LUA) bench/fast_paths.lua

# The share of a rate-limited server's rate each limiter gets, and the
# share of 429s (bench/ratelimit.lua): a private nginx at 200 requests/s
# (a token bucket, and its limit_req), HAProxy's stick table (haproxy,
# which the suite needs too), and the fixed windows of express-rate-limit
# and @fastify/rate-limit (bench/fixed_window, node; npm ci installs the
# versions of its package-lock.json); beside ratewise, the peers of
# bench-peers with no limiter (bench/peers, and Debian's python3-httpx and
# python3-tenacity). Then one shared limit through a Sentinel failover
# (bench/redis_failover.lua), with on_error "local" and "closed".
# Debian's nodejs and npm, unless node and npm are there already (a
# NodeSource nodejs holds npm, and Debian's npm would conflict with it).
DEB_BENCH_RATE := nodejs npm
bench-rate: deps $(CORE)
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  echo "installing Debian packages: $(DEB_BENCH_RATE)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_BENCH_RATE) >/dev/null; \
	fi
	@test -d bench/fixed_window/node_modules || \
	  (cd bench/fixed_window && npm ci --no-audit --no-fund --loglevel=error)
	@test -d bench/peers/node_modules || \
	  (cd bench/peers && npm ci --no-audit --no-fund --loglevel=error)
	$(call install_missing,$(DEB_BENCH_PEERS_PY))
	@$(LUA_ENV) $(SPEC_ENV) $(LUA) bench/ratelimit.lua
	@for on_error in local closed; do \
	  BENCH_FAILOVER_ON_ERROR=$$on_error $(LUA_ENV) $(SPEC_ENV) $(LUA) bench/redis_failover.lua || exit 1; \
	done

# The share of an LLM API's token limit ratewise gets, and its 429s
# (bench/llm.lua): 600 chat requests against the test server's mock of
# OpenAI's and Anthropic's rate limits, streamed and not, through
# rw.client with the provider and named limits, beside the OpenAI
# cookbook's parallel-processor algorithm, and in two processes sharing
# the limits through rw.redis_bucket (a private redis-server).
bench-llm: deps $(CORE)
	@$(LUA_ENV) $(SPEC_ENV) $(LUA) bench/llm.lua

# ratewise against the peers users of other languages write, in wall time
# on a private loopback nginx (bench/peers.lua): Node's undici in p-retry
# (bench/peers, npm ci installs the versions of its package-lock.json),
# Python's httpx in tenacity (Debian's python3-httpx and python3-tenacity)
# and plain libcurl, one call at a time and 64 in flight. Node as for
# bench-rate. When the Python packages cannot be installed, make says the
# error is ignored and bench/peers.lua reports the Python peer as not run.
DEB_BENCH_PEERS_PY := python3-httpx python3-tenacity
bench-peers: deps $(CORE)
	@$(MAKE) -s -C bench
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
	  echo "installing Debian packages: $(DEB_BENCH_RATE)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEB_BENCH_RATE) >/dev/null; \
	fi
	@test -d bench/peers/node_modules || \
	  (cd bench/peers && npm ci --no-audit --no-fund --loglevel=error)
	-$(call install_missing,$(DEB_BENCH_PEERS_PY))
	@$(LUA_ENV) $(LUA) bench/peers.lua

# What one acquire of rw.redis_bucket costs next to redis-benchmark's
# EVALSHA on the same private redis-server (bench/redis.lua).
bench-redis: deps $(CORE)
	@$(LUA_ENV) $(SPEC_ENV) $(LUA) bench/redis.lua

# The 64-task loop over HTTPS, HTTP/2 and HTTP/1.1, small and 64 KiB
# answers, each against plain libcurl (bench/multi_curl64) in alternating
# rounds (bench/http2.lua).
bench-http2: deps $(CORE)
	@$(MAKE) -s -C bench
	@$(LUA_ENV) $(SPEC_ENV) $(LUA) bench/http2.lua

# Issue 15's shapes inside an OpenResty worker (nginx's Lua module, LuaJIT,
# the core of build-luajit/), each against plain libcurl (bench/openresty.lua).
bench-openresty: deps $(CORE) luajit-core
	@$(MAKE) -s -C bench
	@$(LUA_ENV) $(SPEC_ENV) $(LUA) bench/openresty.lua

# What waiting costs in each host (bench/hosts.lua): 1,000 requests on a
# slow server per host, and rw.step(0) in a frame loop.
bench-hosts: deps $(CORE) luajit-core
	@ulimit -n 20000 2>/dev/null; $(LUA_ENV) $(SPEC_ENV) $(LUA) bench/hosts.lua

# luacheck (config .luacheckrc), the one writer of each field of struct
# transfer (spec/support/writers.lua: the file src/transfer.h names), then
# clang-tidy (checks and the reasons for each exclusion in .clang-tidy) and
# cppcheck on src/; any finding fails.
# cppcheck gets no -I for Lua (its many configurations make cppcheck give
# up, "toomanyconfigs"); --library teaches it Lua's, libcurl's and POSIX's
# functions instead, so the project's own headers are all it must find.
TIDY_FLAGS = -std=c99 -D_POSIX_C_SOURCE=200809L $(PKG_LUA) $(PKG_CURL_CFLAGS)
CPPCHECK_FLAGS := --std=c99 -D_POSIX_C_SOURCE=200809L --library=posix,lua,libcurl \
                  --enable=warning,style,performance,portability --inline-suppr \
                  --suppress=missingIncludeSystem --suppress=missingInclude \
                  --error-exitcode=1 --quiet

# Every Lua ratewise supports, the folder `make LUA=...` builds it into, and
# the command that checks a file parses there.
LUAS := lua5.1:build-lua5.1:luac5.1 lua5.2:build-lua5.2:luac5.2 lua5.3:build-lua5.3:luac5.3 lua5.4:build:luac5.4 luajit:build-luajit:/usr/bin/luajit
lint: deps deps-check
	luacheck --no-color lua spec bench examples bin types
	$(LUA) spec/support/writers.lua src
	@# Under every Lua: lua/ parses, the C core builds (-Werror) and ratewise runs (spec/support/smoke.lua).
	@for entry in $(LUAS); do \
	  lua=$${entry%%:*}; rest=$${entry#*:}; dir=$${rest%%:*}; parse=$${rest#*:}; \
	  for f in $$(find lua -name '*.lua'); do \
	    if [ "$$lua" = luajit ]; then $$parse -bl "$$f" >/dev/null || exit 1; else $$parse -p "$$f" || exit 1; fi; \
	  done; \
	  $(MAKE) -s --no-print-directory LUA=$$lua BUILD=$$dir$(VARIANT) all || exit 1; \
	  LUA_PATH="./lua/?.lua;./lua/?/init.lua;;" LUA_CPATH="./$$dir$(VARIANT)/?.so;;" $$lua spec/support/smoke.lua || exit 1; \
	done
	@# Under Lua 5.4, the poll(2) backend and the build without Redis too.
	@for variant in poll:POLLER=poll noredis:REDIS=0; do \
	  dir=build-$${variant%%:*}; \
	  $(MAKE) -s --no-print-directory LUA=lua5.4 $${variant#*:} BUILD=$$dir all || exit 1; \
	  printf '%s: ' "$${variant#*:}"; \
	  LUA_PATH="./lua/?.lua;./lua/?/init.lua;;" LUA_CPATH="./$$dir/?.so;;" lua5.4 spec/support/smoke.lua || exit 1; \
	done
	@# Each backend's code, and the core without Redis.
	@for defs in -DRW_POLLER_EPOLL "-DRW_POLLER_POLL -DRW_NO_REDIS"; do \
	  echo "clang-tidy src/*.c $$defs"; \
	  out=$$(clang-tidy --quiet $(SRC) -- $(TIDY_FLAGS) $$defs 2>&1); rc=$$?; \
	  printf '%s\n' "$$out" | grep -v -e 'warnings\? generated\.$$' -e '^$$' || true; \
	  [ $$rc -eq 0 ] || exit $$rc; \
	  echo "cppcheck src/ $$defs"; \
	  cppcheck $(CPPCHECK_FLAGS) $$defs src/ || exit 1; \
	done
	@echo "clang-tidy, cppcheck: no findings"

# luarocks leaves ./ratewise/core.so and src/*.o behind; a stray
# ./ratewise/core.so would shadow the installed module through the cpath.
# --deps-mode=none: the rockspec lists lua-cjson, which `deps` installs as a
# Debian package that luarocks does not see; without it luarocks would try
# to download the rock (and fail offline).
# LuaJIT loads Lua 5.1 modules: its rocks go to luarocks' 5.1 tree (which
# LuaJIT searches too), built against LuaJIT's own headers.
# Installs what the build needs, never the suite's servers: the C core,
# lua/ratewise and bin/ratewise, through luarocks into its system tree or
# TREE=dir (`luarocks --tree`); with REDIS=0 the rock without Redis
# (rockspec/ratewise-noredis-scm-1.rockspec). PREFIX=dir copies the same
# files without luarocks: PREFIX/lib/lua/V/, PREFIX/share/lua/V/,
# PREFIX/bin/ (DESTDIR first, for packagers; the command runs under LUA).
# luarocks builds with its own flags: POLLER=poll reaches it as a define in
# CFLAGS. luarocks' builtin copies all of lua/: `make nvim`'s LuaJIT core is
# set aside meanwhile, so that it does not land among the installed Lua
# files (nor does the copy take it).
LUA_V     = $(if $(filter luajit,$(LUA)),5.1,$(subst lua,,$(LUA)))
ROCKS_LUA = $(LUA_V)$(if $(filter luajit,$(LUA)), LUA_INCDIR=/usr/include/luajit-2.1)
ROCKSPEC  = rockspec/ratewise$(if $(filter 0,$(REDIS)),-noredis)-scm-1.rockspec
ROCKS_CFLAGS = $(if $(filter command line,$(origin POLLER)),CFLAGS="-O2 -fPIC $(POLLER_DEF)")
install: deps-build
ifdef PREFIX
install: $(CORE)
	install -d $(DESTDIR)$(PREFIX)/lib/lua/$(LUA_V)/ratewise $(DESTDIR)$(PREFIX)/share/lua/$(LUA_V) $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(CORE) $(DESTDIR)$(PREFIX)/lib/lua/$(LUA_V)/ratewise/core.so
	cp -R lua/ratewise $(DESTDIR)$(PREFIX)/share/lua/$(LUA_V)/
	rm -f $(DESTDIR)$(PREFIX)/share/lua/$(LUA_V)/$(NVIM_CORE:lua/%=%)*
	sed '1s|.*|#!/usr/bin/env $(LUA)|' bin/ratewise > $(DESTDIR)$(PREFIX)/bin/ratewise
	chmod 755 $(DESTDIR)$(PREFIX)/bin/ratewise
else
	@if [ -e $(NVIM_CORE) ]; then mv -f $(NVIM_CORE) $(NVIM_CORE).aside; fi; \
	luarocks --lua-version $(ROCKS_LUA) $(if $(TREE),--tree $(TREE)) make --deps-mode=none $(ROCKSPEC) $(ROCKS_CFLAGS); \
	rc=$$?; if [ -e $(NVIM_CORE).aside ]; then mv -f $(NVIM_CORE).aside $(NVIM_CORE); fi; \
	rm -rf ratewise src/*.o; exit $$rc
endif

# ---- fuzzing: one libFuzzer target per parser of src/parse.c (fuzz/) ----
# `make fuzz FUZZ_SECONDS=600` for a long run; each target prints one line.
CLANG        ?= clang
FUZZ_SECONDS ?= 30
FUZZ_TARGETS := retry_after http_date seconds duration rfc3339 backoff headers sse redis_reply decode link
FUZZ_BUILD   := build-fuzz
FUZZ_BINS    := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
FUZZ_CFLAGS   = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
                -std=c99 -D_DEFAULT_SOURCE $(WARN) -Isrc

# parse.c is plain C (its Lua bindings are in lparse.c): no Lua, no libcurl.
$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz.h fuzz/fuzz_nows.h src/parse.c src/ratewise.h Makefile | deps-check
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -o $@ $< src/parse.c -lm

# sse.c is plain C too (its binding is in lparse.c).
$(FUZZ_BUILD)/fuzz_sse: fuzz/fuzz_sse.c fuzz/fuzz.h src/sse.c src/ratewise.h Makefile | deps-check
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -o $@ $< src/sse.c -lm

# What src/redis.c reads goes through hiredis's reader: the target fuzzes
# that, as redis.c uses it.
$(FUZZ_BUILD)/fuzz_redis_reply: fuzz/fuzz_redis_reply.c fuzz/fuzz.h src/redis_reader.c src/redis_reader.h Makefile | deps-check
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -o $@ $< src/redis_reader.c -lhiredis -lm

# decode.c is plain C too, on zlib, libbrotlidec and libzstd; the target
# compresses with zlib, libbrotlienc and libzstd to check what comes back.
$(FUZZ_BUILD)/fuzz_decode: fuzz/fuzz_decode.c fuzz/fuzz.h src/decode.c src/decode.h Makefile | deps-check
	@mkdir -p $(dir $@)
	$(CLANG) $(FUZZ_CFLAGS) -o $@ $< src/decode.c -lbrotlienc $(DECODE_LIBS) -lm

fuzz: $(FUZZ_BINS)
	@failed=""; for t in $(FUZZ_TARGETS); do \
	  sh fuzz/run.sh $$t $(FUZZ_SECONDS) $(FUZZ_BUILD) || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failures in$$failed"; exit 1; fi

# ---- the spec suite under AddressSanitizer + UndefinedBehaviorSanitizer ----
# The C core is built with clang into build-asan/ (never mixed with build/).
# lua5.4 is not instrumented, so the ASan runtime must be loaded first: the
# dynamic loader's --preload does that for lua5.4 alone, where LD_PRELOAD
# would be inherited by every process the specs start (the python test
# server, sh, timeout, examples/host, other lua5.4s).
# -z nodelete: lua_close unloads C modules, after which LeakSanitizer can
# neither name our frames nor see libcurl's global state as reachable;
# keeping the module (and so libcurl) mapped needs no leak suppressions.
# Subprocesses of the specs load ./build/?.so with a plain lua5.4 and are
# not instrumented; RATEWISE_LUA, RATEWISE_CPATH and RATEWISE_HOST say how
# to run them instrumented, for specs that read them.
ASAN_BUILD   := build-asan
ASAN_CORE    := $(ASAN_BUILD)/ratewise/core.so
ASAN_HOST    := $(ASAN_BUILD)/host
# -DRW_STACK_CHECK: every C entry point checks its Lua stack balance, and
# the helpers theirs (src/ratewise.h); a broken promise aborts the run.
ASAN_CFLAGS  := -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
                -DRW_STACK_CHECK
ASAN_LDFLAGS := -Wl,-z,nodelete
LDSO         := /lib64/ld-linux-x86-64.so.2
ASAN_LUA      = $(LDSO) --preload $$($(CLANG) -print-file-name=libclang_rt.asan-x86_64.so) $$(command -v $(LUA))
ASAN_ENV      = ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:halt_on_error=1 \
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
                RATEWISE_LUA="$(ASAN_LUA)" RATEWISE_CPATH="./$(ASAN_BUILD)/?.so" RATEWISE_HOST="$(ASAN_HOST)"

$(ASAN_CORE): $(SRC) $(HDR) Makefile | deps-check
	@mkdir -p $(dir $@)
	$(CLANG) $(ALL_CFLAGS) $(ASAN_CFLAGS) -shared -o $@ $(SRC) $(ASAN_LDFLAGS) $(LIBS)

$(ASAN_HOST): examples/host.c Makefile | deps-check
	@mkdir -p $(dir $@)
	$(CLANG) -std=c99 $(WARN) $(PKG_LUA) $(ASAN_CFLAGS) -o $@ examples/host.c $(shell pkg-config --libs lua5.4) -lm

# Any ASan, LeakSanitizer or UBSan report fails the run (exit status), as a
# failed spec does. --ignore-lua: .busted's `lua` would re-run busted
# through a plain lua5.4; --cpath puts build-asan/ before .busted's build/.
test-asan: deps $(CORE) examples $(ASAN_CORE) $(ASAN_HOST) luajit-core nvim
	LUA_PATH="./lua/?.lua;./lua/?/init.lua;./?.lua;;" LUA_CPATH="./$(ASAN_BUILD)/?.so;;" $(ASAN_ENV) \
	  $(ASAN_LUA) /usr/bin/busted --ignore-lua --cpath="./$(ASAN_BUILD)/?.so" -o spec/support/summary.lua spec/

# ---- the spec suite under valgrind memcheck (build/, as `make test` uses) ----
# Fails on an invalid access or a definite or indirect leak (exit 99), or a
# crash. Spec failures alone do not fail it: at valgrind's speed, specs
# that time a first TLS handshake (< 1 s) fail; `make test` judges specs.
# The whole suite takes about 80 s; VALGRIND_SPECS="spec/parse_spec.lua ..."
# runs a part.
# libcurl is preloaded so that unloading it at exit (lua_close) does not turn
# its global state into false "definitely lost" reports.
VALGRIND_SPECS ?= spec/
VALGRIND_FLAGS := -q --trace-children=no --leak-check=full --show-leak-kinds=definite,indirect \
                  --errors-for-leak-kinds=definite,indirect --error-exitcode=99 --num-callers=30

test-valgrind: deps deps-check $(CORE) examples luajit-core nvim
	@start=$$(date +%s); \
	$(LUA_ENV) LD_PRELOAD=libcurl.so.4 valgrind $(VALGRIND_FLAGS) $$(command -v $(LUA)) /usr/bin/busted \
	  --ignore-lua -o utfTerminal $(VALGRIND_SPECS); rc=$$?; \
	took=$$(( $$(date +%s) - start )); \
	case $$rc in \
	  0) echo "valgrind: no invalid access, no definite or indirect leak; every spec passed ($$took s)";; \
	  1) echo "valgrind: no invalid access, no definite or indirect leak ($$took s);" \
	          "spec failures above are for make test to judge (timing fails at valgrind's speed)";; \
	  99) echo "valgrind: memcheck errors above ($$took s)"; exit 1;; \
	  *) echo "valgrind: run ended with status $$rc ($$took s)"; exit 1;; \
	esac

clean:
	rm -rf build build-* $(BUILD) src/*.o ./*.so examples/host $(NVIM_CORE)
	@$(MAKE) -s -C bench clean 2>/dev/null || true
