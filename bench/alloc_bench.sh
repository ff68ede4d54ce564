#!/usr/bin/env bash
# Allocation benchmark (bench/README.md "## allocations", docs/allocation.md): serverdir's
# POST /allocations against the same alloc_create.lua run raw on the same Redis.
#
# Starts its own redis-server (no persistence: --save "" --appendonly no) and serverdir
# (open access, --threads SD_THREADS, --log-level warn) on free loopback ports, registers
# MACHINES simulated machines (PUT .../machines/{m}, address, labels, 300 s lease), a
# service "match" with "pool": {"buffer": 0} and POOL (1000) ready instances of it
# (started + ready events, 1000 events per POST), and a service "burst" with BURST_POOL
# ready instances. Then, RUNS rounds of DUR seconds per phase at CLIENTS (64) concurrent
# allocators (bench/alloc_load.c: one thread drives every keep-alive connection from one
# epoll, the same client for both sides; -e threads in alloc_load for one libcurl or
# hiredis thread per allocator):
#
#   sd-pool    each allocator: POST /allocations {"service":"match","payload":{...}},
#              again and again; each instance's release is reported the way its machine's
#              Big Brother reports it (bigbrother/report/reporter.c): one connection per
#              machine, and whenever nothing is in flight on it, every release waiting (up
#              to 500) in one POST /events of "released" events. The pool stays at POOL ready
#              instances. Allocation latency, and the time from an allocation's answer to
#              its release being applied, are recorded.
#   raw-pool   the anchor: the same alloc_create.lua and events_apply.lua (the build's
#              copies, with their prelude) by EVALSHA on the same Redis, with exactly the
#              KEYS and ARGV serverdir passes (the release batches normalized the way
#              serverdir passes them), over the same connections; the allocations and the
#              release batches grouped the way serverdir groups them (alloc_load -g: what
#              is queued while a call is in flight goes in the next call, two calls of
#              each script in flight at most).
#   raw1-pool  the same with one request per call (each allocator and each machine its
#              own EVALSHA, as a client of the scripts without serverdir's group commit
#              would).
#   sd-paced, raw-paced
#              the same two below saturation: each allocator paced so that both sides
#              are offered LOAD (0.5) of serverdir's sd-pool rate of that round; at
#              saturation a closed loop's latency is only CLIENTS / rate (Little's law).
#   sd-R, raw-R
#              the same two at fixed offered rates R in RATES (1000 2000 allocations/s):
#              where the p99 stays under 5 ms, whatever the saturated rate of the round.
#   sd-cycle, raw-cycle
#              the worst case for releases: each allocator sends its allocation's release
#              itself right after the answer, one "released" event per POST /events
#              (events_apply.lua by EVALSHA, grouped, raw), before its next allocation.
#   sd-burst   allocations only, no release, from the BURST_POOL instances of "burst",
#              until DUR passed or the pool is empty (the first no_capacity ends it); then,
#              untimed, every allocation is released with events in batches of 1000.
#   raw-burst  the same by EVALSHA, grouped; raw1-burst one request per call.
#
# Every phase checks that no instance was handed out while another allocation held it
# (double allocations) and that the pool is whole again afterwards (ready_free, allocated
# 0). Then, once (REFILL=0 skips it): one bigbrother in cluster mode supervising gameproc
# (agent health check) with a service whose pool is {"buffer": 2, "min": 2} and
# "confirm_timeout_ms": 600000 (nothing confirms these allocations; they must not expire):
# REFILL_SAMPLES times, wait until ready_free is 2, pause 0.2-1.2 s (a random phase against
# the primary's placement passes), allocate one instance and time from the 201 until
# ready_free is 2 again (polled every 10 ms).
# Prints every figure (with Redis's CPU, the EVALSHA time and the Redis calls per
# allocation from INFO: the calls do not depend on the shared cores' noise; per_call: the
# allocation requests per alloc_create.lua call, batches: the release batches per
# events_apply.lua call, from serverdir's /metrics or alloc_load; sd_within_5ms: the % of
# allocations whose time in serverdir, from the request read to its answer queued, was
# under 5 ms, from its latency histogram; a request that waits for a busy HTTP thread to
# read it waits outside that time),
# the medians, the ratios serverdir / raw and the goals.
#
# Exits non-zero when a phase failed or a figure is missing.
#
# Usage: bench/alloc_bench.sh     (env: BUILD_DIR (build), RUNS (3), DUR (5), CLIENTS (64),
#        POOL (1000), MACHINES (50), BURST_POOL (20000), SD_THREADS (8), LOAD (0.5),
#        RATES ("1000 2000"; "" skips them), REFILL (1), REFILL_SAMPLES (10), PLACEMENT_MS
#        (bigbrother's default), KEEP=1; SMOKE=1: 1 round of 0.3 s phases at 4 allocators,
#        a pool of 20 on 4 machines, a burst pool of 200, one fixed rate (500/s), one
#        refill sample with placement every 200 ms; ctest bench.alloc_smoke)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${RUNS:=1}" "${DUR:=0.3}" "${CLIENTS:=4}" "${POOL:=20}" "${MACHINES:=4}"
    : "${BURST_POOL:=200}" "${SD_THREADS:=2}" "${RATES:=500}" "${REFILL_SAMPLES:=1}"
    : "${PLACEMENT_MS:=200}"
