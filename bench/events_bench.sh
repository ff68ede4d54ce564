#!/usr/bin/env bash
# Process-directory benchmark: serverdir vs the raw Redis doing the same script work.
#
# Per run: a fresh redis-server and serverdir on free loopback ports, a live directory
# of MACHINES x PER_MACHINE processes, then at CONNS (64) concurrent connections:
#   1. wrk POSTs batches of BATCH events (BATCH/2 instances started then stopped) as
#      fast as they are answered -> events/s; then again at LOAD (default 0.5) of that
#      rate (each connection pausing 0.5-1.5x a mean pause between requests, so the
#      connections do not stay in step) -> p50/p99 latency per batch. At
#      saturation a closed loop's latency is just CONNS / rate (Little's law), so the
#      latency target is measured below saturation;
#   2. anchor: redis-benchmark, same Redis, same connections, EVALSHA of events_apply.lua
#      with the same batch (normalized the way serverdir passes it), i.e. exactly the
#      Redis commands serverdir issues per event. The script runs unchanged behind a
#      two-line preamble (bench/lib.sh, bench_events_anchor_script) that puts a per-call
#      nonce (one __rand_int__ that redis-benchmark redraws per call) into the event ids
#      and instance names, so every call does first-time work; before the timed run the
#      anchor is checked to accept a whole batch as new events, twice;
#   3. wrk GETs the live directory of a random machine (PER_MACHINE records), flat out
#      and at LOAD of that rate;
#   4. anchor: redis-benchmark EVALSHA proc_list.lua with the same filter and page size
#      as serverdir's first call per request (api_processes.c: at most 50 records and 500
#      index entries a call); before the timed run the anchor is checked to return a
#      machine's PER_MACHINE records (up to 50).
# Prints each run and the medians, with serverdir/anchor ratios, and exits non-zero when
# a figure is missing.
#
# Usage: bench/events_bench.sh [RUNS]     (env: BUILD_DIR (build), RUNS (3), DURATION (8),
#        CONNS (64), BATCH (20), MACHINES (100), PER_MACHINE (50), ANCHOR_N (20000),
#        THREADS (8), LOAD (0.5), SMOKE=1: 1 run of 1 s phases at 4 connections, a
#        directory of 4 x 5 processes, 200 anchor calls; ctest bench.events_smoke)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${RUNS:=1}" "${DURATION:=1}" "${CONNS:=4}" "${MACHINES:=4}" "${PER_MACHINE:=5}"
    : "${ANCHOR_N:=200}" "${THREADS:=2}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
RUNS=${1:-${RUNS:-3}}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
BATCH=${BATCH:-20}
MACHINES=${MACHINES:-100}
PER_MACHINE=${PER_MACHINE:-50}
ANCHOR_N=${ANCHOR_N:-20000}
THREADS=${THREADS:-8}
LOAD=${LOAD:-0.5}

need() {
    command -v "$1" >/dev/null 2>&1 && return
    echo "installing $2 (for $1)" >&2
    apt-get install -y "$2" >/dev/null
}
need wrk wrk
need redis-benchmark redis-tools
need redis-server redis-server
need curl curl
if [ ! -x "$BUILD_DIR/bin/serverdir" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD_DIR" -j2 --target serverdir >/dev/null
fi

WORK=$(mktemp -d /tmp/events_bench.XXXXXX)
PIDS=()
bench_trap_cleanup

wait_for() { # url log
    for _ in $(seq 1 200); do
        curl -fs "$1" >/dev/null 2>&1 && return
        sleep 0.05
    done
    echo "not up: $1" >&2
    cat "$2" >&2
    exit 1
}

# wrk's "50%  1.23ms" style value in ms.
to_ms() {
    awk -v v="$1" 'BEGIN { n = v + 0; u = v; sub(/^[0-9.]+/, "", u);
        if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000;
        printf "%.2f", n }'
}

