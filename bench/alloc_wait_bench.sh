#!/usr/bin/env bash
# What parked allocation waits cost Redis while nothing changes (docs/allocation.md,
# "Waiting"): starts its own redis-server (no persistence) and serverdir (open access) on
# free loopback ports, a service "match" with a machine lease and no instance, then
# WAITERS (500) allocation requests with wait_ms 60000, one curl each. Once they are
# parked, it samples Redis's INFO commandstats (EVAL/EVALSHA calls) and INFO cpu
# (used_cpu_sys + used_cpu_user) DUR (5) seconds apart and prints script calls per second
# and Redis's CPU share. SERVERDIR=path picks the binary (default
# $BUILD_DIR/bin/serverdir, BUILD_DIR build), to compare two builds. SMOKE=1: 20 waiters,
# 1 s.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
if bench_smoke; then
    : "${WAITERS:=20}" "${DUR:=1}"
fi
SERVERDIR=${SERVERDIR:-${BUILD_DIR:-build}/bin/serverdir}
WAITERS=${WAITERS:-500}
DUR=${DUR:-5}
WORK=$(mktemp -d /tmp/alloc_wait_bench.XXXXXX)
PIDS=()
bench_trap_cleanup

RP=$(bench_free_port)
SP=$(bench_free_port)
bench_start_redis "$RP" "$WORK"
"$SERVERDIR" --listen 127.0.0.1:"$SP" --redis redis://127.0.0.1:"$RP"/0 --log-level warn \
    >"$WORK/serverdir.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$SP/healthz" >/dev/null && break
    sleep 0.1
done
U=http://127.0.0.1:$SP/v1/clusters/bench
J=(-s -H 'Content-Type: application/json')
curl "${J[@]}" -XPUT "$U/services/match" -d '{"command":"/bin/true","count":1}' >/dev/null
curl "${J[@]}" -XPUT "$U/machines/m0" -d '{"address":"10.0.0.1"}' >/dev/null
for _ in $(seq 1 "$WAITERS"); do
    curl "${J[@]}" -m 70 -XPOST "$U/allocations" -d '{"service":"match","wait_ms":60000}' \
        >/dev/null &
    PIDS+=($!)
done
for _ in $(seq 1 200); do
    n=$(curl -s "http://127.0.0.1:$SP/metrics" | awk '/^serverdir_allocations_waiting /{print $2}')
    [ "${n:-0}" -ge "$WAITERS" ] && break
    sleep 0.1
done
if [ "${n:-0}" -lt "$WAITERS" ]; then
    echo "only ${n:-0} of $WAITERS requests parked" >&2
    exit 1
fi
sleep 1 # each one's first try on the park thread is done
calls() { redis-cli -p "$RP" INFO commandstats | tr -d '\r' |
          awk -F'[=,]' '/^cmdstat_eval/{c += $2} END {print c + 0}'; }
cpu() { redis-cli -p "$RP" INFO cpu | tr -d '\r' |
        awk -F: '/^used_cpu_(sys|user):/{s += $2} END {printf "%.3f", s}'; }
c0=$(calls); u0=$(cpu); t0=$(date +%s.%N)
sleep "$DUR"
c1=$(calls); u1=$(cpu); t1=$(date +%s.%N)
bench_check_figures calls0="$c0" calls1="$c1" cpu0="$u0" cpu1="$u1"
awk -v c0="$c0" -v c1="$c1" -v u0="$u0" -v u1="$u1" -v t0="$t0" -v t1="$t1" -v n="$n" \
    'BEGIN { dt = t1 - t0; printf "parked=%d script_calls_per_s=%.0f redis_cpu=%.1f%%\n",
             n, (c1 - c0) / dt, 100 * (u1 - u0) / dt }'
