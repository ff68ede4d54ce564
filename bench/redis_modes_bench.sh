#!/usr/bin/env bash
# serverdir on standalone Redis, a 1-primary and a 3-primary Redis Cluster, side by side
# (bench/README.md "## Redis modes").
#
# Per round, for each backend: a fresh Redis (or cluster, no replicas, no persistence)
# and serverdir (--threads SD_THREADS, open mode) on free loopback ports, then
#   - events/s: wrk POSTs batches of BATCH directory events (BATCH/2 instances started
#     then stopped, bench/events_post.lua) over CONNS connections for DUR seconds;
#   - lock pairs/s (acquire + release) and 10 KB blob saves/s at CLIENTS clients
#     (bench/locks_load, the same load as bench/locks_bench.sh);
# and once per round, the raw Redis anchor on the standalone Redis: the same Lua scripts
# by EVALSHA (events_apply.lua by redis-benchmark with the same batch, lock_acquire +
# lock_release and blob_save by locks_load's redis modes; events_apply.lua runs unchanged
# behind the per-call nonce preamble of bench/lib.sh, checked first to accept a whole batch
# as new events). Prints every figure, the
# medians of ROUNDS rounds and each backend's ratio to raw Redis; then the key
# distribution of 10,000 players' lock records and 10 clusters' directories across
# the slots and nodes of the 3-primary cluster.
#
# What differs between the sides: the anchors skip HTTP, JSON, auth and serverdir's own
# checks (a floor for what serverdir can reach on one Redis); on a cluster serverdir also
# keeps a holder index outside the lock scripts (one SADD before a grant, one SREM after
# a release). Nothing fsyncs on either side.
# Exits non-zero when a figure is missing.
# Usage: bench/redis_modes_bench.sh      (env: BUILD_DIR (build), ROUNDS (3), DUR (5),
#        CLIENTS (64), CONNS (64), BATCH (20), ANCHOR_N (20000) events_apply.lua calls of
#        the anchor, KEYS_PLAYERS (10000) and KEYS_CLUSTERS (10) of the key distribution;
#        SMOKE=1: 1 round of 1 s figures at 4 clients and connections, 200 anchor calls,
#        100 players; ctest bench.redis_modes_smoke)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${ROUNDS:=1}" "${DUR:=1}" "${CLIENTS:=4}" "${CONNS:=4}" "${ANCHOR_N:=200}"
    : "${KEYS_PLAYERS:=100}" "${SD_THREADS:=2}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
DUR=${DUR:-5}
CLIENTS=${CLIENTS:-64}
CONNS=${CONNS:-64}
BATCH=${BATCH:-20}
BLOB=${BLOB:-10240}
SD_THREADS=${SD_THREADS:-8}
ANCHOR_N=${ANCHOR_N:-20000}
KEYS_PLAYERS=${KEYS_PLAYERS:-10000}
KEYS_CLUSTERS=${KEYS_CLUSTERS:-10}

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >/dev/null
fi
[ -x "$BUILD_DIR/bin/serverdir" ] || { echo "build serverdir first (cmake --build build)"; exit 1; }
[ -x "$BUILD_DIR/bench/locks_load" ] || cmake --build "$BUILD_DIR" -j2 --target locks_load >/dev/null

WORK=$(mktemp -d /tmp/redis-modes.XXXXXX)
PIDS=()
bench_trap_cleanup
LUA=$BUILD_DIR/serverdir/lua

# A cluster node on port $1 (its bus port chosen free), files in $WORK/n$1.
start_node() {
    local p=$1 bus
    bus=$(bench_free_port)
    mkdir -p "$WORK/n$p"
    redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/n$p" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$bus" \
        >"$WORK/n$p/redis.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ] && return; sleep 0.05; done
    echo "cluster node $p did not start" >&2
    exit 1
}

cluster_ok() { # port
    for _ in $(seq 400); do
        redis-cli -p "$1" cluster info 2>/dev/null | grep -q cluster_state:ok && return
        sleep 0.05
    done
    echo "cluster on $1 not ok" >&2
    exit 1
}

