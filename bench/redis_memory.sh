#!/usr/bin/env bash
# Redis memory per object, for sizing (docs/operations.md "Sizing"): a fresh redis-server
# and serverdir on loopback ports, then, measuring INFO memory's used_memory before and
# after each step:
#   1. N_PROC processes in the directory (started + ready events, batches of 100), with
#      their history stream entries (2 per process);
#   2. N_LOCK locks held (one PUT /v1/locks/KEY each, curl URL globbing);
#   3. N_MACHINE machine leases;
#   4. N_SERVER master-list servers (challenge + heartbeat each).
# Anchor: used_memory of the empty Redis (printed; every figure is a delta from the step
# before). Prints bytes per object. Not part of ctest.
#
# Usage: bench/redis_memory.sh [RUNS]   (env: BUILD_DIR, N_PROC, N_LOCK, N_MACHINE, N_SERVER)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
RUNS=${1:-3}
N_PROC=${N_PROC:-20000}
N_LOCK=${N_LOCK:-20000}
N_MACHINE=${N_MACHINE:-500}
N_SERVER=${N_SERVER:-1000}

command -v redis-cli >/dev/null || apt-get install -y redis-tools >/dev/null
[ -x "$BUILD_DIR/bin/serverdir" ] || { echo "build serverdir first ($BUILD_DIR)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/redis_memory.XXXXXX)
PIDS=()
bench_trap_cleanup

used() { redis-cli -p "$RP" info memory | tr -d '\r' | awk -F: '$1=="used_memory"{print $2}'; }

one_run() {
    RP=$(bench_free_port); SP=$(bench_free_port)
    redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
        >"$WORK/redis.log" 2>&1 & PIDS+=($!)
    for _ in $(seq 1 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.05; done
    cat >"$WORK/sd.json" <<JSON
{"master": {"servers_per_address": 100000, "challenges_per_address": 100000,
            "rate_per_s": 1000000, "max_servers": 1000000}}
JSON
    "$BUILD_DIR/bin/serverdir" --listen "127.0.0.1:$SP" --redis "redis://127.0.0.1:$RP/0" \
        --config "$WORK/sd.json" --threads 4 --log-level warn >"$WORK/sd.log" 2>&1 & PIDS+=($!)
    for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$SP/readyz" >/dev/null 2>&1 && break; sleep 0.05; done
    local base=http://127.0.0.1:$SP m0 m1 m2 m3 m4
    m0=$(used)

    local b i k body
    for ((b = 0; b < N_PROC / 100; b++)); do
        body='{"events":['
        for ((k = 0; k < 100; k++)); do
            i=$((b * 100 + k))
            body+="{\"id\":\"s$i\",\"type\":\"started\",\"instance\":\"zone-m$((i % 200))-$i\",\"machine\":\"m$((i % 200))\",\"service\":\"zone\",\"pid\":$((1000 + i)),\"ts_ms\":1,\"ports\":{\"game\":$((27000 + k))}},"
            body+="{\"id\":\"r$i\",\"type\":\"ready\",\"instance\":\"zone-m$((i % 200))-$i\",\"machine\":\"m$((i % 200))\",\"service\":\"zone\",\"ts_ms\":2}"
            [ $k -lt 99 ] && body+=','
        done
        body+=']}'
        curl -fs -o /dev/null -H 'Content-Type: application/json' -d "$body" "$base/v1/clusters/c1/events"
    done
    m1=$(used)
    curl -fs -o /dev/null -X PUT -H 'Content-Type: application/json' -d '{"holder":"zone-m1-1"}' \
        "$base/v1/locks/player:[1-$N_LOCK]"
    m2=$(used)
    curl -fs -o /dev/null -X PUT -H 'Content-Type: application/json' \
        -d '{"address":"10.0.0.5","labels":{"zone":"eu-1a"},"capacity":400,"version":"0.1.0","ttl_ms":300000}' \
        "$base/v1/clusters/c1/machines/m[1-$N_MACHINE]"
    m3=$(used)
    local ch
    for ((i = 0; i < N_SERVER; i++)); do
        ch=$(curl -fs -X POST "$base/v1/master/challenge" | sed -E 's/.*"challenge":"([^"]+)".*/\1/')
        curl -fs -o /dev/null -H 'Content-Type: application/json' \
            -d "{\"challenge\":\"$ch\",\"port\":$((20000 + i)),\"game\":\"Xonotic\",\"map\":\"stormkeep\",\"name\":\"server $i\",\"players\":3,\"max_players\":16,\"region\":\"europe\",\"tags\":[\"ctf\"]}" \
            "$base/v1/master/heartbeat"
    done
    m4=$(used)
    echo "$m0 $(( (m1 - m0) / N_PROC )) $(( (m2 - m1) / N_LOCK )) $(( (m3 - m2) / N_MACHINE )) $(( (m4 - m3) / N_SERVER ))"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
    rm -f "$WORK"/*.rdb
}

results=()
for ((r = 1; r <= RUNS; r++)); do
    line=$(one_run)
    echo "run $r: empty=${line%% *} B; per process / lock / machine / server (B): ${line#* }"
    results+=("$line")
done
for col in 1 2 3 4 5; do
    med[col]=$(printf '%s\n' "${results[@]}" | awk -v c=$col '{print $c}' | bench_median)
done
echo "median: empty Redis ${med[1]} B (anchor); per process ${med[2]} B (incl. 2 history entries), per lock ${med[3]} B, per machine ${med[4]} B, per master server ${med[5]} B"
