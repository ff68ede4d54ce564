#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz/fuzz_*.c) for N minutes each under
# ASan+UBSan: the long run by hand; ctest runs each for SD_FUZZ_SECONDS only.
#   bench/fuzz_long.sh [MINUTES] [TARGET...]      (default 10 minutes, every target)
# Builds build-fuzz/ with clang if needed. New inputs go to build-fuzz/fuzz/NAME.long/
# (never into the seed corpus); a crash leaves build-fuzz/fuzz/NAME-crash-* and makes the
# script exit 1 after the remaining targets ran. Copy a fixed crash's input into
# tests/fuzz/regressions/NAME/ so the replay test keeps it fixed.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
minutes=${1:-10}
shift $(( $# > 0 ? 1 : 0 ))
case $minutes in ''|*[!0-9]*) echo "usage: $0 [MINUTES] [TARGET...]" >&2; exit 2 ;; esac
build=$root/build-fuzz
CC=clang cmake -S "$root" -B "$build" -DSD_WERROR=ON -DSD_FUZZ=ON >/dev/null || exit 2
cmake --build "$build" -j2 >/dev/null || exit 2

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for src in "$root"/tests/fuzz/fuzz_*.c; do
        n=$(basename "$src" .c)
        targets+=("${n#fuzz_}")
    done
fi

failed=0
printf '%-18s %8s %10s %8s %s\n' target seconds execs corpus result
for t in "${targets[@]}"; do
    bin=$build/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "no such target: $t" >&2; failed=1; continue; }
    work=$build/fuzz/$t.long
    mkdir -p "$work"
    seeds=("$root/tests/fuzz/corpus/$t")
    [ -d "$root/tests/fuzz/regressions/$t" ] && seeds+=("$root/tests/fuzz/regressions/$t")
    log=$build/fuzz/$t.long.log
    start=$(date +%s)
    "$bin" -max_total_time=$((minutes * 60)) -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/fuzz/$t-" "$work" "${seeds[@]}" \
        >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    result=ok
    [ $rc -eq 0 ] || { result="FAILED (rc=$rc, see $log)"; failed=1; }
    printf '%-18s %8d %10s %8d %s\n' "$t" $(( $(date +%s) - start )) "${execs:-?}" \
        "$(ls "$work" | wc -l)" "$result"
done
exit $failed
