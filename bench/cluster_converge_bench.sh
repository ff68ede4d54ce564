#!/usr/bin/env bash
# Cluster convergence benchmark: 0 -> N (1000) instances of a light service across B (5)
# bigbrothers in cluster mode on this machine, against one serverdir + redis-server.
#
# Per run, on fresh free loopback ports:
#   1. cluster: B bigbrothers in cluster mode (capacity 400, placement every 300 ms);
#      once one holds the primary lease, PUT the service with count N through the API
#      and time until the live directory shows N instances ready (placement, assignment
#      long-polls, N spawns, 2N events through the outboxes); then scale to 0 and time
#      until the directory is empty (N SHUTDOWN-less stops: the service has no agent).
#      serverdir's events/s during each phase comes from its own
#      serverdir_events_accepted_total counter (/metrics) over the phase's duration;
#   2. anchor: B bigbrothers in standalone-with-reporting mode, each with the same service
#      statically configured with count N/B, started at once: the same spawns and events
#      without any orchestration. Time until the directory shows N ready.
# The service is `sleep` with health "none" (ready at spawn), the lightest process.
# Prints each run, the medians, and cluster / anchor; exits non-zero when a figure is
# missing.
#
# Usage: bench/cluster_converge_bench.sh [RUNS]   (env: BUILD_DIR (build), RUNS (3), N,
#        B, TIMEOUT_S (180), KEEP=1; SMOKE=1: 1 run of 10 instances across 2
#        bigbrothers, ctest bench.cluster_converge_smoke)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${RUNS:=1}" "${N:=10}" "${B:=2}" "${TIMEOUT_S:=60}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
RUNS=${1:-${RUNS:-3}}
N=${N:-1000}
B=${B:-5}
BIN=$BUILD_DIR/bin
TIMEOUT_S=${TIMEOUT_S:-180}
SLEEP_BIN=$(command -v sleep)

