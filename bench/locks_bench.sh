#!/usr/bin/env bash
# Lock table and blob store benchmark (bench/README.md "## locks").
#
# Starts its own redis-server, serverdir and etcd on free loopback ports, then measures
# at CLIENTS concurrent clients (default 64), each for DUR seconds (default 5):
#   - lock acquire + release pairs per second and their p99, through serverdir;
#   - the same pairs by the same Lua scripts straight on Redis (EVALSHA, same KEYS/ARGV);
#   - etcd lock + unlock pairs through its v3 HTTP JSON gateway;
#   - 10 KB blob saves through serverdir and by the same script straight on Redis;
#   - lock pairs below saturation: both sides paced to half the rate serverdir reached in
#     the round (locks_load -R), their p99 side by side, in HALF_SLICES short runs per
#     side (HALF_DUR seconds each) that take turns, so that a burst of another tenant's
#     work lands on one slice of one side rather than on a whole side's figure; each
#     slice pair's difference is kept as well (the paired figure);
#   - redis-benchmark of the acquire and save scripts (single-script figures);
#   - the same lock pairs through serverdir driven a second way, by wrk (Debian's) with
#     bench/wrk_lock_pairs.lua, with each generator's CPU per pair: the check that
#     locks_load is not what limits serverdir's rate.
# It runs ROUNDS rounds (default 3), prints every figure and the medians with ratios, and
# exits non-zero when a figure is missing or any operation failed (errors=, failed=).
# Needs a build (BUILD_DIR, default ./build); installs etcd-server, redis-tools and wrk when
# missing. Other knobs: CLIENTS, DUR, ROUNDS, BLOB (10240), SD_THREADS (8), RB_N (4000 per
# client) redis-benchmark calls, HALF (the pace of the runs below saturation, pairs/s;
# default half of serverdir's rate in the round), HALF_SLICES (3), HALF_DUR (2). The
# saturated runs take turns too: serverdir first in odd rounds, raw Redis first in even
# ones. SMOKE=1: 1 round of 1 s runs at 4 clients, 1 half-rate slice, 100 redis-benchmark
# calls per client (ctest bench.locks_smoke).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${CLIENTS:=4}" "${DUR:=1}" "${ROUNDS:=1}" "${RB_N:=100}" "${SD_THREADS:=2}"
    : "${HALF_SLICES:=1}" "${HALF_DUR:=1}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
CLIENTS=${CLIENTS:-64}
DUR=${DUR:-5}
ROUNDS=${ROUNDS:-3}
BLOB=${BLOB:-10240}
SD_THREADS=${SD_THREADS:-8}
RB_N=${RB_N:-4000}
HALF_SLICES=${HALF_SLICES:-3}
HALF_DUR=${HALF_DUR:-2}

[ -x "$BUILD_DIR/bin/serverdir" ] || { echo "build serverdir first (cmake --build build)"; exit 1; }
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${need[@]}" >/dev/null
fi

WORK=$(mktemp -d /tmp/locks-bench.XXXXXX)
PIDS=()
bench_trap_cleanup

[ -x "$BUILD_DIR/bench/locks_load" ] || cmake --build "$BUILD_DIR" -j2 --target locks_load >/dev/null

rport=$(bench_free_port)
bench_start_redis "$rport" "$WORK"

sport=$(bench_free_port)
echo "game bench-game-token" >"$WORK/tokens"
"$BUILD_DIR/bin/serverdir" --listen "127.0.0.1:$sport" --redis "redis://127.0.0.1:$rport/0" \
    --tokens "$WORK/tokens" --threads "$SD_THREADS" ${SD_HTTP_THREADS:+--http-threads "$SD_HTTP_THREADS"} --log-level warn >"$WORK/serverdir.log" 2>&1 &
PIDS+=($!)
SD_PID=$!
sd="http://127.0.0.1:$sport"
bench_wait_http "$sd/readyz" "$SD_PID" "$WORK/serverdir.log" serverdir

eport=$(bench_free_port)
epeer=$(bench_free_port)
etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$eport" \
    --advertise-client-urls "http://127.0.0.1:$eport" --listen-peer-urls "http://127.0.0.1:$epeer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$epeer" \
    --initial-cluster "bench=http://127.0.0.1:$epeer" >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
etcd_url="http://127.0.0.1:$eport"
bench_wait_http "$etcd_url/health" "$!" "$WORK/etcd.log" etcd

