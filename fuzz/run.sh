#!/bin/sh
# One libFuzzer run of one target: fuzz/run.sh TARGET SECONDS BUILD_DIR
# (what `make fuzz` calls for each target).
#
# Reads the committed seeds in fuzz/corpus/TARGET and the corpus grown by
# earlier runs in BUILD_DIR/corpus/TARGET; writes new inputs only to the
# latter, and a failing input to BUILD_DIR/crashes/TARGET/, both outside git.
# Prints one line a README can quote, and on a failure the property or the
# sanitizer report and how to replay the input.
set -u
target=$1 seconds=$2 dir=$3
bin=$dir/fuzz_$target
log=$dir/$target.log
corpus=$dir/corpus/$target
crashes=$dir/crashes/$target
mkdir -p "$corpus" "$crashes"

dict=
case $target in
    http_date|retry_after) dict=fuzz/dict/http_date.dict ;;
    seconds|duration|rfc3339|headers|sse|decode|link) dict=fuzz/dict/$target.dict ;;
esac

# -max_len: room for long digit strings; -timeout: a parser that takes a
# second on one input is a bug; -rss_limit_mb: libFuzzer's default, said.
"$bin" -max_total_time="$seconds" -max_len=4096 -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$crashes/" ${dict:+-dict="$dict"} \
    "$corpus" "fuzz/corpus/$target" >"$log" 2>&1
rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
cov=$(sed -n 's/.*DONE *cov: \([0-9]*\) .*/\1/p' "$log" | tail -n 1)
inputs=$(find "$corpus" -type f | wc -l)

if [ "$rc" -eq 0 ]; then
    printf 'fuzz %-12s %s executions in %s s (%s/s), %s coverage points, corpus %s inputs: no failure\n' \
        "$target" "${runs:-?}" "${took:-$seconds}" "${rate:-?}" "${cov:-?}" "$inputs"
    exit 0
fi
crash=$(ls -t "$crashes" 2>/dev/null | head -n 1)
printf 'fuzz %-12s FAILED after %s executions (exit %s); full log: %s\n' "$target" "${runs:-?}" "$rc" "$log"
# The report without libFuzzer's and libc's own frames.
grep -E -A 14 'property violated|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" \
    | grep -v -E 'fuzzer::|__sanitizer_print_stack_trace|libc\.so|pthread_kill|raise\.c|abort\.c|^--$' \
    | head -n 30
if [ -n "$crash" ]; then
    echo "failing input: $crashes/$crash (replay: $bin $crashes/$crash), bytes:"
    od -An -c "$crashes/$crash" | head -n 4
fi
exit 1