# Runs wrk; sets RPS P50 P99 and fails on any non-2xx answer.
run_wrk() { # script url [delay_ms]
    local out
    out=$(DELAY_MS=${3:-0} wrk -t2 -c"$CONNS" -d"${DURATION}s" --latency -s "$1" "$2")
    if grep -q "Non-2xx" <<<"$out"; then
        echo "$out" >&2
        echo "serverdir answered errors during the benchmark" >&2
        exit 1
    fi
    RPS=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
    P50=$(to_ms "$(awk '$1 == "50%" { print $2 }' <<<"$out")")
    P99=$(to_ms "$(awk '$1 == "99%" { print $2 }' <<<"$out")")
}

# The per-connection pause that offers LOAD x rps requests/s over CONNS connections.
delay_for() { # rps
    awk -v r="$1" -v l="$LOAD" -v c="$CONNS" 'BEGIN { d = c / (r * l) * 1000 - 1; if (d < 1) d = 1; printf "%d", d }'
}

# Runs redis-benchmark --csv; sets RPS P50 P99.
run_rb() { # args...
    local out
    out=$(redis-benchmark -h 127.0.0.1 -p "$RPORT" -c "$CONNS" -n "$ANCHOR_N" --csv "$@")
    if grep -q "ERR\|NOSCRIPT" <<<"$out"; then
        echo "$out" >&2
        exit 1
    fi
    # The test name holds the command (commas included): count fields from the end.
    local line
    line=$(tail -n 1 <<<"$out" | tr -d '"')
    RPS=$(awk -F, '{ print $(NF - 6) }' <<<"$line")
    P50=$(awk -F, '{ print $(NF - 3) }' <<<"$line")
    P99=$(awk -F, '{ print $(NF - 1) }' <<<"$line")
}

# The live directory: MACHINES x PER_MACHINE started processes, in batches of 1000.
populate() {
    awk -v m="$MACHINES" -v p="$PER_MACHINE" 'BEGIN {
        n = 0; b = 0;
        for (i = 0; i < m; i++) for (j = 0; j < p; j++) {
            if (n % 1000 == 0) { if (n) print "]}"; printf "{\"events\":["; } else printf ",";
            printf "{\"id\":\"pop-%d-%d\",\"type\":\"started\",\"instance\":\"live-%d-%d\",\"machine\":\"m%012d\",\"service\":\"zone\",\"pid\":%d}", i, j, i, j, i, 100 + j;
            n++;
        }
        print "]}" }' >"$WORK/populate.jsonl"
    while IFS= read -r body; do
        curl -fs -X POST "$SD/v1/clusters/bench/events" -H 'Content-Type: application/json' \
             --data-binary "$body" >/dev/null
    done <"$WORK/populate.jsonl"
}


declare -a EV_RATIO RD_RATIO EV_SATP99 EV_LOAD RD_SATP99 RD_LOAD EV_SD EV_SD50 EV_SD99 EV_RB EV_RB50 EV_RB99 RD_SD RD_SD50 RD_SD99 RD_RB RD_RB50 RD_RB99

# events_apply.lua as serverdir runs it (the build's copy, with its prelude), behind the
# preamble that puts a per-call nonce into ids and instances.
LUA_DIR=$BUILD_DIR/serverdir/lua
bench_events_anchor_script "$LUA_DIR" "$WORK/events_anchor.lua"
BATCH_JSON=$(bench_events_anchor_batch)

