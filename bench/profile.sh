#!/bin/bash
# bench/profile.sh: where rw.fetch spends its time next to plain libcurl.
#
# Counts user-space instructions per request under callgrind (deterministic,
# unlike wall time on a shared 2-core machine), for plain libcurl and for
# rw.fetch peeled layer by layer. Each figure is (Ir(3*K) - Ir(K)) / (2*K),
# which cancels start-up. Kernel time (the same syscalls for both: one send,
# one recv and 2-3 polls a request) is not counted.
# Run from the repository root after `make` (needs valgrind and liblua5.4-dev).
# Optional: K (default 500); keep the runs under a minute each, or libcurl's
# 60 s DNS cache expires in the middle and adds a one-off cost.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-500}
export LUA_PATH="./lua/?.lua;./lua/?/init.lua;;" LUA_CPATH="./build/?.so;;"

command -v valgrind >/dev/null || { echo "profile.sh: needs valgrind" >&2; exit 1; }
make -s -C bench profile-tools
dir=$(mktemp -d -t ratewise-profile.XXXXXX)
trap 'bash bench/nginx.sh stop "$dir"; rm -rf "$dir"' EXIT
port=$(bash bench/nginx.sh start "$dir")
url="http://127.0.0.1:$port/"
agent="ratewise/$(lua5.4 -e 'io.write(require("ratewise.core").version)')"

ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 | sed -n 's/.*Collected : //p'; }
per_op() { # label command... (the command takes the count where COUNT stands)
    local label=$1; shift
    local a b
    a=$(ir "${@/COUNT/$K}"); b=$(ir "${@/COUNT/$((3 * K))}")
    printf '  %-58s %8d\n' "$label" $(( (b - a) / (2 * K) ))
}

echo "user-space instructions per request (callgrind), loopback nginx, K=$K"
per_op "plain libcurl: curl_easy_perform, reused handle" bench/multi_curl "$url" COUNT easy "$agent"
per_op "libcurl multi, driven as src/engine.c does, in C" bench/multi_curl "$url" COUNT engine "$agent"
per_op "rw engine binding: start/poll/close, no result()" bench/lua_host bench/profile_ops.lua engine_noresult COUNT "$url"
per_op "rw engine binding with transfer:result()" bench/lua_host bench/profile_ops.lua engine COUNT "$url"
per_op "runtime.transfer (+ runtime/scheduler glue)" bench/lua_host bench/profile_ops.lua transfer COUNT "$url"
per_op "rw.fetch, whole call" bench/lua_host bench/profile_ops.lua fetch COUNT "$url"
per_op "fetch.lua alone (canned response, no I/O)" bench/lua_host bench/profile_ops.lua fetch_stub COUNT "$url"
per_op "  of which the canned response itself" bench/lua_host bench/profile_ops.lua stub_only COUNT "$url"