command -v redis-server >/dev/null || apt-get install -y redis-server >/dev/null
if [ ! -x "$BIN/serverdir" ] || [ ! -x "$BIN/bigbrother" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD_DIR" -j2 --target serverdir bigbrother bbctl >/dev/null
fi

WORK=$(mktemp -d /tmp/cluster_bench.XXXXXX)
PIDS=()
BB_DIRS=()
cleanup() {
    set +e
    for d in "${BB_DIRS[@]}"; do
        "$BIN/bbctl" --socket "$d/control.sock" stop all >/dev/null 2>&1
    done
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { date +%s%3N; }

OPS=ops-bench-token-0123456789
BBT=bigbrother-bench-token-0123456789
(umask 077; printf 'ops %s\nbigbrother %s\n' "$OPS" "$BBT" >"$WORK/tokens")

api() { # method path [body]
    curl -sf -X "$1" -H "Authorization: Bearer $OPS" -H 'Content-Type: application/json' \
        ${3:+--data "$3"} "$SD/v1/clusters/bench$2"
}

# The number of live directory records of the service in state $1.
count() { api GET "/processes?service=light&state=$1&limit=1" | sed -n 's/.*"total":\([0-9]*\).*/\1/p'; }
live() { api GET "/processes?service=light&limit=1" | sed -n 's/.*"total":\([0-9]*\).*/\1/p'; }
accepted() { curl -sf "$SD/metrics" | awk '$1=="serverdir_events_accepted_total"{print $2}'; }

wait_for() { # what-function want
    local deadline=$((SECONDS + TIMEOUT_S)) n
    while :; do
        n=$($1 2>/dev/null || echo -1)
        [ "${n:-0}" = "$2" ] && return 0
        [ $SECONDS -ge $deadline ] && { echo "timed out: $1 = $n, want $2" >&2; return 1; }
        sleep 0.1
    done
}

start_stack() { # run
    local rp sp try
    mkdir -p "$WORK/$1"
    for try in 1 2 3 4 5; do
        rp=$(bench_free_port)
        redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$WORK/$1" >"$WORK/$1/redis.log" 2>&1 &
        sleep 0.3
        kill -0 $! 2>/dev/null && break
    done
    PIDS+=($!)
    sp=$(bench_free_port)
    SD=http://127.0.0.1:$sp
    "$BIN/serverdir" --listen "127.0.0.1:$sp" --redis "redis://127.0.0.1:$rp/0" \
        --tokens "$WORK/tokens" >"$WORK/$1/serverdir.log" 2>&1 &
    SD_PID=$!
    PIDS+=($SD_PID)
    bench_wait_http "$SD/readyz" "$SD_PID" "$WORK/$1/serverdir.log" serverdir
}

# Starts bigbrother k of run $1; $2: "cluster" or a static services JSON array.
start_bb() { # run k mode
    local dir=$WORK/$1/bb$2 extra
    mkdir -p "$dir"
    if [ "$3" = cluster ]; then
        extra='"mode": "cluster", "primary_ttl_ms": 3000, "placement_interval_ms": 300,'
        extra+=' "services": []'
    else
        extra="\"services\": $3"
    fi
    cat >"$dir/bb.json" <<EOF
{ "machine": "m$2", "cluster": "bench", "state_dir": "$dir/st", "capacity": 400,
  "serverdir": { "urls": ["$SD"], "token": "$BBT" }, "lease_ttl_ms": 5000, $extra }
EOF
    "$BIN/bigbrother" --config "$dir/bb.json" --log-level warn >"$dir/bb.log" 2>&1 &
    PIDS+=($!)
    BB_DIRS+=("$dir/st")
}

stop_bbs() {
    local d
    for d in "${BB_DIRS[@]}"; do
        "$BIN/bbctl" --socket "$d/control.sock" stop all >/dev/null 2>&1 || true
    done
    BB_DIRS=()
}

stop_stack() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
}

SPEC="{\"command\": \"$SLEEP_BIN\", \"args\": [\"86400\"], \"count\": $N,
       \"health\": {\"type\": \"none\"}, \"stop\": {\"signal\": \"TERM\", \"grace_ms\": 2000}}"

run_cluster() { # run -> "up_ms up_events_per_s down_ms down_events_per_s"
    start_stack "c$1"
    local k
    for k in $(seq "$B"); do start_bb "c$1" "$k" cluster; done
    local deadline=$((SECONDS + 30))
    until api GET /primary | grep -q '"holder":"m'; do
        [ $SECONDS -ge $deadline ] && { echo "no primary" >&2; return 1; }
        sleep 0.1
    done
    local e0 t0 t1 e1 t2 e2
    e0=$(accepted); t0=$(now_ms)
    api PUT /services/light "$SPEC" >/dev/null
    wait_for "count ready" "$N"
    t1=$(now_ms); e1=$(accepted)
    api POST /services/light/scale '{"count": 0}' >/dev/null
    wait_for live 0
    t2=$(now_ms); e2=$(accepted)
    stop_bbs
    stop_stack
    awk -v a=$((t1 - t0)) -v ea=$((e1 - e0)) -v b=$((t2 - t1)) -v eb=$((e2 - e1)) \
        'BEGIN{printf "%d %.0f %d %.0f\n", a, ea / (a / 1000), b, eb / (b / 1000)}'
}

run_anchor() { # run -> "up_ms events_per_s"
    start_stack "a$1"
    local per=$((N / B)) k svc e0 t0 t1 e1
    svc="[{\"name\": \"light\", \"command\": \"$SLEEP_BIN\", \"args\": [\"86400\"],"
    svc+=" \"count\": $per, \"health\": {\"type\": \"none\"}}]"
    e0=$(accepted); t0=$(now_ms)
    for k in $(seq "$B"); do start_bb "a$1" "$k" "$svc"; done
    wait_for "count ready" $((per * B))
    t1=$(now_ms); e1=$(accepted)
    stop_bbs
    stop_stack
    awk -v a=$((t1 - t0)) -v ea=$((e1 - e0)) 'BEGIN{printf "%d %.0f\n", a, ea / (a / 1000)}'
}


echo "cluster convergence: $N instances of sleep (health none) across $B bigbrothers," \
     "$RUNS runs, $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
: >"$WORK/c.txt"
: >"$WORK/a.txt"
for r in $(seq "$RUNS"); do
    c=$(run_cluster "$r")
    a=$(run_anchor "$r")
    echo "$c" >>"$WORK/c.txt"
    echo "$a" >>"$WORK/a.txt"
    read -r up ups down downs <<<"$c"
    read -r aup aups <<<"$a"
    echo "run $r: cluster 0->$N ${up} ms (${ups} events/s), $N->0 ${down} ms" \
         "(${downs} events/s); anchor static start ${aup} ms (${aups} events/s)"
done
mu=$(awk '{print $1}' "$WORK/c.txt" | bench_median)
mue=$(awk '{print $2}' "$WORK/c.txt" | bench_median)
md=$(awk '{print $3}' "$WORK/c.txt" | bench_median)
mde=$(awk '{print $4}' "$WORK/c.txt" | bench_median)
ma=$(awk '{print $1}' "$WORK/a.txt" | bench_median)
mae=$(awk '{print $2}' "$WORK/a.txt" | bench_median)
bench_check_positive "cluster 0->N ms=$mu" "cluster N->0 ms=$md" "anchor ms=$ma" \
    "cluster 0->N events/s=$mue" "cluster N->0 events/s=$mde" "anchor events/s=$mae"
echo "median: cluster 0->$N converged in $mu ms, serverdir took $mue events/s"
echo "median: cluster $N->0 converged in $md ms, serverdir took $mde events/s"
echo "median: anchor (static config, same spawns and events) $ma ms, $mae events/s"
awk -v c="$mu" -v a="$ma" 'BEGIN{printf "ratio cluster/anchor convergence time: %.2f\n", c / a}'
