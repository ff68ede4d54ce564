#!/usr/bin/env bash
# Supervision figures (bench/README.md, "supervision"), bigbrother against supervisord (the
# anchor) in one run:
#   - crash -> replacement running: kill -9 of a supervised process until its replacement
#     has started (backoff 0), median and p90 over CRASH_SAMPLES kills, both supervisors;
#   - hang -> replacement running: a process stops sending WATCHDOG=1 (sd_notify health,
#     liveness deadline HANG_DEADLINE_MS, hang signal KILL, backoff 0); how long after the
#     deadline its replacement has started, median / p99 / max (bigbrother only:
#     supervisord has no hang detection);
#   - N idle supervised processes: the supervisor's CPU (% of one core, utime+stime from
#     /proc/PID/stat over CPU_S seconds) and RSS (VmRSS), both supervisors.
# The supervised program is bench/supervise_probe (it logs its start time on
# CLOCK_MONOTONIC; `supervise_probe kill` logs the kill time), the same for both.
#
# usage: bench/supervise_bench.sh
# env:   BUILD_DIR=build N=1000 CPU_S=30 SETTLE_S=5 (start-up let settle before the CPU is
#        measured) CRASH_SAMPLES=25 HANG_SAMPLES=100 HANG_DEADLINE_MS=200
#        NICE=-10 (both supervisors and their processes), BENCH_TMP=/dev/shm (work dir)
#        KEEP=1 keeps the work dir (probe logs with every sample, supervisor logs)
#        SMOKE=1: 10 idle processes, 1 s settled and 1 s of CPU, 2 kills, 2 hangs, NICE=0,
#        both supervisors (ctest bench.supervise_smoke)
# Exits non-zero when a figure is missing.
# The machine is shared with other jobs (builds, test suites): to measure the supervisors
# and not the neighbours, both supervisors run at the same raised priority (NICE, needs
# root; NICE=0 turns it off) and everything they and the probes write goes to tmpfs (BENCH_TMP),
# so that other jobs' disk traffic does not stall a probe's or a supervisor's write.
# Installs the Debian package `supervisor` when supervisord is missing. Bounded: every
# wait has a deadline and the whole run stops after 15 minutes; everything it started
# is stopped on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
if bench_smoke; then
    : "${N:=10}" "${CPU_S:=1}" "${SETTLE_S:=1}" "${CRASH_SAMPLES:=2}" "${HANG_SAMPLES:=2}"
    : "${NICE:=0}"
fi
BUILD_DIR=${BUILD_DIR:-$HERE/../build}
N=${N:-1000}
CPU_S=${CPU_S:-30}
SETTLE_S=${SETTLE_S:-5}
CRASH_SAMPLES=${CRASH_SAMPLES:-25}
HANG_SAMPLES=${HANG_SAMPLES:-100}
HANG_DEADLINE_MS=${HANG_DEADLINE_MS:-200}
NICE=${NICE:--10}
BENCH_TMP=${BENCH_TMP:-/dev/shm}
CRASH_SPACING_S=1.2 # > supervisord's 1 s loop tick, so it sees every process RUNNING first
RUN_LIMIT_S=900

