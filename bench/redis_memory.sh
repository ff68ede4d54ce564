#!/usr/bin/env bash
# Redis memory per object, for sizing (docs/operations.md "Sizing"): a fresh redis-server
# and serverdir on loopback ports, then, measuring INFO memory's used_memory (less the
# clients' buffers, mem_clients_normal) before and after each step:
#   1. N_PROC processes in the directory (started + ready events, batches of 100), with
#      their history stream entries (2 per process);
#   2. N_LOCK locks held (one PUT /v1/locks/KEY each, curl URL globbing);
#   3. N_MACHINE machine leases;
#   4. N_SERVER master-list servers (challenge + heartbeat each);
#   5. allocations (docs/allocation.md), in a cluster of their own ("pool"): a service
#      "match" with "pool": {"buffer": 0}, N_ALLOC_MACHINE machine leases and N_ALLOC ready
#      instances (started + ready events, 500 instances a POST); used_memory then is this
#      step's anchor. N_ALLOC open allocations (POST .../allocations, 8 at a time through
#      curl --parallel), then the same allocations ended by "released" events the way Big
#      Brother reports them (500 a POST): bytes per open and per ended allocation, both
#      from this anchor. Of the ended figure, the event ids are measured by deleting them
#      at the end (EVAL, one DEL each) and the history stream by MEMORY USAGE before and
#      after the releases (0 once the stream is full: the pool's 2 x N_ALLOC events fill
#      its directory.history_max of 10,000 at N_ALLOC 5000, and each release's entry
#      replaces an older one); the rest is the record and its index entries, kept an hour.
#      MEMORY USAGE of one key of each kind is printed too.
# Anchor: used_memory of the empty Redis (printed; every figure is a delta from the step
# before, step 5's from its own anchor). Prints bytes per object; exits non-zero when a
# figure is missing.
#
# Usage: bench/redis_memory.sh [RUNS]   (env: BUILD_DIR (build), RUNS (3), N_PROC (a
#        multiple of 100), N_LOCK, N_MACHINE, N_SERVER, N_ALLOC, N_ALLOC_MACHINE; SMOKE=1:
#        1 run of 1000 processes, 1000 locks, 100 machines, 100 servers, 500 allocations
#        on 4 machines, ctest bench.redis_memory_smoke)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib.sh"
if bench_smoke; then
    # large enough that each step's growth is well above what Redis frees or loads on its
    # own meanwhile (a script cached on first use, buffers shrunk: tens of KB)
    : "${RUNS:=1}" "${N_PROC:=1000}" "${N_LOCK:=1000}" "${N_MACHINE:=100}" "${N_SERVER:=100}"
    : "${N_ALLOC:=500}" "${N_ALLOC_MACHINE:=4}"
fi
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
RUNS=${1:-${RUNS:-3}}
N_PROC=${N_PROC:-20000}
N_LOCK=${N_LOCK:-20000}
N_MACHINE=${N_MACHINE:-500}
N_SERVER=${N_SERVER:-1000}
N_ALLOC=${N_ALLOC:-5000}
N_ALLOC_MACHINE=${N_ALLOC_MACHINE:-50}