lua="$BUILD_DIR/serverdir/lua" # the scripts as serverdir runs them, with their prelude
acq_sha=$(redis-cli -p "$rport" SCRIPT LOAD "$(cat "$lua/lock_acquire.lua")")
save_sha=$(redis-cli -p "$rport" SCRIPT LOAD "$(cat "$lua/blob_save.lua")")
head -c "$BLOB" /dev/zero | tr '\0' 'x' >"$WORK/blob"
tok=0123456789abcdef0123456789abcdef # a lock_token for the redis-benchmark runs

declare -A rates p99s rus gcpu
half_diffs=() # per half-rate slice pair: serverdir's p99 - raw Redis's (ms)
failed_ops=() # runs with operations that failed: a bench that errs measures nothing
# Where an operation's time goes, beside each run's rate: Redis's EVALSHA calls per
# operation and microseconds per call and per operation (INFO commandstats, reset before
# the run: Redis's own time in the scripts), Redis's CPU (% of one core, INFO cpu),
# serverdir's CPU per operation (/proc/PID/stat) and, through serverdir, the requests its
# group commit put in one call (serverdir_lock_script_items_total / _calls_total).
redis_stats() { # -> "evalsha_calls evalsha_usec cpu_s"
    redis-cli -p "$rport" INFO all | tr -d '\r' | awk -F'[:=,]' '
        /^cmdstat_evalsha:/ { c = $3; u = $5 }
        /^used_cpu_(sys|user):/ { s += $2 }
        END { printf "%d %d %.3f", c, u, s }'
}
sd_cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$SD_PID/stat"; }
sd_script_counts() { # -> "calls items" of the lock-path scripts
    curl -fs "$sd/metrics" | awk '
        /^serverdir_lock_script_calls_total/ { c += $2 }
        /^serverdir_lock_script_items_total/ { i += $2 }
        END { printf "%d %d", c, i }'
}
run() { # name, locks_load args... (RUN_DUR: seconds, default DUR)
    local name=$1
    shift
    redis-cli -p "$rport" FLUSHALL >/dev/null
    redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
    local out r0 r1 t0 t1 g0 g1 w0 w1
    r0=$(redis_stats) t0=$(sd_cpu_ticks) g0=$(sd_script_counts) w0=$(date +%s.%N)
    out=$("$BUILD_DIR/bench/locks_load" -c "$CLIENTS" -d "${RUN_DUR:-$DUR}" "$@")
    r1=$(redis_stats) t1=$(sd_cpu_ticks) g1=$(sd_script_counts) w1=$(date +%s.%N)
    local ops
    ops=$(sed -n 's/.* ops=\([0-9]*\).*/\1/p' <<<"$out")
    [[ $name == etcd-* ]] || out+=$(awk -v a="$r0" -v b="$r1" -v ops="$ops" -v t0="$t0" -v t1="$t1" -v g0="$g0" \
        -v g1="$g1" -v w0="$w0" -v w1="$w1" -v hz="$(getconf CLK_TCK)" -v sd=$([[ $name == sd-* ]] && echo 1) '
        BEGIN { split(a, x, " "); split(b, y, " "); split(g0, p, " "); split(g1, q, " ")
            c = y[1] - x[1]; u = y[2] - x[2]; ops = ops > 0 ? ops : 1
            printf " redis_calls_per_op=%.2f redis_us_per_call=%.1f redis_us_per_op=%.1f redis_cpu=%.0f%% redis_cpu_us_per_op=%.1f",
                c / ops, (c > 0 ? u / c : 0), u / ops, 100 * (y[3] - x[3]) / (w1 - w0), (y[3] - x[3]) * 1e6 / ops
            if (sd) printf " sd_cpu_us_per_op=%.0f items_per_call=%.2f", (t1 - t0) / hz * 1e6 / ops,
                (q[1] > p[1] ? (q[2] - p[2]) / (q[1] - p[1]) : 0) }')
    echo "  $out"
    rates[$name]+="$(sed -n 's/.* rate=\([0-9]*\).*/\1/p' <<<"$out") "
    p99s[$name]+="$(sed -n 's/.* p99_ms=\([0-9.]*\).*/\1/p' <<<"$out") "
    gcpu[$name]+="$(sed -n 's/.* gen_cpu_us_per_op=\([0-9.]*\).*/\1/p' <<<"$out") "
    local errs
    errs=$(sed -n 's/.* errors=\([0-9]*\).*/\1/p' <<<"$out")
    [ "${errs:-x}" = 0 ] || failed_ops+=("$name=${errs:-?}")
    [[ $name == etcd-* ]] && rus[$name]="-" ||
        rus[$name]+="$(sed -n 's/.* redis_us_per_op=\([0-9.]*\).*/\1/p' <<<"$out") "
}
wrk_run() { # serverdir's lock pairs driven by wrk: its rate and CPU per pair (bash's times)
    redis-cli -p "$rport" FLUSHALL >/dev/null
    local out
    out=$( (wrk -t2 -c"$CLIENTS" -d"${DUR}s" -s "$ROOT/bench/wrk_lock_pairs.lua" "$sd" -- \
        bench-game-token | grep '^wrk lock'; times >"$WORK/times"; tail -1 "$WORK/times") | tr '\n' ' ')
    local pairs rate failed cpu
    pairs=$(sed -n 's/.* pairs=\([0-9]*\).*/\1/p' <<<"$out")
    rate=$(sed -n 's/.* rate=\([0-9]*\).*/\1/p' <<<"$out")
    failed=$(sed -n 's/.* failed=\([0-9]*\).*/\1/p' <<<"$out")
    # times: the subshell's children (wrk): "0m1.234s 0m0.567s"
    cpu=$(awk -v p="${pairs:-0}" '{ n = split($0, f, " "); u = f[n - 1]; s = f[n]
        split(u, a, "m"); split(s, b, "m"); t = a[1] * 60 + a[2] + b[1] * 60 + b[2]
        printf "%.1f", (p > 0 ? t * 1e6 / p : 0) }' <<<"$out")
    echo "  wrk sd-lock: pairs=${pairs:-0} rate=${rate:-0} failed=${failed:-?} gen_cpu_us_per_op=$cpu"
    [ "${failed:-x}" = 0 ] || failed_ops+=("sd-lock-wrk=${failed:-?}")
    rates[sd-lock-wrk]+="${rate:-0} "
    p99s[sd-lock-wrk]+="- "
    rus[sd-lock-wrk]="-"
    gcpu[sd-lock-wrk]+="$cpu "
}
rb() { # name, redis-benchmark command...
    local name=$1
    shift
    redis-cli -p "$rport" FLUSHALL >/dev/null
    # The saves run under a held lock (lock_seq 1, token $tok), so they are accepted.
    [ "$name" != rb-save ] ||
        redis-cli -p "$rport" HSET sd:lock:rb holder rb seq 1 expires 0 token "$tok" >/dev/null
    redis-cli -p "$rport" CONFIG RESETSTAT >/dev/null
    local out
    out=$(redis-benchmark -p "$rport" -c "$CLIENTS" -n $((CLIENTS * RB_N)) -r 1000000 --csv "$@" |
        tail -1)
    # CSV: "test","rps","avg","min","p50","p95","p99","max"; the test name holds the args.
    local rps p99 us
    rps=$(awk -F'","' '{print $(NF-6)}' <<<"$out" | cut -d. -f1)
    p99=$(awk -F'","' '{print $(NF-1)}' <<<"$out")
    # one script per call: Redis's time per call is the script's cost
    us=$(redis_stats | awk '{ printf "%.1f", ($1 > 0 ? $2 / $1 : 0) }')
    echo "  redis-benchmark $name: rps=$rps p99_ms=$p99 redis_us_per_call=$us"
    rates[$name]+="$rps "
    p99s[$name]+="$p99 "
    rus[$name]+="$us "
}

echo "locks benchmark: $CLIENTS clients, ${DUR}s per run, $ROUNDS rounds, blob $BLOB bytes," \
    "serverdir --threads $SD_THREADS, $(nproc) cores (shared machine: figures are noisy)"
for round in $(seq "$ROUNDS"); do
    echo "round $round (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    if ((round % 2)); then
        run sd-lock sd-lock "$sd" bench-game-token
        run redis-lock redis-lock 127.0.0.1 "$rport" "$lua" sd:
    else
        run redis-lock redis-lock 127.0.0.1 "$rport" "$lua" sd:
        run sd-lock sd-lock "$sd" bench-game-token
    fi
    wrk_run
    run etcd-lock etcd-lock "$etcd_url"
    if ((round % 2)); then
        run sd-blob sd-blob "$sd" bench-game-token "$BLOB"
        run redis-blob redis-blob 127.0.0.1 "$rport" "$lua" sd: "$BLOB"
    else
        run redis-blob redis-blob 127.0.0.1 "$rport" "$lua" sd: "$BLOB"
        run sd-blob sd-blob "$sd" bench-game-token "$BLOB"
    fi
    # below saturation: both sides paced to half the rate serverdir reached this round,
    # in slices that take turns
    half=${HALF:-$(( $(sed 's/.* \([0-9]*\) $/\1/' <<<"${rates[sd-lock]}") / 2 ))}
    for slice in $(seq "$HALF_SLICES"); do
        for side in $( ((slice % 2)) && echo "sd redis" || echo "redis sd"); do
            if [ "$side" = sd ]; then
                RUN_DUR=$HALF_DUR run sd-half -R "$half" sd-lock "$sd" bench-game-token
            else
                RUN_DUR=$HALF_DUR run redis-half -R "$half" redis-lock 127.0.0.1 "$rport" "$lua" sd:
            fi
        done
        a=${p99s[sd-half]% } b=${p99s[redis-half]% }
        half_diffs+=("$(awk -v a="${a##* }" -v b="${b##* }" 'BEGIN { printf "%.2f", a - b }')")
    done
    # (quota of locks 0: every call adds a key to holder rb's index, past any quota)
    rb rb-acquire EVALSHA "$acq_sha" 3 sd:lock:rb-__rand_int__ sd:blob:rb-__rand_int__ 'sd:lock:rb#h' rb 0 0 604800000 '' 0 sd: 1 "$tok" 0 '' '' '' '' 0 '' '' ''
    rb rb-save EVALSHA "$save_sha" 3 sd:blob:rb sd:lock:rb sd:quota:blob:rb 1 "$tok" __rand_int__ "$(cat "$WORK/blob")" '' '' '' '' '' rb 1073741824 '' ''
done

echo
echo "medians of $ROUNDS rounds ($CLIENTS concurrent clients):"
for m in sd-lock sd-lock-wrk redis-lock etcd-lock sd-blob redis-blob sd-half redis-half rb-acquire rb-save; do
    printf '  %-11s %8s ops/s   p99 %6s ms   redis_us/op %6s   gen_cpu_us/op %5s   (runs: %s)\n' "$m" \
        "$(bench_median ${rates[$m]})" "$(bench_median ${p99s[$m]})" "$(bench_median ${rus[$m]})" \
        "$(bench_median ${gcpu[$m]:--})" "${rates[$m]% }"
done
figs=()
for m in sd-lock sd-lock-wrk redis-lock etcd-lock sd-blob redis-blob rb-acquire rb-save; do
    figs+=("$m ops/s=$(bench_median ${rates[$m]})")
done
bench_check_positive "${figs[@]}"
for m in sd-lock redis-lock etcd-lock sd-blob redis-blob sd-half redis-half rb-acquire rb-save; do
    figs+=("$m p99=$(bench_median ${p99s[$m]})")
done
bench_check_figures "${figs[@]}"
sdl=$(bench_median ${rates[sd-lock]})
sdb=$(bench_median ${rates[sd-blob]})
echo "ratios:"
echo "  lock pairs: serverdir / raw Redis (same scripts)  = $(bench_ratio "$sdl" "$(bench_median ${rates[redis-lock]})")  (goal >= 0.9)"
echo "  lock pairs: serverdir / etcd v3 lock+unlock       = $(bench_ratio "$sdl" "$(bench_median ${rates[etcd-lock]})")  (goal >= 5)"
echo "  blob saves: serverdir / raw Redis (same script)   = $(bench_ratio "$sdb" "$(bench_median ${rates[redis-blob]})")  (goal >= 0.9)"
echo "  blob saves: serverdir / redis-benchmark blob_save = $(bench_ratio "$sdb" "$(bench_median ${rates[rb-save]})")"
echo "  lock pairs at half serverdir's rate: p99 serverdir $(bench_median ${p99s[sd-half]}) ms," \
    "raw Redis $(bench_median ${p99s[redis-half]}) ms (goal: within 2 ms);" \
    "paired slices, serverdir - raw: median $(bench_median "${half_diffs[@]}") ms," \
    "$(printf '%s\n' "${half_diffs[@]}" | awk '$1 <= 2 { n++ } END { print n + 0 }')" \
    "of ${#half_diffs[@]} at most 2 ms above raw (${half_diffs[*]})"
echo "  lock pairs: serverdir / redis-benchmark acquire   = $(bench_ratio "$sdl" "$(bench_median ${rates[rb-acquire]})")  (one script per op there, two per pair here)"
echo "  generators: serverdir's lock pairs by locks_load / by wrk = $(bench_ratio "$sdl" "$(bench_median ${rates[sd-lock-wrk]})")" \
    "(CPU per pair: locks_load $(bench_median ${gcpu[sd-lock]}) us, wrk $(bench_median ${gcpu[sd-lock-wrk]}) us)"
if [ ${#failed_ops[@]} -gt 0 ]; then
    echo "runs with failed operations: ${failed_ops[*]}" >&2
    exit 1
fi