# Starts backend $1 (standalone | cluster1 | cluster3); sets URL (for serverdir) and RPORT
# (a node to talk to).
start_backend() {
    case $1 in
    standalone)
        RPORT=$(bench_free_port)
        bench_start_redis "$RPORT" "$WORK"
        URL="redis://127.0.0.1:$RPORT/0" ;;
    cluster1)
        RPORT=$(bench_free_port)
        start_node "$RPORT"
        redis-cli -p "$RPORT" cluster addslotsrange 0 16383 >/dev/null
        cluster_ok "$RPORT"
        URL="cluster://127.0.0.1:$RPORT" ;;
    cluster3)
        local ports=() p
        for _ in 1 2 3; do
            p=$(bench_free_port)
            start_node "$p"
            ports+=("$p")
        done
        redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes \
            >"$WORK/create.log" 2>&1
        cluster_ok "${ports[0]}"
        RPORT=${ports[0]}
        URL="cluster://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}" ;;
    esac
}

stop_all() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
    rm -rf "$WORK"/n* "$WORK"/*.rdb
}

# wrk's events/s over serverdir at $1 (fails on any non-2xx).
events_rate() {
    local out
    out=$(BATCH=$BATCH MACHINES=100 RUN_ID="r$RANDOM" wrk -t2 -c"$CONNS" -d"${DUR}s" \
        -s "$ROOT/bench/events_post.lua" "$1/v1/clusters/bench/events")
    if grep -q "Non-2xx" <<<"$out"; then
        echo "$out" >&2
        echo "serverdir answered errors" >&2
        exit 1
    fi
    awk -v b="$BATCH" '/^Requests\/sec:/ { printf "%.0f", $2 * b }' <<<"$out"
}

load_rate() { # locks_load args...
    "$BUILD_DIR/bench/locks_load" -c "$CLIENTS" -d "$DUR" "$@" | sed -n 's/.* rate=\([0-9]*\).*/\1/p'
}

bench_events_anchor_script "$LUA" "$WORK/events_anchor.lua"
BATCH_JSON=$(bench_events_anchor_batch)

declare -A R
add() { R[$1]+="$2 "; }

echo "Redis modes benchmark: $ROUNDS rounds, ${DUR}s per figure, events in batches of $BATCH" \
    "over $CONNS connections, locks and ${BLOB}-byte blobs at $CLIENTS clients, serverdir" \
    "--threads $SD_THREADS, $(nproc) cores (shared: figures are noisy), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
    for b in standalone cluster1 cluster3; do
        start_backend "$b"
        sport=$(bench_free_port)
        "$BUILD_DIR/bin/serverdir" --listen "127.0.0.1:$sport" --redis "$URL" --threads "$SD_THREADS" \
            --log-level warn >"$WORK/serverdir-$b.log" 2>&1 &
        PIDS+=($!)
        sd="http://127.0.0.1:$sport"
        bench_wait_http "$sd/readyz" "$!" "$WORK/serverdir-$b.log" serverdir
        ev=$(events_rate "$sd")
        lk=$(load_rate sd-lock "$sd" bench-token)
        bl=$(load_rate sd-blob "$sd" bench-token "$BLOB")
        add "$b-events" "$ev"
        add "$b-locks" "$lk"
        add "$b-blobs" "$bl"
        echo "round $round $b: events $ev/s, lock pairs $lk/s, blob saves $bl/s"
        if [ "$b" = standalone ]; then
            redis-cli -p "$RPORT" FLUSHALL >/dev/null
            esha=$(redis-cli -p "$RPORT" SCRIPT LOAD "$(cat "$WORK/events_anchor.lua")")
            bench_events_anchor_check "$RPORT" "$esha"
            out=$(redis-benchmark -p "$RPORT" -c "$CONNS" -n "$ANCHOR_N" -r 100000000000 --csv EVALSHA \
                "$esha" 1 "$BENCH_EV_KEY" "${BENCH_EV_ARGV[@]}" "$BATCH_JSON" "-__rand_int__" |
                tail -1 | tr -d '"')
            rev=$(awk -F, -v b="$BATCH" '{ printf "%.0f", $(NF - 6) * b }' <<<"$out")
            redis-cli -p "$RPORT" FLUSHALL >/dev/null
            rlk=$(load_rate redis-lock 127.0.0.1 "$RPORT" "$LUA" sd:)
            redis-cli -p "$RPORT" FLUSHALL >/dev/null
            rbl=$(load_rate redis-blob 127.0.0.1 "$RPORT" "$LUA" sd: "$BLOB")
            add raw-events "$rev"
            add raw-locks "$rlk"
            add raw-blobs "$rbl"
            echo "round $round raw Redis (same scripts by EVALSHA): events $rev/s, lock pairs $rlk/s, blob saves $rbl/s"
        fi
        stop_all
    done