fi
BUILD_DIR=$(cd "${BUILD_DIR:-$ROOT/build}" && pwd) # absolute: the service's command is a path in it
RUNS=${RUNS:-3}
DUR=${DUR:-5}
CLIENTS=${CLIENTS:-64}
POOL=${POOL:-1000}
MACHINES=${MACHINES:-50}
BURST_POOL=${BURST_POOL:-20000}
SD_THREADS=${SD_THREADS:-8}
LOAD=${LOAD:-0.5}
RATES=${RATES-1000 2000}
REFILL=${REFILL:-1}
REFILL_SAMPLES=${REFILL_SAMPLES:-10}
PLACEMENT_MS=${PLACEMENT_MS:-}
BIN=$BUILD_DIR/bin
LUA=$BUILD_DIR/serverdir/lua # the scripts as serverdir runs them, with their prelude
GEN=$BUILD_DIR/bench/alloc_load

command -v redis-server >/dev/null || apt-get install -y redis-server >/dev/null
[ -x "$BIN/serverdir" ] || { echo "build serverdir first (cmake --build $BUILD_DIR)"; exit 1; }
[ -x "$GEN" ] || cmake --build "$BUILD_DIR" -j2 --target alloc_load >/dev/null
if [ "$REFILL" = 1 ] && { [ ! -x "$BIN/bigbrother" ] || [ ! -x "$BIN/gameproc" ]; }; then
    cmake --build "$BUILD_DIR" -j2 --target bigbrother bbctl gameproc >/dev/null
fi

