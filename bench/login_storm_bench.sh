#!/usr/bin/env bash
# The login storm (bench/README.md "## login storm"): what a realm restart looks like to
# the lock table. PLAYERS (20,000) players join within WINDOW (10) seconds over ZONES (50)
# zone servers, each join acquiring the player's lock, loading its blob under the grant
# and saving it once; each player leaves STAY (5) seconds after it arrived (its lock is
# released). bench/login_storm.c runs it through serverdir and, as the anchor, with the
# same Lua scripts straight on Redis (EVALSHA, the KEYS and ARGV serverdir passes), on
# one redis-server and one serverdir started here on free loopback ports. Per round it
# prints every step's p50 and p99 for both sides, Redis's time in the scripts per join
# (INFO commandstats) and serverdir's group commit (requests per script call); then the
# medians of ROUNDS (3) rounds and the join p99 against the goal (under 50 ms).
# Needs a build (BUILD_DIR, default ./build). Other knobs: WORKERS (2 connections per
# zone server), BLOB (2048 bytes per player), SD_THREADS (8). SMOKE=1: 1 round of 500
# players over 1 s, 10 zones, a 0.5 s stay (ctest bench.login_storm_smoke).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${PLAYERS:=500}" "${WINDOW:=1}" "${ZONES:=10}" "${STAY:=0.5}" "${ROUNDS:=1}" "${SD_THREADS:=2}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PLAYERS=${PLAYERS:-20000}
WINDOW=${WINDOW:-10}
ZONES=${ZONES:-50}
STAY=${STAY:-5}
WORKERS=${WORKERS:-2}
BLOB=${BLOB:-2048}
ROUNDS=${ROUNDS:-3}
SD_THREADS=${SD_THREADS:-8}

[ -x "$BUILD_DIR/bin/serverdir" ] || { echo "build serverdir first (cmake --build build)"; exit 1; }
[ -x "$BUILD_DIR/bench/login_storm" ] || cmake --build "$BUILD_DIR" -j2 --target login_storm >/dev/null

WORK=$(mktemp -d /tmp/login-storm.XXXXXX)
PIDS=()
bench_trap_cleanup

rport=$(bench_free_port)
bench_start_redis "$rport" "$WORK"
sport=$(bench_free_port)
echo "game bench-game-token-0123456789" >"$WORK/tokens"
chmod 600 "$WORK/tokens"
"$BUILD_DIR/bin/serverdir" --listen "127.0.0.1:$sport" --redis "redis://127.0.0.1:$rport/0" \
    --tokens "$WORK/tokens" --threads "$SD_THREADS" ${SD_HTTP_THREADS:+--http-threads "$SD_HTTP_THREADS"} --log-level warn >"$WORK/serverdir.log" 2>&1 &
PIDS+=($!)
sd="http://127.0.0.1:$sport"
bench_wait_http "$sd/readyz" "$!" "$WORK/serverdir.log" serverdir
lua="$BUILD_DIR/serverdir/lua" # the scripts as serverdir runs them, with their prelude

declare -A figs
field() { sed -n "s/.* $1=\\([0-9.]*\\).*/\\1/p" <<<"$2"; }
evalsha_usec() { redis-cli -p "$rport" INFO commandstats | tr -d '\r' |
    awk -F'[:=,]' '/^cmdstat_evalsha:/ { print $5 + 0; f = 1 } END { if (!f) print 0 }'; }
sd_script_counts() { # -> "calls items" of serverdir's lock-path scripts
    curl -fs "$sd/metrics" | awk '
        /^serverdir_lock_script_calls_total/ { c += $2 }
        /^serverdir_lock_script_items_total/ { i += $2 }
        END { printf "%d %d", c, i }'
}
side() { # name, login_storm mode args...
    local name=$1 out g0 g1
    shift
    redis-cli -p "$rport" FLUSHALL >/dev/null
    redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
    g0=$(sd_script_counts)
    out=$("$BUILD_DIR/bench/login_storm" -r "127.0.0.1:$rport" -p "$PLAYERS" -z "$ZONES" \
        -w "$WINDOW" -s "$STAY" -W "$WORKERS" -b "$BLOB" "$@")
    g1=$(sd_script_counts)
    # Redis's time in the scripts per player (a join and its leave: four scripts), minus
    # nothing: the blobs written before the storm are plain HSETs
    out+=" redis_us_per_player=$(awk -v u="$(evalsha_usec)" -v n="$(field joins "$out")" \
        'BEGIN { printf "%.1f", (n > 0 ? u / n : 0) }')"
    [ "$name" != sd ] || out+=" items_per_call=$(awk -v a="$g0" -v b="$g1" 'BEGIN {
        split(a, x, " "); split(b, y, " "); c = y[1] - x[1]
        printf "%.2f", (c > 0 ? (y[2] - x[2]) / c : 0) }')"
    echo "  $out"
    local f
    for f in joins late_ms errors redis_us_per_player \
        acquire_p50_ms acquire_p99_ms load_p50_ms load_p99_ms save_p50_ms save_p99_ms \
        join_p50_ms join_p99_ms leave_p50_ms leave_p99_ms items_per_call; do
        figs[$name-$f]+="$(field "$f" "$out") "
    done
}

echo "login storm: $PLAYERS players over ${WINDOW}s through $ZONES zone servers ($WORKERS" \
    "connections each), ${STAY}s stay, blob $BLOB bytes, $ROUNDS rounds, serverdir --threads" \
    "$SD_THREADS, $(nproc) cores (shared machine: figures are noisy)"
for round in $(seq "$ROUNDS"); do
    echo "round $round (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    side sd sd "$sd" bench-game-token-0123456789
    side redis redis "$lua"
done

med() { bench_median ${figs[$1]:-}; }
echo
echo "medians of $ROUNDS rounds:"
printf '  %-8s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n' side joins "acq p50" "acq p99" \
    "load p50" "load p99" "save p50" "save p99" "join p50" "join p99" "leave p99" "redis_us"
for s in sd redis; do
    printf '  %-8s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s %7s\n' "$s" "$(med $s-joins)" \
        "$(med $s-acquire_p50_ms)" "$(med $s-acquire_p99_ms)" "$(med $s-load_p50_ms)" \
        "$(med $s-load_p99_ms)" "$(med $s-save_p50_ms)" "$(med $s-save_p99_ms)" \
        "$(med $s-join_p50_ms)" "$(med $s-join_p99_ms)" "$(med $s-leave_p99_ms)" \
        "$(med $s-redis_us_per_player)"
done
echo "  (ms; redis_us: Redis's time in the scripts per player, its join and leave;" \
    "serverdir's group commit carried $(med sd-items_per_call) requests per script call)"
checks=()
for s in sd redis; do
    for f in joins join_p50_ms join_p99_ms acquire_p99_ms load_p99_ms save_p99_ms leave_p99_ms; do
        checks+=("$s-$f=$(med $s-$f)")
    done
done
bench_check_positive "${checks[@]}"
for s in sd redis; do
    [ "$(med $s-errors)" = 0 ] || { echo "$s: $(med $s-errors) failed steps" >&2; exit 1; }
    [ "$(med $s-joins)" = "$PLAYERS" ] || { echo "$s: $(med $s-joins) of $PLAYERS joined" >&2; exit 1; }
done
echo "join p99: serverdir $(med sd-join_p99_ms) ms (goal: under 50 ms), raw Redis" \
    "$(med redis-join_p99_ms) ms; join p50 serverdir / raw Redis =" \
    "$(bench_ratio "$(med sd-join_p50_ms)" "$(med redis-join_p50_ms)")"
