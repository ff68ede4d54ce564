#!/usr/bin/env bash
# serverdir's UDP master front side by side with dpmaster: the same load
# generator (bench/master_dpmaster.c, DarkPlaces protocol over loopback, many 127.x source
# addresses) drives each, at 1,000, 10,000 and 100,000 listed servers, RUNS times each
# size, every run on a fresh master (serverdir: a flushed Redis and a new process;
# dpmaster: a new process). Prints, per size, the medians of
#   registrations/s (visible in the list), queries/s with 1 and 8 in flight and their
#   p50/p99 latency, the heartbeat -> getinfo latency while 8 queries run, and memory per
#   listed server: all of it (process RSS growth + Redis used_memory growth), then each
#   part against dpmaster's one copy (its RSS growth): serverdir's RSS growth, its index
#   alone (serverdir_master_index_bytes: records, hash table, snapshot vectors; at 10,000
#   servers a copy's fixed costs, thread arenas and the rate tables, weigh on its RSS per
#   server), and Redis's,
# with the ratio serverdir/dpmaster for rates and dpmaster/serverdir for times and memory
# (so >= 1.00 means serverdir is at least as good), and the load average before and after.
#
# What differs between the two sides: dpmaster 2.2 keeps the list in its own memory only,
# in one thread, with no persistence and no copies; serverdir writes every registration
# to Redis (here without persistence: --save "" --appendonly no) in batches, answers from
# its in-memory index with one worker and one query thread per CPU, and its memory figure
# includes Redis's (used_memory), the price of several copies sharing the list.
# serverdir runs with its per-address limits and reply budgets raised (one generator on
# 127.x stands for 100,000 servers), dpmaster with --allow-loopback, -N 0 (no per-address
# limit), -n 200000 and -H 16.
#
# dpmaster is not part of this repository and no Debian package provides it: build it
# from source in a folder outside the repository (DP below):
#   fetch a dpmaster 2.2 source (e.g. https://github.com/kphillisjr/dpmaster, "Dark
#   Places Master server v2.2 (revision 11251)"), then
#   mkdir -p DP && (cd SRC && git archive HEAD) | tar -x -C DP
#   make -C DP/src release
# and point DPMASTER at the binary (DP/src/dpmaster). The dpmaster side runs only when
# DPMASTER is given: without it the run says so and measures the serverdir side alone
# (so does the smoke run of the suite); with DPMASTER set to something that is not an
# executable the run fails rather than leave the anchor out.
#
# Usage: bench/master_dpmaster.sh   (env: RUNS=3, SIZES="1000 10000 100000", MS=3000
#        query time per phase, BUILD_DIR=build, DPMASTER, SMOKE=1: 1 run at 100 servers
#        with 300 ms query phases, ctest bench.master_dpmaster_smoke)
# Exits non-zero when a figure of a side that ran is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    : "${RUNS:=1}" "${SIZES:=100}" "${MS:=300}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
RUNS=${RUNS:-3}
SIZES=${SIZES:-"1000 10000 100000"}
MS=${MS:-3000}
DPMASTER=${DPMASTER:-}
GEN=$BUILD_DIR/bench/bench_master_dpmaster

