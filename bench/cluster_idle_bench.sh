#!/usr/bin/env bash
# Cluster idle benchmark (bench/README.md "## cluster idle").
#
# Starts its own redis-server and serverdir on free loopback ports, then simulates
# MACHINES machines (default 500), each renewing its machine lease every LEASE_MS (5000)
# and long-polling its assignments with wait=WAIT_MS (30000), as an idle cluster of
# Big Brothers does. After a warm-up it counts, for DUR seconds (default 30), the leases
# and long-poll answers per second serverdir served and the CPU of serverdir and Redis
# (% of one core). The anchor, measured in the same run: the same machines polling their
# assignments with a plain GET every POLL_MS (1000) instead of long-polling (the lease
# traffic is the same) for ANCHOR_DUR (15) seconds after ANCHOR_WARMUP (3). Runs ROUNDS
# rounds (default 3), prints medians with ratios and exits non-zero when a figure is
# missing. Needs a build (BUILD_DIR, default ./build). SMOKE=1: 1 round, 10 machines,
# 1 s of warm-up and 1 s measured per side, leases every 500 ms, long-polls of 1 s, polls
# every 200 ms (ctest bench.cluster_idle_smoke).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${MACHINES:=10}" "${DUR:=1}" "${WARMUP:=1}" "${ANCHOR_DUR:=1}" "${ANCHOR_WARMUP:=1}"
    : "${LEASE_MS:=500}" "${WAIT_MS:=1000}" "${POLL_MS:=200}" "${ROUNDS:=1}" "${SD_THREADS:=2}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
MACHINES=${MACHINES:-500}
DUR=${DUR:-30}
WARMUP=${WARMUP:-5}
ANCHOR_DUR=${ANCHOR_DUR:-15}
ANCHOR_WARMUP=${ANCHOR_WARMUP:-3}
LEASE_MS=${LEASE_MS:-5000}
WAIT_MS=${WAIT_MS:-30000}
POLL_MS=${POLL_MS:-1000}
ROUNDS=${ROUNDS:-3}
SD_THREADS=${SD_THREADS:-8}

[ -x "$BUILD_DIR/bin/serverdir" ] || { echo "build serverdir first (cmake --build build)"; exit 1; }
WORK=$(mktemp -d /tmp/cluster-bench.XXXXXX)
PIDS=()
bench_trap_cleanup

[ -x "$BUILD_DIR/bench/cluster_idle_load" ] || cmake --build "$BUILD_DIR" -j2 --target cluster_idle_load >/dev/null

rport=$(bench_free_port)
bench_start_redis "$rport" "$WORK"
rpid=${PIDS[-1]}

sport=$(bench_free_port)
echo "bigbrother bench-bigbrother-token-0123" >"$WORK/tokens"
chmod 600 "$WORK/tokens"
# Every simulated machine connects from 127.0.0.1 (two connections each): no per-source
# limit (docs/operations.md, "Connection limits"; 256 by default).
echo '{"max_connections_per_source": 0}' >"$WORK/serverdir.json"
"$BUILD_DIR/bin/serverdir" --listen "127.0.0.1:$sport" --redis "redis://127.0.0.1:$rport/0" \
    --tokens "$WORK/tokens" --config "$WORK/serverdir.json" --threads "$SD_THREADS" \
    --log-level warn >"$WORK/serverdir.log" 2>&1 &
spid=$!
PIDS+=($spid)
sd="http://127.0.0.1:$sport"
bench_wait_http "$sd/readyz" "$spid" "$WORK/serverdir.log" serverdir

echo "cluster idle: $MACHINES machines, lease every ${LEASE_MS} ms, long-poll wait ${WAIT_MS} ms;"
echo "anchor: the same machines polling every ${POLL_MS} ms; serverdir --threads $SD_THREADS; $(nproc) cores (shared)"
printf '%-7s %-9s %10s %12s %10s %8s %10s %10s\n' round mode leases/s longpolls/s polls/s errors sd_cpu% redis_cpu%
declare -a lp_sd lp_rd lp_lease lp_lp an_sd an_rd an_poll
for r in $(seq "$ROUNDS"); do
    read -r l p q e c1 c2 < <("$BUILD_DIR/bench/cluster_idle_load" "$sd" bench-bigbrother-token-0123 "idle$r" "$MACHINES" \
        longpoll "$WARMUP" "$DUR" "$LEASE_MS" "$WAIT_MS" "$POLL_MS" "$spid" "$rpid")
    printf '%-7s %-9s %10s %12s %10s %8s %10s %10s\n' "$r" longpoll "$l" "$p" "$q" "$e" "$c1" "$c2"
    lp_lease+=("$l"); lp_lp+=("$p"); lp_sd+=("$c1"); lp_rd+=("$c2")
    read -r l p q e c1 c2 < <("$BUILD_DIR/bench/cluster_idle_load" "$sd" bench-bigbrother-token-0123 "poll$r" "$MACHINES" \
        poll "$ANCHOR_WARMUP" "$ANCHOR_DUR" "$LEASE_MS" "$WAIT_MS" "$POLL_MS" "$spid" "$rpid")
    printf '%-7s %-9s %10s %12s %10s %8s %10s %10s\n' "$r" poll "$l" "$p" "$q" "$e" "$c1" "$c2"
    an_poll+=("$q"); an_sd+=("$c1"); an_rd+=("$c2")
done
m_lease=$(bench_median "${lp_lease[@]}"); m_lp=$(bench_median "${lp_lp[@]}")
m_sd=$(bench_median "${lp_sd[@]}"); m_rd=$(bench_median "${lp_rd[@]}")
a_poll=$(bench_median "${an_poll[@]}"); a_sd=$(bench_median "${an_sd[@]}"); a_rd=$(bench_median "${an_rd[@]}")
bench_check_positive "long-poll leases/s=$m_lease" "long-poll answers/s=$m_lp" "anchor polls/s=$a_poll"
bench_check_figures "serverdir CPU=$m_sd" "redis CPU=$m_rd" "anchor serverdir CPU=$a_sd" "anchor redis CPU=$a_rd"
echo
echo "medians of $ROUNDS rounds:"
echo "  long-poll idle: $m_lease leases/s + $m_lp long-poll answers/s; serverdir ${m_sd}% of a core, redis ${m_rd}%"
echo "  anchor (poll every ${POLL_MS} ms): $a_poll polls/s; serverdir ${a_sd}% of a core, redis ${a_rd}%"
awk -v a="$a_sd" -v b="$m_sd" -v c="$a_rd" -v d="$m_rd" 'BEGIN {
    printf "  ratio: serverdir CPU long-poll/anchor = %.2f, redis CPU long-poll/anchor = %.2f\n",
           (a > 0 ? b / a : 0), (c > 0 ? d / c : 0) }'
