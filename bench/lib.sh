# Shared by the bench scripts (sourced): free ports, one work dir with its processes,
# a Redis without persistence, medians. A script sets WORK=$(mktemp -d ...) and PIDS=()
# and calls bench_trap_cleanup; every process it starts in the background goes into PIDS.

# A TCP port on 127.0.0.1 that nothing listens on, below the ephemeral range (32768+)
# so outgoing connections do not take it meanwhile.
bench_free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 12000))
        if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "no free port" >&2
    exit 1
}

# Kills every process in PIDS, waits for them and removes WORK (kept with KEEP=1).
bench_cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}

# Runs bench_cleanup at exit, also after Ctrl-C or TERM (exit status 130).
bench_trap_cleanup() {
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

# Starts redis-server on 127.0.0.1:PORT with no persistence, its files in DIR, adds it to
# PIDS and waits until it answers PONG (a loading Redis answers PING with an error).
bench_start_redis() { # port dir [extra redis-server args...]
    local port=$1 dir=$2
    shift 2
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" "$@" \
        >"$dir/redis-$port.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 200); do
        [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && return
        sleep 0.05
    done
    echo "redis-server on port $port did not start (see $dir/redis-$port.log)" >&2
    exit 1
}

# Waits until URL answers 2xx: at most 30 s (a busy machine), and no longer once the
# process PID has exited (its port taken, its Redis refused it). On failure: what did not
# start, the last lines of LOG, and exit 1.
bench_wait_http() { # url pid log what
    local url=$1 pid=$2 log=$3 what=$4 start=$SECONDS
    until curl -fs -m 2 "$url" >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null || ((SECONDS - start >= 30)); then
            echo "$what did not start (see $log); its last lines:" >&2
            tail -n 15 "$log" >&2
            exit 1
        fi
        sleep 0.05
    done
}

# The median of the numbers given as arguments, or of the lines on stdin without any.
bench_median() {
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cat; fi |
        grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# a / b with two decimals, or n/a when b is 0.
bench_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# Smoke mode: with SMOKE=1 every benchmark runs for a second or two per side, at tiny
# sizes and one round, still measuring both serverdir and its anchor and printing every
# figure (ctest runs each so: the tests labelled bench). A script sets its smoke defaults
# with `: "${VAR:=value}"` under `[ "${SMOKE:-0}" = 1 ]`, before its own defaults, so a
# knob given by the caller still wins. The figures mean little at these sizes: the point
# is that the script still runs end to end against the code of the day.
bench_smoke() { [ "${SMOKE:-0}" = 1 ]; }

# Fails the run (exit 1) unless every NAME=VALUE given holds a number: a figure the run
# could not produce (empty, n/a, nan, -) is an error, not a blank in the table.
bench_check_figures() { # NAME=VALUE...
    local kv bad=()
    for kv in "$@"; do
        [[ ${kv#*=} =~ ^-?[0-9]+(\.[0-9]+)?$ ]] || bad+=("${kv%%=*}='${kv#*=}'")
    done
    [ ${#bad[@]} -eq 0 ] && return 0
    echo "missing figures: ${bad[*]}" >&2
    exit 1
}

# The same for figures that must be above 0 (rates, counts of what was measured).
bench_check_positive() { # NAME=VALUE...
    bench_check_figures "$@"
    local kv bad=()
    for kv in "$@"; do
        awk -v v="${kv#*=}" 'BEGIN { exit !(v + 0 > 0) }' || bad+=("${kv%%=*}=${kv#*=}")
    done
    [ ${#bad[@]} -eq 0 ] && return 0
    echo "figures that should be above 0: ${bad[*]}" >&2
    exit 1
}

# The events_apply.lua batch of one wrk request of bench/events_post.lua (BATCH/2
# instances started then stopped), normalized the way serverdir passes it: the anchor
# of the event benchmarks. Every event id and instance name ends in the placeholder @N@,
# which the anchor script replaces with a per-call nonce. Needs BATCH.
bench_events_anchor_batch() {
    awk -v b="$BATCH" 'BEGIN {
        printf "[";
        for (k = 1; k <= b / 2; k++) {
            if (k > 1) printf ",";
            printf "[\"id\",\"a%d-s@N@\",\"type\",\"started\",\"instance\",\"a%d@N@\",\"machine\",\"m%012d\",\"service\",\"zone\",\"pid\",\"%d\",\"ports\",\"{\\\"game\\\":%d}\"],", k, k, k, 1000 + k, 27000 + k;
            printf "[\"id\",\"a%d-x@N@\",\"type\",\"stopped\",\"instance\",\"a%d@N@\",\"machine\",\"m%012d\",\"service\",\"zone\",\"reason\",\"exited\",\"code\",\"0\"]", k, k, k;
        }
        printf "]" }'
}

# The ARGV before the batch that serverdir passes events_apply.lua (directory.c,
# sd_dir_events_apply_many): event id ttl ms, history max length, stopped records kept,
# stopped record ttl ms, the assignments channel, the cluster's name, live processes per
# machine at most and above its capacity, the machine the batch's token is bound to ('':
# none; the batch has no status events, for which a bound batch reads more); the key base
# is BENCH_EV_KEY. The batch follows as ARGV[10].
BENCH_EV_KEY='sd:{benchraw}:'
BENCH_EV_ARGV=(86400000 10000 10000 86400000 sd:assign benchraw 10000000 100 '')

# Writes the anchor script of the event benchmarks to OUT: the build's events_apply.lua
# (the script as serverdir runs it, with its prelude) unchanged, after a two-line preamble
# that takes a nonce from one extra, last ARGV and puts it in place of every @N@ of the
# batch (ARGV[10]). redis-benchmark redraws the nonce (-__rand_int__) per call, so every call
# applies new events, as serverdir's calls do; the preamble's gsub over the batch is all
# the anchor does that serverdir's call does not. Nothing inside the script is patched:
# the anchor only relies on the script's ARGV contract (8 values, then per batch the bound
# machine and the batch), which bench_events_anchor_check verifies.
bench_events_anchor_script() { # lua_dir out
    {
        echo "-- bench anchor preamble (bench/lib.sh): the last ARGV is a per-call nonce for @N@"
        echo "local bench_nonce = table.remove(ARGV); ARGV[10] = string.gsub(ARGV[10], '@N@', bench_nonce)"
        cat "$1/events_apply.lua"
    } >"$2"
}

# Runs the anchor script (loaded as SHA on the Redis at PORT) twice with the batch, under
# two nonces, and fails loudly unless each call accepted all BATCH events as new ones
# (no duplicates, nothing stale): the anchor must do the work serverdir's call does. Needs
# BATCH and BATCH_JSON.
bench_events_anchor_check() { # port sha
    local n reply
    for n in -check1 -check2; do
        reply=$(redis-cli -p "$1" EVALSHA "$2" 1 "$BENCH_EV_KEY" "${BENCH_EV_ARGV[@]}" "$BATCH_JSON" "$n" |
            head -n 3 | tr '\n' ' ')
        if [ "$reply" != "$BATCH 0 0 " ]; then
            echo "the events anchor (events_apply.lua with the nonce preamble) did not apply a" \
                 "batch of $BATCH new events (accepted duplicates stale: $reply): has the" \
                 "script's ARGV contract changed? (bench/lib.sh, bench_events_anchor_script)" >&2
            exit 1
        fi
    done
}