echo "events bench: $RUNS runs, ${DURATION}s per wrk phase, $CONNS connections, batches of $BATCH events,"
echo "live directory $MACHINES machines x $PER_MACHINE processes, serverdir --threads $THREADS, $(nproc) CPUs (shared)"
for run in $(seq 1 "$RUNS"); do
    RPORT=$(bench_free_port)
    HPORT=$(bench_free_port)
    while [ "$HPORT" = "$RPORT" ]; do HPORT=$(bench_free_port); done
    redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$WORK" >"$WORK/redis.log" 2>&1 &
    RPID=$!
    PIDS+=("$RPID")
    for _ in $(seq 1 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
    "$BUILD_DIR/bin/serverdir" --listen "127.0.0.1:$HPORT" --redis "redis://127.0.0.1:$RPORT/0" \
        --threads "$THREADS" --log-level warn >"$WORK/serverdir.log" 2>&1 &
    SPID=$!
    PIDS+=("$SPID")
    SD="http://127.0.0.1:$HPORT"
    wait_for "$SD/healthz" "$WORK/serverdir.log"
    populate

    export BATCH MACHINES RUN_ID="run$run"
    run_wrk "$ROOT/bench/events_post.lua" "$SD/v1/clusters/bench/events"
    EV_SD+=("$(awk -v r="$RPS" -v b="$BATCH" 'BEGIN { printf "%.0f", r * b }')")
    EV_SATP99+=("$P99")
    RUN_ID="run${run}l" run_wrk "$ROOT/bench/events_post.lua" "$SD/v1/clusters/bench/events" "$(delay_for "$RPS")"
    EV_LOAD+=("$(awk -v r="$RPS" -v b="$BATCH" 'BEGIN { printf "%.0f", r * b }')"); EV_SD50+=("$P50"); EV_SD99+=("$P99")

    ESHA=$(redis-cli -p "$RPORT" SCRIPT LOAD "$(cat "$WORK/events_anchor.lua")")
    bench_events_anchor_check "$RPORT" "$ESHA"
    run_rb -r 100000000000 EVALSHA "$ESHA" 1 "$BENCH_EV_KEY" "${BENCH_EV_ARGV[@]}" "$BATCH_JSON" "-__rand_int__"
    EV_RB+=("$(awk -v r="$RPS" -v b="$BATCH" 'BEGIN { printf "%.0f", r * b }')"); EV_RB50+=("$P50"); EV_RB99+=("$P99")

    run_wrk "$ROOT/bench/procs_get.lua" "$SD/v1/clusters/bench/processes"
    RD_SD+=("$RPS")
    RD_SATP99+=("$P99")
    run_wrk "$ROOT/bench/procs_get.lua" "$SD/v1/clusters/bench/processes" "$(delay_for "$RPS")"
    RD_LOAD+=("$RPS"); RD_SD50+=("$P50"); RD_SD99+=("$P99")
    PSHA=$(redis-cli -p "$RPORT" SCRIPT LOAD "$(cat "$LUA_DIR/proc_list.lua")")
    # ARGV: state, machine, service, after, limit, budget (serverdir's first call)
    PARGS=('' 'm__rand_int__' '' '' 50 500)
    got=$(redis-cli -2 --json -p "$RPORT" EVALSHA "$PSHA" 1 'sd:{bench}:' '' m000000000000 '' '' 50 500 |
        grep -o '"instance"' | wc -l)
    want=$((PER_MACHINE < 50 ? PER_MACHINE : 50))
    if [ "$got" != "$want" ]; then
        echo "the reads anchor (proc_list.lua, ARGV ${PARGS[*]}) returned $got records of" \
             "machine m000000000000, not $want: has the script's ARGV contract changed?" >&2
        exit 1
    fi
    run_rb -r "$MACHINES" EVALSHA "$PSHA" 1 'sd:{bench}:' "${PARGS[@]}"
    RD_RB+=("$RPS"); RD_RB50+=("$P50"); RD_RB99+=("$P99")

    i=$((run - 1))
    EV_RATIO+=("$(awk -v a="${EV_SD[$i]}" -v b="${EV_RB[$i]}" 'BEGIN { printf "%.2f", a / b }')")
    RD_RATIO+=("$(awk -v a="${RD_SD[$i]}" -v b="${RD_RB[$i]}" 'BEGIN { printf "%.2f", a / b }')")
    printf 'run %d  events: serverdir %s ev/s (p99 %s ms saturated), at %s ev/s p50 %s ms p99 %s ms | redis %s ev/s p50 %s ms p99 %s ms | ratio %s\n' \
        "$run" "${EV_SD[$i]}" "${EV_SATP99[$i]}" "${EV_LOAD[$i]}" "${EV_SD50[$i]}" "${EV_SD99[$i]}" \
        "${EV_RB[$i]}" "${EV_RB50[$i]}" "${EV_RB99[$i]}" "${EV_RATIO[$i]}"
    printf 'run %d  reads:  serverdir %s req/s (p99 %s ms saturated), at %s req/s p50 %s ms p99 %s ms | redis %s req/s p50 %s ms p99 %s ms | ratio %s\n' \
        "$run" "${RD_SD[$i]}" "${RD_SATP99[$i]}" "${RD_LOAD[$i]}" "${RD_SD50[$i]}" "${RD_SD99[$i]}" \
        "${RD_RB[$i]}" "${RD_RB50[$i]}" "${RD_RB99[$i]}" "${RD_RATIO[$i]}"

    kill "$SPID" "$RPID"
    wait "$SPID" "$RPID" 2>/dev/null || true
    PIDS=()
done

ev_sd=$(bench_median "${EV_SD[@]}"); ev_rb=$(bench_median "${EV_RB[@]}")
rd_sd=$(bench_median "${RD_SD[@]}"); rd_rb=$(bench_median "${RD_RB[@]}")
bench_check_positive "serverdir events/s=$ev_sd" "anchor events/s=$ev_rb" \
    "serverdir reads/s=$rd_sd" "anchor reads/s=$rd_rb" \
    "serverdir events/s at load=$(bench_median "${EV_LOAD[@]}")" \
    "serverdir reads/s at load=$(bench_median "${RD_LOAD[@]}")"
bench_check_figures "events p99=$(bench_median "${EV_SD99[@]}")" \
    "anchor events p99=$(bench_median "${EV_RB99[@]}")" "reads p99=$(bench_median "${RD_SD99[@]}")" \
    "anchor reads p99=$(bench_median "${RD_RB99[@]}")" "events ratio=$(bench_median "${EV_RATIO[@]}")" \
    "reads ratio=$(bench_median "${RD_RATIO[@]}")"
echo "medians of $RUNS runs ($CONNS connections, batches of $BATCH events; latency at $LOAD of the measured rate):"
printf '  events: serverdir %s events/s, redis-benchmark %s events/s (p50 %s ms, p99 %s ms), ratio %s (median of the runs; target >= 0.40)\n' \
    "$ev_sd" "$ev_rb" "$(bench_median "${EV_RB50[@]}")" "$(bench_median "${EV_RB99[@]}")" "$(bench_median "${EV_RATIO[@]}")"
printf '          serverdir at %s events/s: p50 %s ms, p99 %s ms per batch (target p99 < 5 ms); saturated p99 %s ms\n' \
    "$(bench_median "${EV_LOAD[@]}")" "$(bench_median "${EV_SD50[@]}")" "$(bench_median "${EV_SD99[@]}")" "$(bench_median "${EV_SATP99[@]}")"
printf '  reads:  serverdir %s req/s, redis-benchmark %s req/s (p50 %s ms, p99 %s ms), ratio %s (median of the runs)\n' \
    "$rd_sd" "$rd_rb" "$(bench_median "${RD_RB50[@]}")" "$(bench_median "${RD_RB99[@]}")" "$(bench_median "${RD_RATIO[@]}")"
printf '          serverdir at %s req/s: p50 %s ms, p99 %s ms; saturated p99 %s ms\n' \
    "$(bench_median "${RD_LOAD[@]}")" "$(bench_median "${RD_SD50[@]}")" "$(bench_median "${RD_SD99[@]}")" "$(bench_median "${RD_SATP99[@]}")"