if [ ! -x "$GEN" ] || [ ! -x "$BUILD_DIR/bin/serverdir" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD_DIR" --target serverdir bench_master_dpmaster -j2 >/dev/null
fi
HAVE_DP=0
if [ -n "$DPMASTER" ]; then
    [ -x "$DPMASTER" ] || { echo "DPMASTER=$DPMASTER is not an executable: build dpmaster as the" \
        "header of $0 says" >&2; exit 1; }
    HAVE_DP=1
fi

WORK=$(mktemp -d /tmp/master_dpmaster.XXXXXX)
PIDS=()
bench_trap_cleanup

RPORT=$(bench_free_port)
bench_start_redis "$RPORT" "$WORK"
cat >"$WORK/sd.json" <<EOF
{"master": {"rate_per_s": 10000000, "udp_reply_bytes_per_s": 1000000000,
            "udp_reply_bytes_total_per_s": 10000000000, "servers_per_address": 1000000,
            "max_servers": 1000000, "heartbeat_interval_s": 3600, "udp_workers": ${UDP_WORKERS:-0}}}
EOF
mkdir -p "$WORK/jail"

# Runs the generator against serverdir (fresh) or dpmaster (fresh); prints its line.
run_serverdir() { # servers base
    redis-cli -p "$RPORT" flushall >/dev/null
    local hport uport pid
    hport=$(bench_free_port)
    uport=$(bench_free_port)
    "$BUILD_DIR/bin/serverdir" --redis "redis://127.0.0.1:$RPORT" --listen "127.0.0.1:$hport" \
        --config "$WORK/sd.json" --master-udp "127.0.0.1:$uport" >>"$WORK/serverdir.log" 2>&1 &
    pid=$!
    bench_wait_http "127.0.0.1:$hport/healthz" "$pid" "$WORK/serverdir.log" serverdir
    local line idx
    line=$("$GEN" --master "127.0.0.1:$uport" --servers "$1" --pid "$pid" --redis-port "$RPORT" \
        --label serverdir --ms "$MS" --base "$2") || line="label=serverdir failed=1"
    # the index alone (its records, hash table and snapshot vectors), as the copy counts it
    idx=$(curl -fs "127.0.0.1:$hport/metrics" | sed -n 's/^serverdir_master_index_bytes \([0-9]*\).*/\1/p')
    echo "$line mem_index_b=$(( ${idx:-0} / $1 ))"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

run_dpmaster() { # servers base
    local uport pid
    uport=$(bench_free_port)
    local jail=()
    [ "$(id -u)" = 0 ] && jail=(-j "$WORK/jail" -u nobody) # as root dpmaster chroots
    "$DPMASTER" --allow-loopback -l 127.0.0.1 -p "$uport" -n 200000 -N 0 -H 16 -v 1 "${jail[@]}" \
        >>"$WORK/dpmaster.log" 2>&1 &
    pid=$!
    sleep 0.3
    local line
    line=$("$GEN" --master "127.0.0.1:$uport" --servers "$1" --pid "$pid" --label dpmaster --ms "$MS" \
        --base "$2") || line="label=dpmaster failed=1"
    # dpmaster's whole process is its list: its index figure is its memory
    echo "$line mem_index_b=$(sed -n 's/.* mem_proc_b=\([0-9]*\).*/\1/p' <<<"$line")"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

field() { # line name
    sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<" $1"
}

echo "master list side by side: serverdir vs dpmaster, sizes $SIZES, $RUNS runs each"
[ $HAVE_DP = 1 ] || echo "dpmaster: not requested (DPMASTER unset): the serverdir side only, the dpmaster" \
    "column stays empty (the header of $0 says how to build dpmaster)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A S D
base=100
for n in $SIZES; do
    for ((r = 1; r <= RUNS; r++)); do
        # each run's servers come from addresses of their own (no leftovers in the
        # kernel's neighbour or socket tables of the run before)
        base=$(((base + 2) % 200 + 20))
        line=$(run_serverdir "$n" "$base")
        echo "  n=$n run $r: $line"
        S[$n,$r]=$line
        if [ $HAVE_DP = 1 ]; then
            line=$(run_dpmaster "$n" "$base")
            echo "  n=$n run $r: $line"
            D[$n,$r]=$line
        fi
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

# median of a field over the runs of size n, side s (S or D)
med() { # side n field
    local side=$1 n=$2 f=$3 r v=()
    for ((r = 1; r <= RUNS; r++)); do
        if [ "$side" = S ]; then v+=("$(field "${S[$n,$r]}" "$f")"); else v+=("$(field "${D[$n,$r]:-}" "$f")"); fi
    done
    bench_median "${v[@]}"
}

# Amplification: what one query draws at each size, and serverdir's bound (docs/master.md,
# "Amplification"; this bench raises the budgets, the defaults are what an attacker meets).
for n in $SIZES; do
    qb=$(field "${S[$n,1]}" query_bytes)
    ab=$(field "${S[$n,1]}" answer_bytes)
    echo "amplification [$n]: a $qb-byte getservers is answered with $ab bytes ($(bench_ratio "$ab" "$qb")x)"
done
echo "amplification bound per serverdir copy at the defaults: 65536 bytes/s to one victim /24 or /64"
echo "  (udp_reply_bytes_per_s, burst 2x) and 16777216 bytes/s to all victims together"
echo "  (udp_reply_bytes_total_per_s, burst 2x), whatever the list size; dpmaster has no such cap"
echo
figs=()
for n in $SIZES; do
    for f in reg_per_s q1_per_s q8_per_s mem_per_server_b; do
        figs+=("serverdir $f [$n]=$(med S "$n" "$f")")
        [ $HAVE_DP = 0 ] || figs+=("dpmaster $f [$n]=$(med D "$n" "$f")")
    done
done
bench_check_positive "${figs[@]}"
figs=()
for n in $SIZES; do
    for f in q1_p99_ms q8_p99_ms hb_p50_ms hb_p99_ms; do
        figs+=("serverdir $f [$n]=$(med S "$n" "$f")")
        [ $HAVE_DP = 0 ] || figs+=("dpmaster $f [$n]=$(med D "$n" "$f")")
    done
done
bench_check_figures "${figs[@]}"
# A master that dropped heartbeats was overdriven by the generator: its figures would be
# the generator's (bench/README.md says how the window was chosen).
for n in $SIZES; do
    for ((r = 1; r <= RUNS; r++)); do
        for side in S D; do
            if [ "$side" = S ]; then line=${S[$n,$r]}; else line=${D[$n,$r]:-}; fi
            [ -n "$line" ] || continue
            re=$(field "$line" hb_retries)
            if [ -n "$re" ] && [ "$re" -gt $((n / 200)) ]; then
                echo "warning: $(field "$line" label) at $n servers, run $r: $re heartbeats sent again" \
                    "(over 0.5%): the generator overdrove it, its registrations/s is a floor"
            fi
        done
    done
done
printf '%-34s %12s %12s %8s\n' "figure (median of $RUNS)" serverdir dpmaster ratio
for n in $SIZES; do
    for spec in "reg_per_s:registrations/s:up" "q1_per_s:queries/s, 1 in flight:up" \
                "q1_p50_ms:  p50 ms:down" "q1_p99_ms:  p99 ms:down" \
                "q8_per_s:queries/s, 8 in flight:up" "q8_p50_ms:  p50 ms:down" \
                "q8_p99_ms:  p99 ms:down" "hb_p50_ms:heartbeat p50 ms (8 queries):down" \
                "hb_p99_ms:heartbeat p99 ms (8 queries):down" \
                "mem_per_server_b:memory/server B (all):down" "mem_proc_b:  process RSS B:down" \
                "mem_index_b:  index B:down" "mem_redis_b:  Redis B:down" \
                "cpu_side_us:CPU us/registration (+Redis):down"; do
        f=${spec%%:*}
        rest=${spec#*:}
        name=${rest%:*}
        dir=${rest##*:}
        sv=$(med S "$n" "$f")
        if [ $HAVE_DP = 1 ]; then
            # each part of serverdir's memory against dpmaster's one copy (its process)
            if [ "$f" = mem_redis_b ]; then dv=$(med D "$n" mem_proc_b); else dv=$(med D "$n" "$f"); fi
            if [ "$dir" = up ]; then ratio=$(bench_ratio "$sv" "$dv"); else ratio=$(bench_ratio "$dv" "$sv"); fi
        else
            dv="-"
            ratio="-"
        fi
        printf '%-34s %12s %12s %8s\n' "$name [$n]" "$sv" "$dv" "$ratio"
    done
done