done

echo
echo "medians of $ROUNDS rounds; ratio = serverdir on that backend / raw Redis (standalone, same scripts):"
printf '  %-12s %14s %14s %14s\n' backend "events/s" "lock pairs/s" "blob saves/s"
for b in raw standalone cluster1 cluster3; do
    e=$(bench_median ${R[$b-events]}) l=$(bench_median ${R[$b-locks]}) s=$(bench_median ${R[$b-blobs]})
    printf '  %-12s %14s %14s %14s\n' "$b" "$e" "$l" "$s"
done
figs=()
for b in raw standalone cluster1 cluster3; do
    figs+=("$b events/s=$(bench_median ${R[$b-events]})" "$b lock pairs/s=$(bench_median ${R[$b-locks]})"
           "$b blob saves/s=$(bench_median ${R[$b-blobs]})")
done
bench_check_positive "${figs[@]}"
for b in standalone cluster1 cluster3; do
    printf '  %-12s ratios   events %s   lock pairs %s   blob saves %s\n' "$b" \
        "$(bench_ratio "$(bench_median ${R[$b-events]})" "$(bench_median ${R[raw-events]})")" \
        "$(bench_ratio "$(bench_median ${R[$b-locks]})" "$(bench_median ${R[raw-locks]})")" \
        "$(bench_ratio "$(bench_median ${R[$b-blobs]})" "$(bench_median ${R[raw-blobs]})")"
done

# Key distribution on a 3-primary cluster: KEYS_PLAYERS (10,000) players' lock records
# (untagged names: wrapped {=player:N}) and KEYS_CLUSTERS (10) clusters' directories (all of one cluster under {cN}).
start_backend cluster3
# "start end port" per slot range of a primary (CLUSTER NODES: ip:port@bus ... ranges)
mapfile -t ranges < <(redis-cli -p "$RPORT" cluster nodes | awk '$3 ~ /master/ {
    split($2, a, "[:@]"); for (i = 9; i <= NF; i++) { n = split($i, r, "-");
    print r[1], (n > 1 ? r[2] : r[1]), a[2] } }')
node_of() { # slot -> port of its primary
    local r
    for r in "${ranges[@]}"; do
        set -- $r
        if [ "$1" -le "$slot" ] && [ "$slot" -le "$2" ]; then echo "$3"; return; fi
    done
}
for i in $(seq "$KEYS_PLAYERS"); do echo "CLUSTER KEYSLOT sd:lock:{=player:$i}"; done |
    redis-cli -p "$RPORT" >"$WORK/player-slots"
for i in $(seq "$KEYS_CLUSTERS"); do echo "CLUSTER KEYSLOT sd:{c$i}:machines"; done |
    redis-cli -p "$RPORT" >"$WORK/cluster-slots"
echo
echo "key distribution on 3 primaries (slots: distinct slots used):"
declare -A pn cn
while read -r slot; do p=$(node_of); pn[$p]=$((${pn[$p]:-0} + 1)); done <"$WORK/player-slots"
while read -r slot; do p=$(node_of); cn[$p]=$((${cn[$p]:-0} + 1)); done <"$WORK/cluster-slots"
for r in "${ranges[@]}"; do
    set -- $r
    printf '  node :%s slots %5s-%-5s  players %5s  clusters %s\n' "$3" "$1" "$2" "${pn[$3]:-0}" "${cn[$3]:-0}"
done
echo "  players: $(sort -u "$WORK/player-slots" | wc -l) distinct slots of $KEYS_PLAYERS keys;" \
    "clusters: $(sort -u "$WORK/cluster-slots" | wc -l) distinct slots of $KEYS_CLUSTERS"
[ "$(wc -l <"$WORK/player-slots")" = "$KEYS_PLAYERS" ] && [ ${#ranges[@]} -ge 3 ] ||
    { echo "the key distribution is incomplete" >&2; exit 1; }
stop_all