WORK=$(mktemp -d /tmp/alloc-bench.XXXXXX)
PIDS=()
BB_STATE=
cleanup() {
    set +e
    # the game processes first (bigbrother leaves them running on TERM by design)
    [ -z "$BB_STATE" ] || "$BIN/bbctl" --socket "$BB_STATE/control.sock" stop all >/dev/null 2>&1
    bench_cleanup
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rport=$(bench_free_port)
bench_start_redis "$rport" "$WORK"
sport=$(bench_free_port)
"$BIN/serverdir" --listen "127.0.0.1:$sport" --redis "redis://127.0.0.1:$rport/0" \
    --threads "$SD_THREADS" --log-level warn >"$WORK/serverdir.log" 2>&1 &
PIDS+=($!)
SD="http://127.0.0.1:$sport"
bench_wait_http "$SD/readyz" "$!" "$WORK/serverdir.log" serverdir

api() { # method cluster path [body]
    curl -sf -X "$1" -H 'Content-Type: application/json' ${4:+--data-binary "$4"} \
        "$SD/v1/clusters/$2$3"
}

machines_put() { # renews every simulated machine's lease (300 s)
    local k
    for k in $(seq "$MACHINES"); do
        api PUT bench "/machines/m$(printf %03d "$k")" \
            "{\"address\":\"10.0.$((k / 250)).$((k % 250 + 1))\",\"labels\":{\"zone\":\"eu\"},\"ttl_ms\":300000}" >/dev/null
    done
}

# POSTs started + ready events for N instances of service S over the machines, 500
# instances (1000 events) per request.
populate() { # service n
    awk -v s="$1" -v n="$2" -v m="$MACHINES" 'BEGIN {
        for (i = 0; i < n; i++) {
            if (i % 500 == 0) { if (i) print "]}"; printf "{\"events\":["; } else printf ",";
            mm = sprintf("m%03d", i % m + 1);
            printf "{\"id\":\"%s-%d-s\",\"type\":\"started\",\"instance\":\"%s-%05d\",\"machine\":\"%s\",\"service\":\"%s\",\"pid\":%d,\"slot\":%d,\"ports\":{\"game\":%d}},", s, i, s, i, mm, s, 1000 + i, i, 27000 + i % 30000;
            printf "{\"id\":\"%s-%d-r\",\"type\":\"ready\",\"instance\":\"%s-%05d\",\"machine\":\"%s\",\"service\":\"%s\"}", s, i, s, i, mm, s;
        }
        print "]}" }' >"$WORK/populate.jsonl"
    while IFS= read -r body; do
        api POST bench /events "$body" | grep -q '"stale":0' ||
            { echo "populating $1 failed" >&2; exit 1; }
    done <"$WORK/populate.jsonl"
}

# "ready_free allocated" of a service's pool.
pool_of() { # cluster service
    api GET "$1" "/services/$2" | sed -n 's/.*"allocated":\([0-9]*\).*"ready_free":\([0-9]*\).*/\2 \1/p'
}

spec='{"command":"/bin/true","pool":{"buffer":0},"confirm_timeout_ms":600000}'
machines_put
api PUT bench /services/match "$spec" >/dev/null
api PUT bench /services/burst "$spec" >/dev/null
t0=$(date +%s%N)
populate match "$POOL"
populate burst "$BURST_POOL"
setup_ms=$((($(date +%s%N) - t0) / 1000000))
[ "$(pool_of bench match)" = "$POOL 0" ] && [ "$(pool_of bench burst)" = "$BURST_POOL 0" ] ||
    { echo "pools not ready: match $(pool_of bench match), burst $(pool_of bench burst)" >&2; exit 1; }

echo "allocation benchmark: $CLIENTS concurrent allocators, ${DUR}s per phase, $RUNS rounds;"
echo "  pool of $POOL ready instances of \"match\" on $MACHINES machines (kept full: every allocation"
echo "  is followed by its release, a \"released\" event, before that allocator's next one);"
echo "  burst pool of $BURST_POOL ready instances of \"burst\" (allocations only, no release);"
echo "  redis-server without persistence, serverdir --threads $SD_THREADS (open access, log level warn);"
echo "  $(nproc) cores shared with other jobs; load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  setup: $((2 * (POOL + BURST_POOL))) started+ready events in ${setup_ms} ms"

declare -A R
add() { R[$1]+="$2 "; }
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
fail=0