BIN=$(cd "$BUILD_DIR/bin" 2>/dev/null && pwd) || { echo "no $BUILD_DIR/bin: build first" >&2; exit 1; }
for b in bigbrother bbctl; do
    [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: build first" >&2; exit 1; }
done
[ -d "$BENCH_TMP" ] || BENCH_TMP=/tmp
WORK=$(mktemp -d "$BENCH_TMP/supbench.XXXXXX")
PROBE=$BIN/supervise_probe
if [ ! -x "$PROBE" ]; then
    PROBE=$WORK/supervise_probe
    cc -O2 -o "$PROBE" "$HERE/supervise_probe.c"
fi
if ! command -v supervisord >/dev/null; then
    echo "installing the Debian package supervisor (the anchor)..."
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q supervisor >/dev/null
fi
command -v supervisorctl >/dev/null || { echo "supervisord is not installed" >&2; exit 1; }
# supervisord gets its own config below; the Debian service is not used (keep it off).
HZ=$(getconf CLK_TCK)
START=$SECONDS
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true # pidfds, pipes and log files of N processes

BB_PIDS=()
SV_PID=

# Stops a bigbrother: its instances first (SIGTERM to bigbrother leaves them running for
# re-adoption), then bigbrother itself.
stop_bigbrother() { # state_dir pid
    "$BIN/bbctl" --socket "$1/control.sock" stop all >/dev/null 2>&1 || true
    kill -TERM "$2" 2>/dev/null || true
    wait "$2" 2>/dev/null || true
}

cleanup() {
    set +e
    for p in "${BB_PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    [ -n "$SV_PID" ] && kill -TERM "$SV_PID" 2>/dev/null && wait "$SV_PID" 2>/dev/null
    # Every probe still alive (each logged its pid) is ours: kill it.
    for pid in $(cat "$WORK"/*.log 2>/dev/null | awk '$1=="start"{print $2}' | sort -u); do
        if grep -q supervise_probe "/proc/$pid/cmdline" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    wait 2>/dev/null
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

over_time() { [ $((SECONDS - START)) -ge $RUN_LIMIT_S ]; }

# Waits until FILE holds at least COUNT lines starting with WORD (timeout in seconds).
wait_lines() { # file word count timeout_s
    local deadline=$((SECONDS + $4))
    while :; do
        local n=0
        [ -f "$1" ] && n=$(awk -v w="$2" '$1==w' "$1" | wc -l)
        [ "$n" -ge "$3" ] && return 0
        if [ $SECONDS -ge $deadline ] || over_time; then
            echo "timed out waiting for $3 '$2' lines in $1 (have $n)" >&2
            return 1
        fi
        sleep 0.05
    done
}

cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }

# Prints "cpu_percent rss_mib" of pid over CPU_S seconds.
measure_idle() { # pid
    local t0 t1
    sleep "$SETTLE_S" # let the start-up settle
    t0=$(cpu_ticks "$1")
    sleep "$CPU_S"
    t1=$(cpu_ticks "$1")
    awk -v d=$((t1 - t0)) -v hz="$HZ" -v s="$CPU_S" -v rss="$(rss_kb "$1")" \
        'BEGIN{printf "%.3f %.1f\n", d / hz / s * 100, rss / 1024}'
}

# Kills the newest process logged in FILE with -9, CRASH_SAMPLES times, each time waiting
# for its replacement, then prints "median_ms p90_ms n" of kill -> replacement start.
crash_samples() { # file
    local i pid newest
    for ((i = 0; i < CRASH_SAMPLES; i++)); do
        over_time && break
        pid=$(awk '$1=="start"{p=$2} END{print p}' "$1")
        "$PROBE" kill "$pid" "$1"
        local deadline=$((SECONDS + 5))
        while :; do
            newest=$(awk '$1=="start"{p=$2} END{print p}' "$1")
            [ "$newest" != "$pid" ] && break
            [ $SECONDS -ge $deadline ] && { echo "no replacement after kill of $pid" >&2; return 1; }
            sleep 0.005
        done
        sleep "$CRASH_SPACING_S"
    done
    # For each kill, the first start after it (lines may be out of order across processes).
    awk '$1=="kill"{k[++nk]=$3} $1=="start"{s[++ns]=$3}
         END{for(i=1;i<=nk;i++){b=-1; for(j=1;j<=ns;j++) if(s[j]>k[i] && (b<0||s[j]<b)) b=s[j];
             if(b>0) printf "%.3f\n", (b-k[i])/1e6}}' "$1" | sort -n | stats
}

# stdin: sorted numbers; prints "median p90 p99 max n".
stats() {
    awk '{v[++n]=$1} END{if(!n){print "nan nan nan nan 0"; exit}
         m=int((n+1)/2); p9=int(n*0.9+0.999); p99=int(n*0.99+0.999);
         printf "%s %s %s %s %d\n", v[m], v[p9], v[p99], v[n], n}'
}

bb_config() { # state_dir services_json
    cat <<EOF
{ "machine": "bench", "cluster": "bench", "state_dir": "$1", "log_max_bytes": 65536,
  "services": $2 }
EOF
}

NOBACKOFF='"restart": {"policy": "always", "backoff_min_ms": 0, "backoff_max_ms": 0, "max_restarts": 64, "window_s": 1}'

echo "supervision benchmark: N=$N idle processes, CPU over ${CPU_S}s, $CRASH_SAMPLES kills, $HANG_SAMPLES hangs"
echo "machine: $(nproc) cores, shared with other jobs (figures are noisy); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "both supervisors at nice $NICE, work dir $WORK"

# ---- bigbrother: N idle + 1 crash target -------------------------------------------
BBDIR=$WORK/bb
mkdir -p "$BBDIR"
bb_config "$BBDIR" "[
  {\"name\": \"idle\", \"command\": \"$PROBE\", \"args\": [\"run\", \"$WORK/bb-idle.log\"],
   \"count\": $N, \"health\": {\"type\": \"none\"}, $NOBACKOFF},
  {\"name\": \"crashy\", \"command\": \"$PROBE\", \"args\": [\"run\", \"$WORK/bb-crash.log\"],
   \"count\": 1, \"health\": {\"type\": \"none\"}, $NOBACKOFF}]" >"$WORK/bb.json"
nice -n "$NICE" "$BIN/bigbrother" --config "$WORK/bb.json" --log-level warn >"$WORK/bigbrother.out" 2>&1 &
BB=$!
BB_PIDS+=("$BB")
wait_lines "$WORK/bb-idle.log" start "$N" 120
wait_lines "$WORK/bb-crash.log" start 1 10
read -r BB_CPU BB_RSS < <(measure_idle "$BB")
echo "bigbrother   idle: cpu=${BB_CPU}% rss=${BB_RSS}MiB"
read -r BB_CRASH_MED BB_CRASH_P90 _ _ BB_CRASH_N < <(crash_samples "$WORK/bb-crash.log")
echo "bigbrother   crash->running: median=${BB_CRASH_MED}ms p90=${BB_CRASH_P90}ms n=$BB_CRASH_N"
stop_bigbrother "$BBDIR" "$BB"

# ---- bigbrother: hang detection -------------------------------------------------------
HGDIR=$WORK/hang
mkdir -p "$HGDIR"
bb_config "$HGDIR" "[
  {\"name\": \"hangy\", \"command\": \"$PROBE\",
   \"args\": [\"notify\", \"$WORK/bb-hang.log\", \"10\", \"100\", \"300\"], \"count\": 1,
   \"health\": {\"type\": \"notify\", \"start_timeout_ms\": 2000, \"liveness_timeout_ms\": $HANG_DEADLINE_MS},
   \"stop\": {\"hang_signal\": \"KILL\", \"grace_ms\": 100}, $NOBACKOFF}]" >"$WORK/hang.json"
nice -n "$NICE" "$BIN/bigbrother" --config "$WORK/hang.json" --log-level warn >"$WORK/bigbrother-hang.out" 2>&1 &
HB=$!
BB_PIDS+=("$HB")
wait_lines "$WORK/bb-hang.log" hang $((HANG_SAMPLES + 1)) $((HANG_SAMPLES * 2 + 20))
stop_bigbrother "$HGDIR" "$HB"
# For each hang, the first start after it, minus the deadline.
read -r HANG_MED _ HANG_P99 HANG_MAX HANG_N < <(
    awk -v dl="$HANG_DEADLINE_MS" '$1=="hang"{h[++nh]=$3} $1=="start"{s[++ns]=$3}
        END{for(i=1;i<=nh;i++){b=-1; for(j=1;j<=ns;j++) if(s[j]>h[i] && (b<0||s[j]<b)) b=s[j];
            if(b>0) printf "%.3f\n", (b-h[i])/1e6 - dl}}' "$WORK/bb-hang.log" | sort -n | stats)
echo "bigbrother   hang->running after the ${HANG_DEADLINE_MS}ms deadline: median=${HANG_MED}ms p99=${HANG_P99}ms max=${HANG_MAX}ms n=$HANG_N"

# ---- supervisord: the same N idle + 1 crash target -------------------------------------
cat >"$WORK/supervisord.conf" <<EOF
[unix_http_server]
file=$WORK/supervisor.sock
[supervisord]
nodaemon=true
logfile=$WORK/supervisord.log
pidfile=$WORK/supervisord.pid
childlogdir=$WORK
loglevel=warn
minfds=8192
minprocs=4096
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://$WORK/supervisor.sock
[program:idle]
command=$PROBE run $WORK/sv-idle.log
process_name=%(program_name)s_%(process_num)04d
numprocs=$N
autorestart=true
startsecs=0
startretries=1000
stdout_logfile=NONE
stderr_logfile=NONE
[program:crashy]
command=$PROBE run $WORK/sv-crash.log
autorestart=true
startsecs=0
startretries=1000
stdout_logfile=NONE
stderr_logfile=NONE
EOF
nice -n "$NICE" supervisord -c "$WORK/supervisord.conf" >"$WORK/supervisord.out" 2>&1 &
SV_PID=$!
wait_lines "$WORK/sv-idle.log" start "$N" 300
wait_lines "$WORK/sv-crash.log" start 1 30
read -r SV_CPU SV_RSS < <(measure_idle "$SV_PID")
echo "supervisord  idle: cpu=${SV_CPU}% rss=${SV_RSS}MiB"
read -r SV_CRASH_MED SV_CRASH_P90 _ _ SV_CRASH_N < <(crash_samples "$WORK/sv-crash.log")
echo "supervisord  crash->running: median=${SV_CRASH_MED}ms p90=${SV_CRASH_P90}ms n=$SV_CRASH_N"
kill -TERM "$SV_PID"
wait "$SV_PID" 2>/dev/null || true
SV_PID=

# ---- summary -------------------------------------------------------------------------------
bench_check_figures "bigbrother idle CPU=$BB_CPU" "supervisord idle CPU=$SV_CPU" \
    "bigbrother RSS=$BB_RSS" "supervisord RSS=$SV_RSS" "bigbrother crash median=$BB_CRASH_MED" \
    "supervisord crash median=$SV_CRASH_MED" "bigbrother crash p90=$BB_CRASH_P90" \
    "supervisord crash p90=$SV_CRASH_P90" "hang p99=$HANG_P99"
bench_check_positive "bigbrother kills=$BB_CRASH_N" "supervisord kills=$SV_CRASH_N" "hangs=$HANG_N"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(b>0) printf "%.1fx", a/b; else print "inf"}'; }
verdict() { awk -v v="$1" -v lim="$2" 'BEGIN{print (v < lim) ? "ok" : "MISSED"}'; }
echo
printf '%-34s %12s %12s %16s\n' "figure" "bigbrother" "supervisord" "supervisord/bb"
printf '%-34s %12s %12s %16s\n' "idle CPU, % of one core (N=$N)" "$BB_CPU" "$SV_CPU" "$(ratio "$SV_CPU" "$BB_CPU")"
printf '%-34s %12s %12s %16s\n' "RSS, MiB (N=$N)" "$BB_RSS" "$SV_RSS" "$(ratio "$SV_RSS" "$BB_RSS")"
printf '%-34s %12s %12s %16s\n' "crash->running median, ms" "$BB_CRASH_MED" "$SV_CRASH_MED" "$(ratio "$SV_CRASH_MED" "$BB_CRASH_MED")"
printf '%-34s %12s %12s %16s\n' "crash->running p90, ms" "$BB_CRASH_P90" "$SV_CRASH_P90" "$(ratio "$SV_CRASH_P90" "$BB_CRASH_P90")"
printf '%-34s %12s %12s %16s\n' "hang->running past deadline p99, ms" "$HANG_P99" "n/a" "-"
echo
echo "targets: crash median < 10 ms: $(verdict "$BB_CRASH_MED" 10);" \
    "hang p99 < deadline + 50 ms: $(verdict "$HANG_P99" 50);" \
    "idle CPU < 1%: $(verdict "$BB_CPU" 1); RSS < 32 MiB: $(verdict "$BB_RSS" 32)"
echo "run time: $((SECONDS - START)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
