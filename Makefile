# ratewise: build, test, demo and benchmark.
# `make demo` and `make test` do all the set-up on a fresh Debian 12 machine.

LUA       ?= lua5.4
CC        ?= cc
PKG_LUA   := $(shell pkg-config --cflags lua5.4 2>/dev/null)
PKG_CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
PKG_CURL_LIBS   := $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)
WARN      := -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes -Wstrict-prototypes \
             -Wpointer-arith -Wcast-qual -Wformat=2 -Wundef
CFLAGS    ?= -O2 -g
ALL_CFLAGS = -std=c99 -D_POSIX_C_SOURCE=200809L -fPIC -fvisibility=hidden $(WARN) \
             $(PKG_LUA) $(PKG_CURL_CFLAGS) $(CFLAGS)
LDFLAGS   ?=
# Not -llua5.4: the lua5.4 binary already contains Lua, a second copy breaks it.
LIBS      = $(PKG_CURL_LIBS) -lm

BUILD     := build
CORE      := $(BUILD)/ratewise/core.so
SRC       := $(wildcard src/*.c)
HDR       := $(wildcard src/*.h)

# Run from the work tree: our Lua modules and the freshly built core first.
LUA_ENV   = LUA_PATH="./lua/?.lua;./lua/?/init.lua;./?.lua;;" LUA_CPATH="./$(BUILD)/?.so;;"

# Debian packages each target needs; installed by `make deps` when missing.
DEB_BUILD := gcc make pkg-config lua5.4 liblua5.4-dev libcurl4-openssl-dev
DEB_TEST  := lua-busted lua-socket lua-cjson python3 openssl
DEB_TOOLS := lua-check luarocks

.PHONY: all deps test demo bench examples install lint clean

all: $(CORE)

$(CORE): $(SRC) $(HDR) Makefile
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -o $@ $(SRC) $(LDFLAGS) $(LIBS)

# Installs the Debian packages that are missing (needs root, as on a fresh machine).
deps:
	@missing=""; for p in $(DEB_BUILD) $(DEB_TEST) $(DEB_TOOLS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

test: deps $(CORE) examples
	$(LUA_ENV) $(LUA) /usr/bin/busted -o spec/support/summary.lua spec/

demo: deps $(CORE)
	@$(LUA_ENV) $(LUA) examples/demo.lua

# examples/host embeds Lua itself, so it links liblua5.4 (the module does not).
examples: examples/host

examples/host: examples/host.c $(CORE)
	$(CC) -std=c99 $(WARN) $(PKG_LUA) $(CFLAGS) -o $@ examples/host.c $(shell pkg-config --libs lua5.4) -lm

bench: deps $(CORE)
	@$(MAKE) -s -C bench
	@$(LUA_ENV) $(LUA) bench/run.lua

lint: deps
	luacheck --no-color lua spec bench examples

# luarocks leaves ./ratewise/core.so and src/*.o behind; a stray
# ./ratewise/core.so would shadow the installed module through the cpath.
install: deps
	luarocks --lua-version 5.4 make rockspec/ratewise-scm-1.rockspec
	rm -rf ratewise src/*.o

clean:
	rm -rf $(BUILD) src/*.o ./*.so examples/host
	@$(MAKE) -s -C bench clean 2>/dev/null || true
