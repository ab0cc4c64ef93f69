#!/bin/bash
# bench/profile_conc.sh: where rw.fetch under 64 tasks spends its time next
# to one plain libcurl multi handle with 64 transfers in flight (the
# concurrent part of `make bench`).
#
# On loopback both contenders use one core to the full (nginx has the other),
# so their rates follow their CPU time per request. This splits that time:
#   1. user-space instructions per request under callgrind (deterministic),
#      for plain multi and for rw.fetch's stack peeled layer by layer
#      (bench/profile_conc.lua); each figure is (Ir(3K) - Ir(K)) / 2K;
#   2. Lua heap allocated per request, per layer (garbage the collector
#      sweeps, and glibc then gives back to the kernel, see 4);
#   3. what one page fault costs on this machine;
#   4. real runs, alternating, median of ROUNDS: rate, CPU and minor page
#      faults per request, for plain multi, the engine layer and rw.fetch,
#      and rw.fetch again with glibc's heap trimming turned off
#      (GLIBC_TUNABLES=glibc.malloc.trim_threshold=...).
# Run from the repository root after `make` (needs valgrind, GNU time and
# liblua5.4-dev). Knobs: K (default 1500), N (default 40000), ROUNDS
# (default 5), CONC (default 64).
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-1500}
N=${N:-40000}
ROUNDS=${ROUNDS:-5}
CONC=${CONC:-64}
export LUA_PATH="./lua/?.lua;./lua/?/init.lua;;" LUA_CPATH="./build/?.so;;"
NOTRIM="glibc.malloc.trim_threshold=268435456"

command -v valgrind >/dev/null || { echo "profile_conc.sh: needs valgrind" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "profile_conc.sh: needs GNU time (apt-get install time)" >&2; exit 1; }
make -s -C bench all profile-tools
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
    printf '  %-62s %8d\n' "$label" $(( (b - a) / (2 * K) ))
}

echo "1. user-space instructions per request (callgrind), $CONC in flight, K=$K"
per_op "plain libcurl multi (bench/multi_curl64)" bench/multi_curl64 "$url" COUNT "$CONC" "$agent"
per_op "engine binding from a Lua loop, no tasks, no result()" \
    bench/lua_host bench/profile_conc.lua engine_noresult COUNT "$url" "$CONC"
per_op "  + transfer:result() (response and header tables)" \
    bench/lua_host bench/profile_conc.lua engine COUNT "$url" "$CONC"
per_op "  + tasks: runtime.transfer under rw.run (scheduler, runtime)" \
    bench/lua_host bench/profile_conc.lua transfer COUNT "$url" "$CONC"
per_op "  + fetch.lua: rw.fetch under rw.run (the bench)" \
    bench/lua_host bench/profile_conc.lua fetch COUNT "$url" "$CONC"
for op in map_shared map_fresh map_inherit; do
    per_op "rw.map of rw.fetch, $op" bench/lua_host bench/profile_conc.lua "$op" COUNT "$url" "$CONC"
done

echo "2. Lua heap allocated per request (bytes, collector stopped)"
for op in engine_noresult engine transfer fetch; do
    printf '  %-62s %8s\n' "$op" \
        "$(lua5.4 bench/profile_conc.lua $op 5000 "$url" "$CONC" alloc | sed -n 's/.*lua_alloc_per_request=//p')"
done

echo "3. one minor page fault on this machine"
cat > "$dir/pf.c" <<'C'
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
int main(void)
{
    size_t n = (size_t)64 << 20, i;
    struct timespec a, b;
    volatile char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (i = 0; i < n; i += 4096) p[i] = 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.2f\n", ((b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3) / (double)(n / 4096));
    return 0;
}
C
gcc -O2 -o "$dir/pf" "$dir/pf.c"
printf '  %-62s %8s us\n' "touching a fresh page (64 MiB, mmap)" "$("$dir/pf")"

echo "4. real runs: $N requests, $CONC in flight, median of $ROUNDS alternating rounds"
# prints rate, cpu_us and faults per request of one run
measure() { # env-assignment|- command...
    local envs=$1; shift
    local out
    if [ "$envs" = - ]; then
        out=$( { /usr/bin/time -f "minflt=%R" "$@"; } 2>&1 )
    else
        out=$( { env "$envs" /usr/bin/time -f "minflt=%R" "$@"; } 2>&1 )
    fi
    local rate cpu flt
    rate=$(sed -n 's/.*rate=\([0-9.]*\).*/\1/p' <<<"$out" | head -1)
    cpu=$(sed -n 's/.*cpu_us=\([0-9.]*\).*/\1/p' <<<"$out" | head -1)
    flt=$(sed -n 's/.*minflt=\([0-9]*\).*/\1/p' <<<"$out" | head -1)
    echo "$rate $cpu $(awk -v f="$flt" -v n="$N" 'BEGIN { printf "%.3f", f / n }')"
}
declare -A res
names=(multi engine fetch fetch_notrim)
for _ in $(seq "$ROUNDS"); do
    for name in "${names[@]}"; do
        case $name in
        multi) res[$name]+="$(measure - bench/multi_curl64 "$url" "$N" "$CONC" "$agent")"$'\n' ;;
        engine) res[$name]+="$(measure - lua5.4 bench/profile_conc.lua engine "$N" "$url" "$CONC" stats)"$'\n' ;;
        fetch) res[$name]+="$(measure - lua5.4 bench/profile_conc.lua fetch "$N" "$url" "$CONC" stats)"$'\n' ;;
        fetch_notrim) res[$name]+="$(measure "GLIBC_TUNABLES=$NOTRIM" \
            lua5.4 bench/profile_conc.lua fetch "$N" "$url" "$CONC" stats)"$'\n' ;;
        esac
    done
done
med() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '  %-34s %10s %12s %14s\n' "" "req/s" "CPU us/req" "faults/req"
for name in "${names[@]}"; do
    rows=${res[$name]}
    printf '  %-34s %10.0f %12.1f %14.3f\n' "$name" \
        "$(awk 'NF { print $1 }' <<<"$rows" | med)" "$(awk 'NF { print $2 }' <<<"$rows" | med)" \
        "$(awk 'NF { print $3 }' <<<"$rows" | med)"
done
echo "  (multi: plain libcurl multi; engine: the engine binding from a Lua loop with result(), no tasks;"
echo "   fetch: 64 tasks of rw.fetch; fetch_notrim: the same with GLIBC_TUNABLES=$NOTRIM)"