# serverdir's alloc_create.lua calls and the requests they carried, its events_apply.lua
# calls and the batches they carried, and its allocation requests answered within 5 ms
# of their own time and in all, from /metrics.
sd_groups() {
    curl -s "$SD/metrics" | awk '/^serverdir_allocation_calls_total / { c = $2 }
        /^serverdir_allocation_call_requests_total / { r = $2 }
        /^serverdir_events_calls_total / { ec = $2 }
        /^serverdir_events_call_batches_total / { eb = $2 }
        /^serverdir_http_request_duration_seconds_bucket\{method="POST",route="\/v1\/clusters\/\{c\}\/allocations",le="0.005"\}/ { f = $2 }
        /^serverdir_http_request_duration_seconds_bucket\{method="POST",route="\/v1\/clusters\/\{c\}\/allocations",le="\+Inf"\}/ { a = $2 }
        END { print c + 0, r + 0, ec + 0, eb + 0, f + 0, a + 0 }'
}

# Runs one phase of alloc_load (with Redis's own figures: its CPU over the phase, % of
# one core, and the EVALSHA time per allocation, its release included in the cycles) and
# checks that the pool is whole afterwards.
phase() { # name service expected_pool alloc_load-args...
    local name=$1 svc=$2 want=$3 out pool
    shift 3
    redis-cli -p "$rport" config resetstat >/dev/null
    local g0 g1
    g0=$(sd_groups)
    out=$("$GEN" -c "$CLIENTS" -d "$DUR" -s "127.0.0.1:$rport" "$@") || fail=1
    g1=$(sd_groups)
    # serverdir's group commit: allocation requests per alloc_create.lua call, release
    # batches per events_apply.lua call
    [[ $name != sd-* ]] || out+=" $(awk -v a="$g0" -v b="$g1" 'BEGIN { split(a, x, " "); split(b, y, " ");
        c = y[1] - x[1]; e = y[3] - x[3]
        n = y[6] - x[6]
        printf "script_calls=%d per_call=%.2f event_calls=%d batches_per_call=%.2f sd_within_5ms=%.2f", c,
            (c > 0 ? (y[2] - x[2]) / c : 0), e, (e > 0 ? (y[4] - x[4]) / e : 0),
            (n > 0 ? 100 * (y[5] - x[5]) / n : 0) }')"
    [[ $out == *per_call=* ]] || out+=" per_call=1.00" # raw without -g: one request per call
    [[ $out == *batches_per_call=* ]] || out+=" batches_per_call=1.00"
    # Redis calls per allocation, its release included (the scripts' calls, and the few
    # of serverdir's timers): the cost of the scripts without the noise of shared cores
    out+=" calls=$(redis-cli -p "$rport" info commandstats | tr -d '\r' |
        awk -F'[:=,]' -v n="$(field allocs "$out")" '
            /^cmdstat_/ && $1 !~ /cmdstat_(evalsha|info|config|script|client|hello|ping|select)/ { c += $3 }
            END { printf "%.1f", (n > 0 ? c / n : 0) }')"
    pool=$(pool_of bench "$svc")
    [ "$pool" = "$want 0" ] || { echo "  $name: pool not whole afterwards: $pool (want $want 0)" >&2; fail=1; }
    echo "  $name: $out"
    last=$out
    local f
    for f in rate p50_ms p99_ms rel_p50_ms rel_p99_ms double errors redis_us redis_cpu calls per_call \
        batches_per_call sd_within_5ms; do
        add "$name-$f" "$(field "$f" "$out")"
    done
}

