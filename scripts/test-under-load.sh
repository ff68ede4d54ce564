#!/usr/bin/env bash
# The suite as CI's busy machine sees it: RUNS times (default 3) in a row, each on a
# fresh clone of HEAD with one CPU-bound process per core running beside it, exactly as
# CI runs it (`CI=true .ci/run`, no input). Stops at the first red run. Prints each run's
# time and the load average at its start and end; the clones and their logs stay under
# $SD_LOAD_DIR (default /tmp/sd-load-check) for a look at what failed.
#   scripts/test-under-load.sh [RUNS]
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
top=${SD_LOAD_DIR:-/tmp/sd-load-check}
mkdir -p "$top"
hogs=()
stop_hogs() {
    [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null || true
    hogs=()
}
trap stop_hogs EXIT

for i in $(seq 1 "$runs"); do
    dir="$top/run$i"
    rm -rf "$dir"
    git clone -q "$SD_ROOT" "$dir"
    for _ in $(seq 1 "$(nproc)"); do
        # a CPU-bound process per core, at the suite's own priority, bounded in time
        timeout 7200 sh -c 'while :; do :; done' &
        hogs+=($!)
    done
    echo "run $i/$runs: $(git -C "$dir" log --oneline -1), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    start=$(date +%s)
    rc=0
    (cd "$dir" && CI=true .ci/run </dev/null >"$dir.log" 2>&1) || rc=$?
    stop_hogs
    took=$(($(date +%s) - start))
    echo "run $i/$runs: exit $rc after $((took / 60)) min $((took % 60)) s," \
         "load average $(cut -d' ' -f1-3 /proc/loadavg) (log: $dir.log)"
    if [ "$rc" -ne 0 ]; then
        grep -E "tests passed|\*\*\*Failed|Timeout|FAILED" "$dir.log" | head -20 || true
        exit "$rc"
    fi
done
echo "$runs runs green in a row under load"