command -v redis-cli >/dev/null || apt-get install -y redis-tools >/dev/null
[ -x "$BUILD_DIR/bin/serverdir" ] || { echo "build serverdir first ($BUILD_DIR)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/redis_memory.XXXXXX)
PIDS=()
bench_trap_cleanup

# used_memory less the clients' buffers (mem_clients_normal): serverdir's connections grow
# their query buffers on a large batch and Redis shrinks them a moment later, which moved
# the small steps' deltas by tens of KB (100 locks came out at -121 B each)
# Settles first: a step that makes the keyspace cross a power of two allocates the main
# dict's (or the expires dict's) next table, and Redis frees the old one when its
# incremental rehash ends, in serverCron (10 times a second) or later commands. Read
# mid-rehash, the old table (32 KB at 4,096 keys) was charged to one step and its free
# to the next: at SMOKE's 100 objects a step, -680 B "per server".
used() {
    sleep 0.3
    redis-cli -p "$RP" info memory | tr -d '\r' |
        awk -F: '$1=="used_memory"{u=$2} $1=="mem_clients_normal"{c=$2} END{print u-c}'
}
musage() { redis-cli -p "$RP" memory usage "$1" samples 0; } # bytes of one key, all of it
# one_run runs in a subshell (its PIDS are its own): stops them and fails the run
die() { echo "$*" >&2; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; exit 1; }

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
        "$base/v1/clusters/c3/machines/m[1-$N_MACHINE]"
    m3=$(used)
    local ch
    for ((i = 0; i < N_SERVER; i++)); do
        ch=$(curl -fs -X POST "$base/v1/master/challenge" | sed -E 's/.*"challenge":"([^"]+)".*/\1/')
        curl -fs -o /dev/null -H 'Content-Type: application/json' \
            -d "{\"challenge\":\"$ch\",\"port\":$((20000 + i)),\"game\":\"Xonotic\",\"map\":\"stormkeep\",\"name\":\"server $i\",\"players\":3,\"max_players\":16,\"region\":\"europe\",\"tags\":[\"ctf\"]}" \
            "$base/v1/master/heartbeat"
    done
    m4=$(used)

    # 5. allocations: a warm pool of N_ALLOC ready instances in cluster "pool"
    local pool=$base/v1/clusters/pool kb='sd:{pool}:' a0 a1 a2 a3 h1 h2 x1 x2 n
    curl -fs -o /dev/null -X PUT -H 'Content-Type: application/json' \
        -d '{"command":"/bin/true","pool":{"buffer":0},"confirm_timeout_ms":600000}' "$pool/services/match"
    curl -fs -o /dev/null -X PUT -H 'Content-Type: application/json' \
        -d '{"address":"10.0.1.5","labels":{"zone":"eu"},"ttl_ms":300000}' \
        "$pool/machines/p[1-$N_ALLOC_MACHINE]"
    awk -v n="$N_ALLOC" -v m="$N_ALLOC_MACHINE" 'BEGIN {
        for (i = 0; i < n; i++) {
            if (i % 500 == 0) { if (i) print "]}"; printf "{\"events\":["; } else printf ",";
            printf "{\"id\":\"ps%d\",\"type\":\"started\",\"instance\":\"match-%05d\",\"machine\":\"p%d\",\"service\":\"match\",\"pid\":%d,\"slot\":%d,\"ports\":{\"game\":%d}},", i, i, i % m + 1, 1000 + i, i, 27000 + i % 30000;
            printf "{\"id\":\"pr%d\",\"type\":\"ready\",\"instance\":\"match-%05d\",\"machine\":\"p%d\",\"service\":\"match\"}", i, i, i % m + 1;
        }
        print "]}" }' >"$WORK/populate.jsonl"
    while IFS= read -r body; do
        curl -fs -H 'Content-Type: application/json' -d "$body" "$pool/events" | grep -q '"stale":0' ||
            die "populating the pool failed"
    done <"$WORK/populate.jsonl"
    pool_state() { curl -fs "$pool/services/match" | sed -n 's/.*"allocated":\([0-9]*\).*"ready_free":\([0-9]*\).*/\2 \1/p'; }
    [ "$(pool_state)" = "$N_ALLOC 0" ] || die "pool not ready: $(pool_state)"
    a0=$(used)
    # N_ALLOC allocations, 8 in flight (one curl, keep-alive connections); the answers
    # (whole JSON bodies, one after another) give each allocation's id, instance, machine
    awk -v n="$N_ALLOC" -v u="$pool/allocations" 'BEGIN {
        for (i = 1; i <= n; i++) {
            printf "url = \"%s\"\nheader = \"Content-Type: application/json\"\n", u;
            printf "data = \"{\\\"service\\\":\\\"match\\\",\\\"payload\\\":{\\\"match\\\":\\\"m%d\\\"}}\"\n", i;
            if (i < n) print "next";
        } }' >"$WORK/alloc.curl"
    # (curl 7.88 draws its parallel progress meter even with -s: stderr to a file)
    curl -s --parallel --parallel-max 8 -K "$WORK/alloc.curl" 2>"$WORK/alloc.err" |
        grep -o '"allocation":"[^"]*"\|"instance":"[^"]*"\|"machine":"[^"]*"' |
        awk -F'"' '{ v[$2] = $4 }
            ("allocation" in v) && ("instance" in v) && ("machine" in v) {
                print v["allocation"], v["instance"], v["machine"]; delete v }' >"$WORK/allocs.txt"
    n=$(wc -l <"$WORK/allocs.txt")
    [ "$n" = "$N_ALLOC" ] && [ "$(pool_state)" = "0 $N_ALLOC" ] ||
        die "$n of $N_ALLOC allocations answered, pool $(pool_state) (KEEP=1 keeps $WORK/alloc.err)"
    a1=$(used)
    h1=$(musage "${kb}events") x1=$(redis-cli -p "$RP" xlen "${kb}events")
    # their releases, as the machines' Big Brothers report them
    awk -v n="$N_ALLOC" '{
            if ((NR - 1) % 500 == 0) printf "{\"events\":["; else printf ",";
            printf "{\"id\":\"rel-%d\",\"type\":\"released\",\"instance\":\"%s\",\"machine\":\"%s\",\"service\":\"match\",\"allocation\":\"%s\"}", NR, $2, $3, $1;
            if (NR % 500 == 0 || NR == n) print "]}";
        }' "$WORK/allocs.txt" >"$WORK/release.jsonl"
    while IFS= read -r body; do
        curl -fs -H 'Content-Type: application/json' -d "$body" "$pool/events" |
            grep -q '"duplicates":0,"stale":0' || die "releases failed"
    done <"$WORK/release.jsonl"
    [ "$(pool_state)" = "$N_ALLOC 0" ] || die "pool not whole after the releases: $(pool_state)"
    a2=$(used)
    h2=$(musage "${kb}events") x2=$(redis-cli -p "$RP" xlen "${kb}events")
    # one key of each kind: an ended record, a released event's id, a history entry
    local srec sid sent
    srec=$(musage "${kb}alloc:$(head -1 "$WORK/allocs.txt" | cut -d' ' -f1)")
    sid=$(musage "${kb}evid:rel-1")
    sent=$((h2 / x2))
    # the event ids' share: delete them (bounded: N_ALLOC keys)
    redis-cli -p "$RP" eval "for i = 1, tonumber(ARGV[1]) do redis.call('DEL', KEYS[1] .. i) end" \
        1 "${kb}evid:rel-" "$N_ALLOC" >/dev/null
    a3=$(used)
    echo "$m0 $(( (m1 - m0) / N_PROC )) $(( (m2 - m1) / N_LOCK )) $(( (m3 - m2) / N_MACHINE )) $(( (m4 - m3) / N_SERVER ))" \
        "$(( (a1 - a0) / N_ALLOC )) $(( (a2 - a0) / N_ALLOC )) $(( (a2 - a3) / N_ALLOC ))" \
        "$(( (h2 - h1) / N_ALLOC )) $(( (a3 - a0 - h2 + h1) / N_ALLOC )) $srec $sid $sent $x1 $x2"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    PIDS=()
    rm -f "$WORK"/*.rdb
}

results=()
for ((r = 1; r <= RUNS; r++)); do
    line=$(one_run)
    read -r -a f <<<"$line"
    echo "run $r: empty=${f[0]} B; per process / lock / machine / server / open allocation /" \
        "ended allocation (B): ${f[*]:1:6}; of the ended: event id / history entry / record (B):" \
        "${f[*]:7:3}; MEMORY USAGE ended record / event id / history entry (B): ${f[*]:10:3};" \
        "history stream ${f[13]} -> ${f[14]} entries"
    results+=("$line")
done
figs=()
for col in $(seq 1 15); do
    med[col]=$(printf '%s\n' "${results[@]}" | awk -v c=$col '{print $c}' | bench_median)
    figs+=("column $col=${med[col]}")
done
bench_check_figures "${figs[@]}"
bench_check_positive "empty Redis=${med[1]}" "per process=${med[2]}" "per lock=${med[3]}" \
    "per machine=${med[4]}" "per server=${med[5]}" "per open allocation=${med[6]}"
echo "median: empty Redis ${med[1]} B (anchor); per process ${med[2]} B (incl. 2 history entries), per lock ${med[3]} B, per machine ${med[4]} B, per master server ${med[5]} B"
echo "median: per open allocation ${med[6]} B; per ended allocation ${med[7]} B: its released event's id" \
    "${med[8]} B (kept directory.event_id_ttl_s), history entry ${med[9]} B (the stream went from" \
    "${med[14]} to ${med[15]} entries; bounded by directory.history_max), the record and its index" \
    "entries ${med[10]} B (kept an hour); MEMORY USAGE of one ended record ${med[11]} B, one event id" \
    "${med[12]} B, the history stream ${med[13]} B per entry"