for round in $(seq "$RUNS"); do
    echo "round $round (load average $(cut -d' ' -f1 /proc/loadavg))"
    machines_put
    phase sd-pool match "$POOL" -r machine sd "$SD" bench match
    sd_rate=$(field rate "$last")
    phase raw-pool match "$POOL" -r machine -g redis 127.0.0.1 "$rport" "$LUA" sd: bench match
    phase raw1-pool match "$POOL" -r machine redis 127.0.0.1 "$rport" "$LUA" sd: bench match
    # below saturation: both sides offered LOAD x serverdir's rate of this round
    period=$(awk -v c="$CLIENTS" -v r="$sd_rate" -v l="$LOAD" 'BEGIN { printf "%.0f", c * 1e6 / (r * l) }')
    phase sd-paced match "$POOL" -p "$period" -r machine sd "$SD" bench match
    phase raw-paced match "$POOL" -p "$period" -r machine -g redis 127.0.0.1 "$rport" "$LUA" sd: bench match
    for r in $RATES; do # fixed offered rates
        period=$(awk -v c="$CLIENTS" -v r="$r" 'BEGIN { printf "%.0f", c * 1e6 / r }')
        phase "sd-$r" match "$POOL" -p "$period" -r machine sd "$SD" bench match
        phase "raw-$r" match "$POOL" -p "$period" -r machine -g redis 127.0.0.1 "$rport" "$LUA" sd: bench match
    done
    phase sd-cycle match "$POOL" -r event sd "$SD" bench match
    phase raw-cycle match "$POOL" -r event -g redis 127.0.0.1 "$rport" "$LUA" sd: bench match
    phase sd-burst burst "$BURST_POOL" -r none sd "$SD" bench burst
    phase raw-burst burst "$BURST_POOL" -r none -g redis 127.0.0.1 "$rport" "$LUA" sd: bench burst
    phase raw1-burst burst "$BURST_POOL" -r none redis 127.0.0.1 "$rport" "$LUA" sd: bench burst
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

med() { bench_median ${R[$1]}; }
sum() { awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; print s }' <<<"${R[$1]}"; }

refill_line=""
if [ "$REFILL" = 1 ]; then
    echo
    echo "pool refill: one bigbrother (cluster mode, placement_interval_ms ${PLACEMENT_MS:-default 1000})" \
        "supervising gameproc, pool {\"buffer\": 2, \"min\": 2}, $REFILL_SAMPLES samples"
    BB_STATE=$WORK/bb/st
    mkdir -p "$WORK/bb"
    placement=""
    [ -z "$PLACEMENT_MS" ] || placement="\"placement_interval_ms\": $PLACEMENT_MS,"
    cat >"$WORK/bb/bb.json" <<EOF
{ "machine": "bb1", "cluster": "pools", "address": "127.0.0.1", "state_dir": "$BB_STATE",
  "capacity": 100, "serverdir": { "urls": ["$SD"] }, "mode": "cluster",
  $placement "services": [] }
EOF
    "$BIN/bigbrother" --config "$WORK/bb/bb.json" --log-level warn >"$WORK/bb/bb.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 300); do api GET pools /primary 2>/dev/null | grep -q '"holder":"bb1"' && break; sleep 0.1; done
    api GET pools /primary | grep -q '"holder":"bb1"' || { echo "bigbrother never became primary" >&2; exit 1; }
    api PUT pools /services/pooled "{\"command\":\"$BIN/gameproc\",\"args\":[\"--tick-hz\",\"20\"],
        \"health\":{\"type\":\"agent\",\"start_timeout_ms\":10000,\"liveness_timeout_ms\":3000},
        \"stop\":{\"signal\":\"TERM\",\"grace_ms\":2000},
        \"pool\":{\"buffer\":2,\"min\":2},\"confirm_timeout_ms\":600000}" >/dev/null
    out=$("$GEN" refill "$SD" pools pooled 2 "$REFILL_SAMPLES") ||
        { echo "$out"; echo "the refill measurement failed (see $WORK/bb/bb.log)" >&2; exit 1; }
    sed 's/^/  /' <<<"$out"
    refill_line=$(tail -1 <<<"$out")
fi

sdp=$(med sd-pool-rate) rawp=$(med raw-pool-rate)
sdc=$(med sd-cycle-rate) rawc=$(med raw-cycle-rate) sdb=$(med sd-burst-rate) rawb=$(med raw-burst-rate)
PHASES="sd-pool raw-pool raw1-pool sd-paced raw-paced"
for r in $RATES; do PHASES+=" sd-$r raw-$r"; done
PHASES+=" sd-cycle raw-cycle sd-burst raw-burst raw1-burst"
doubles=0
figs=()
for p in $PHASES; do
    doubles=$((doubles + $(sum $p-double)))
    figs+=("$p allocations/s=$(med $p-rate)")
