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

# The median of the numbers given as arguments, or of the lines on stdin without any.
bench_median() {
    if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cat; fi |
        grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# a / b with two decimals, or n/a when b is 0.
bench_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# The events_apply.lua batch of one wrk request of bench/events_post.lua (BATCH/2
# instances started then stopped), normalized the way serverdir passes it: the anchor
# of the event benchmarks. Needs BATCH.
bench_events_anchor_batch() {
    awk -v b="$BATCH" 'BEGIN {
        printf "[";
        for (k = 1; k <= b / 2; k++) {
            if (k > 1) printf ",";
            printf "[\"id\",\"a%d-s\",\"type\",\"started\",\"instance\",\"a%d\",\"machine\",\"m%012d\",\"service\",\"zone\",\"pid\",\"%d\",\"ports\",\"{\\\"game\\\":%d}\"],", k, k, k, 1000 + k, 27000 + k;
            printf "[\"id\",\"a%d-x\",\"type\",\"stopped\",\"instance\",\"a%d\",\"machine\",\"m%012d\",\"service\",\"zone\",\"reason\",\"exited\",\"code\",\"0\"]", k, k, k;
        }
        printf "]" }'
}