done
bench_check_positive "${figs[@]}"
figs=()
for p in $PHASES; do figs+=("$p p99=$(med $p-p99_ms)" "$p Redis calls=$(med $p-calls)"); done
[ -z "$refill_line" ] || figs+=("refill median=$(field median_ms "$refill_line")")
bench_check_figures "${figs[@]}"
echo
echo "medians of $RUNS rounds ($CLIENTS concurrent allocators; load average at the end: $load_end):"
printf '  %-10s %9s %8s %8s %11s %11s %9s %10s %6s %8s %8s   %s\n' phase allocs/s p50_ms p99_ms release_p50 release_p99 redis_us redis_cpu% calls per_call batches "runs (allocs/s)"
for p in $PHASES; do
    printf '  %-10s %9s %8s %8s %11s %11s %9s %10s %6s %8s %8s   %s\n' "$p" "$(med $p-rate)" "$(med $p-p50_ms)" \
        "$(med $p-p99_ms)" "$(med $p-rel_p50_ms)" "$(med $p-rel_p99_ms)" "$(med $p-redis_us)" \
        "$(med $p-redis_cpu)" "$(med $p-calls)" "$(med $p-per_call)" "$(med $p-batches_per_call)" \
        "${R[$p-rate]% }"
done
echo "ratios serverdir / raw Redis (same scripts):"
echo "  pool of $POOL kept full, releases reported per machine: $(bench_ratio "$sdp" "$rawp")"
echo "  pool of $POOL kept full, one release per request:       $(bench_ratio "$sdc" "$rawc")"
echo "  allocations only (burst pool):                       $(bench_ratio "$sdb" "$rawb")"
echo "what the group commit buys on Redis alone (raw, grouped / one request per call):"
echo "  pool of $POOL: $(bench_ratio "$rawp" "$(med raw1-pool-rate)"), allocations only: $(bench_ratio "$rawb" "$(med raw1-burst-rate)")"
echo "goals: >= 10,000 allocations/s: pool of $POOL $sdp/s (one release per request"
echo "  $sdc/s), allocations only $sdb/s;"
echo "  p99 < 5 ms: $(med sd-paced-p99_ms) ms at $(med sd-paced-rate)/s ($LOAD of the saturated rate; raw Redis"
echo "  $(med raw-paced-p99_ms) ms at the same load); saturated: $(med sd-pool-p99_ms) ms (pool of $POOL),"
echo "  $(med sd-burst-p99_ms) ms (allocations only), where a closed loop's latency is $CLIENTS / rate;"
echo "  at $LOAD of the rate, serverdir's own time (from the request read to its answer queued,"
echo "  serverdir_http_request_duration_seconds: without the wait for an HTTP thread to read it)"
echo "  was under 5 ms for $(med sd-paced-sd_within_5ms)% of the allocations;"
[ -z "$RATES" ] || echo "  p99 at fixed offered rates (pool of $POOL, releases per machine):"
for r in $RATES; do
    echo "    $r/s: $(med sd-$r-p99_ms) ms (raw Redis $(med raw-$r-p99_ms) ms; under 5 ms inside" \
        "serverdir: $(med sd-$r-sd_within_5ms)%)"
done
echo "  0 double allocations: $doubles"
if [ -n "$refill_line" ]; then
    echo "pool below buffer -> new instance ready (bigbrother + gameproc):" \
        "median $(field median_ms "$refill_line") ms (min $(field min_ms "$refill_line")," \
        "max $(field max_ms "$refill_line"), $REFILL_SAMPLES samples)"
fi
echo "for context, not measured here: Agones publishes about 300-400 allocations/s in its own"
echo "  load tests, with allocation requests batched for 500 ms by default."
exit "$fail"
