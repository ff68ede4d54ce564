#!/usr/bin/env bash
# Runs a local ServerDir cluster in the foreground, the product as it is meant to run: a
# private redis-server, serverdir, and two bigbrothers in cluster mode (machines "local-1"
# and "local-2" of cluster "local", each with its own token bound to its machine, state
# dir, logs port and control socket). One of them is the primary: it places the desired
# services this script applies (`sdctl apply`, the same every run):
#   zone   3 gameproc zone servers that simulate players (locks + fenced blob saves) and
#          announce themselves to the master list (`sdctl scale zone 5`);
#   match  a warm pool of gameproc match servers (buffer 2, min 2); one match is
#          allocated at start (`sdctl allocate match`), and its server logs the allocation.
# State and logs under .cluster/. Ctrl-C stops everything it started: the realm first
# (`sdctl cluster stop`: every bigbrother stops its game processes gracefully), then the
# bigbrothers (the primary releases its lease), any game server a killed bigbrother left
# behind, serverdir and redis. A bigbrother that dies meanwhile (kill -9: a lost machine)
# leaves the rest running. The next run clears the realm flag (`sdctl cluster start`) and
# everything comes back from the stored state.
# Access is by token (state dir's tokens file, made on the first run, mode 0600): an ops
# token for sdctl and the ops dashboard, a viewer token for the dashboard and a bigbrother
# token per machine. The game servers get no token: bigbrother obtains each one's
# instance credential and hands it over, and they lock, save and heartbeat with it as
# themselves only (--credential required; docs/operations.md, "Security").
# SD_REDIS=cluster: a local Redis Cluster (3 primaries, 3 replicas on SD_REDIS_PORT and the
# next 5 ports) instead of one redis-server.
# Ports: SD_PORT (default 7700), SD_REDIS_PORT (default 7379), SD_LOGS_PORT and
# SD_LOGS_PORT2 (the bigbrothers' logs ports, default SD_PORT + 2 and + 3); state dir:
# SD_CLUSTER_DIR (default .cluster in the repository). SD_BIN: run the binaries of that
# directory and skip the package check and the build (it.cluster_script runs this script
# that way).
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
if [[ -z ${SD_BIN:-} ]]; then
    sd_install_deps "$sd_cluster_packages"
    SD_BUILD_TARGETS="serverdir bigbrother bbctl gameproc sdctl" sd_build build
fi

port=${SD_PORT:-7700}
rport=${SD_REDIS_PORT:-7379}
state=${SD_CLUSTER_DIR:-$SD_ROOT/.cluster}
bin=${SD_BIN:-$SD_ROOT/build/bin}
url="http://127.0.0.1:$port"
machines=(local-1 local-2)
declare -A logs_port=([local-1]=${SD_LOGS_PORT:-$((port + 2))}
                      [local-2]=${SD_LOGS_PORT2:-$((port + 3))})
mkdir -p "$state/redis" "$state/local-1" "$state/local-2"
state=$(cd "$state" && pwd)
sock_of() { echo "$state/$1/control.sock"; }
pids=()
bb_pids=()
declare -A bb_of=()

# What an operator types, with the ops token (the realm switch, apply, allocate).
sdctl() { SERVERDIR_URL=$url SERVERDIR_TOKEN=$ops_token SERVERDIR_CLUSTER=local "$bin/sdctl" "$@"; }
# GET of the API with the viewer token ("" when it fails).
api() { curl -fs -H "Authorization: Bearer $viewer_token" "$url$1" 2>/dev/null || true; }
# How many times "KEY": occurs in the answer to GET $1.
count() { api "$1" | grep -o "\"$2\":" | wc -l || true; }
# The live (starting or ready) game processes of both bigbrothers, by their control sockets.
games_running() {
    local m
    for m in "${machines[@]}"; do
        "$bin/bbctl" --socket "$(sock_of "$m")" -o json status 2>/dev/null |
            grep -Eq '"state": *"(starting|ready|stopping|backoff)"' && return 0
    done
    return 1
}

# The game processes of this cluster still running without a realm stop: serverdir was
# gone, or their bigbrother was killed (a lost machine). Found by what they run and the
# serverdir they were given, as no bigbrother may be left to ask. Not `bbctl stop all`:
# a bigbrother keeps an operator's stop of an assigned slot across runs, and the next run
# would not start it.
game_pids() {
    local f pid arg0
    for f in /proc/[0-9]*/cmdline; do
        arg0=""
        read -r -d '' arg0 <"$f" 2>/dev/null || true
        [[ $arg0 == "$bin/gameproc" ]] || continue
        pid=${f#/proc/}
        pid=${pid%/cmdline}
        tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SERVERDIR_URL=$url" &&
            echo "$pid"
    done
    return 0
}

# Every daemon runs in its own session (setsid), so a Ctrl-C reaches this script only and
# the order below holds: the game processes must not outlive their bigbrother.
# Output is best effort here: when stdout is a pipe whose reader died with the same Ctrl-C
# (`cluster.sh | tee log`), a write must not end the script before the processes are stopped.
stop_all() {
    # A second Ctrl-C (or a TERM) while stopping must not leave processes behind: the
    # stop is bounded and runs to its end.
    trap - EXIT
    trap '' INT TERM PIPE
    set +e
    { echo; echo "stopping local cluster"; } 2>/dev/null
    # The realm stop: every bigbrother sends SHUTDOWN to its games, waits their grace
    # and stops them. The flag stays in Redis; the next run clears it.
    if ((${#bb_pids[@]})) && sdctl cluster stop >/dev/null 2>&1; then
        for _ in $(seq 150); do games_running || break; sleep 0.1; done
    fi
    # The bigbrothers first (the primary releases its lease), then any game left (TERM,
    # KILL after 5 s), then serverdir and every redis-server at once; whatever has not
    # exited after 10 s is killed.
    local p left games
    for p in "${bb_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do
        left=""
        for p in "${bb_pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
        [[ -z $left ]] && break
        sleep 0.1
    done
    games=$(game_pids)
    if [[ -n $games ]]; then
        for p in $games; do kill "$p" 2>/dev/null || true; done
        for _ in $(seq 50); do
            left=""
            for p in $games; do kill -0 "$p" 2>/dev/null && left=1; done
            [[ -z $left ]] && break
            sleep 0.1
        done
        for p in $games; do kill -9 "$p" 2>/dev/null || true; done
    fi
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 100); do
        left=""
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
        [[ -z $left ]] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap stop_all EXIT

# The tokens, made once and kept with the state (so a second run keeps the same ones);
# a tokens file of an older run (one machine) gets local-2's line added.
tok() { head -c 24 /dev/urandom | base64 | tr -d '/+='; }
if [[ ! -s $state/tokens ]]; then
    (umask 077 && cat >"$state/tokens" <<TOKENS
# made by scripts/cluster.sh: ROLE TOKEN [bindings]
ops        $(tok)
viewer     $(tok)
TOKENS
    )
fi
for m in "${machines[@]}"; do
    grep -q "machine=$m\$" "$state/tokens" ||
        echo "bigbrother $(tok) cluster=local machine=$m" >>"$state/tokens"
done
token_of() { awk -v r="$1" '$1 == r { print $2; exit }' "$state/tokens"; }
bb_token_of() { awk -v m="machine=$1" '$1 == "bigbrother" && $4 == m { print $2; exit }' "$state/tokens"; }
ops_token=$(token_of ops)
viewer_token=$(token_of viewer)
# This cluster's environment for a shell (`. .cluster/env`, then `sdctl ps`): sdctl's
# variables with the ops token, the tokens by role, each bigbrother's control socket
# (bbctl --socket "$BB_SOCKET_2" status) and the binaries on PATH; bbctl uses local-1's
# socket unless told otherwise.
(umask 077 && cat >"$state/env") <<ENV
export SERVERDIR_URL=$url SERVERDIR_TOKEN=$ops_token SERVERDIR_CLUSTER=local
export SD=$url OPS_TOKEN=$ops_token VIEWER_TOKEN=$viewer_token
export BIGBROTHER_TOKEN=$(bb_token_of local-1) BIGBROTHER_TOKEN_2=$(bb_token_of local-2)
export BB_SOCKET_1=$(sock_of local-1) BB_SOCKET_2=$(sock_of local-2)
export BB_CONTROL_SOCKET=$(sock_of local-1)
export PATH="$bin:\$PATH"
ENV

# A start that failed: what failed, and the last lines of its log (a port another program
# holds, a damaged state file), so that the cause shows where the script was run.
start_failed() {
    echo "$1: see $2"
    [[ -s $2 ]] && { echo "its last lines:"; tail -n 15 "$2" | sed 's/^/  /'; }
    return 0
}

# A real PONG: while Redis loads its append-only file, PING answers an error (LOADING) and
# redis-cli still exits 0.
# $3: its pid, so that one that exited (its port taken) is reported at once.
wait_pong() {
    for _ in $(seq 600); do
        [[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] && return 0
        kill -0 "$3" 2>/dev/null || { start_failed "redis-server on port $1 exited at start" "$2"; return 1; }
        sleep 0.05
    done
    start_failed "redis-server on port $1 did not answer PONG" "$2"
    return 1
}

if [[ ${SD_REDIS:-} == cluster ]]; then
    # A Redis Cluster of 3 primaries and 3 replicas on ports rport..rport+5 (their bus
    # ports 10000 above), created on the first run and re-formed from nodes.conf after.
    nodes=()
    for i in 0 1 2 3 4 5; do
        p=$((rport + i))
        mkdir -p "$state/redis-cluster/$i"
        setsid redis-server --port "$p" --bind 127.0.0.1 --dir "$state/redis-cluster/$i" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
            --appendonly yes --save "" --daemonize no >"$state/redis-cluster/$i.log" 2>&1 &
        pids+=($!)
        nodes+=("127.0.0.1:$p")
    done
    for i in 0 1 2 3 4 5; do
        wait_pong $((rport + i)) "$state/redis-cluster/$i.log" "${pids[i]}" || exit 1
    done
    if ! redis-cli -p "$rport" cluster info | grep -q "cluster_known_nodes:6"; then
        redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
            >"$state/redis-cluster/create.log" 2>&1 ||
            { start_failed "redis-cli --cluster create failed" "$state/redis-cluster/create.log"; exit 1; }
    fi
    for _ in $(seq 400); do
        redis-cli -p "$rport" cluster info | grep -q "cluster_state:ok" && break
        sleep 0.05
    done
    redis-cli -p "$rport" cluster info | grep -q "cluster_state:ok" ||
        { echo "the Redis Cluster is not ok: see $state/redis-cluster/*.log"; exit 1; }
    redis_url="cluster://$(IFS=,; echo "${nodes[*]}")"
else
    setsid redis-server --port "$rport" --bind 127.0.0.1 --dir "$state/redis" --appendonly yes \
        --save "" --daemonize no >"$state/redis.log" 2>&1 &
    pids+=($!)
    wait_pong "$rport" "$state/redis.log" "$!" || exit 1
    redis_url="redis://127.0.0.1:$rport/0"
fi

setsid "$bin/serverdir" --listen "127.0.0.1:$port" --redis "$redis_url" \
    --tokens "$state/tokens" >"$state/serverdir.log" 2>&1 &
pids+=($!)
sd_pid=$!
# Ready (its Redis answers) within 30 s on a busy machine; a serverdir that exited (its port
# taken, Redis refused) is reported at once.
sd_wait=$SECONDS
until curl -fs -m 2 "$url/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$sd_pid" 2>/dev/null; then
        start_failed "serverdir exited at start" "$state/serverdir.log"
        exit 1
    fi
    if ((SECONDS - sd_wait >= 30)); then
        start_failed "serverdir is not ready after 30 s" "$state/serverdir.log"
        exit 1
    fi
    sleep 0.05
done

# One bigbrother per machine, in cluster mode: no services of its own, it runs what the
# primary assigns to it. Short leases, so that a lost machine (kill -9 of a bigbrother)
# is declared lost and its slots moved within seconds (the defaults are 10 s and 15 s).
for m in "${machines[@]}"; do
    (umask 077 && cat >"$state/$m/bigbrother.json") <<JSON
{ "machine": "$m", "cluster": "local", "mode": "cluster", "address": "127.0.0.1",
  "labels": { "host": "$m" }, "capacity": 10,
  "serverdir": { "urls": ["$url"], "token": "$(bb_token_of "$m")" },
  "state_dir": "$state/$m", "logs_listen": "127.0.0.1:${logs_port[$m]}",
  "primary_ttl_ms": 3000, "lease_ttl_ms": 5000 }
JSON
    setsid "$bin/bigbrother" --config "$state/$m/bigbrother.json" \
        >"$state/bigbrother-$m.log" 2>&1 &
    bb_pids+=($!)
    bb_of[$m]=$!
    pids+=($!)
done

# The desired services (the same file every run: a second apply changes nothing, and sets
# zone back to 3 if it was scaled). zone: each server simulates 3 players on keys
# player:1..12 (holder: its instance id), saves every 2 s, lets a player go after 20 s
# and heartbeats the REST master list every 10 s, all with its instance credential.
# match: a warm pool, 2 ready and unallocated at all times; a match server logs the
# allocation it is handed (id and payload).
gp_common='"--tick-hz", "20", "--udp-port", "0", "--region", "local", "--credential", "required"'
health='"health": { "type": "agent", "start_timeout_ms": 10000, "liveness_timeout_ms": 3000 }'
restart='"restart": { "policy": "always", "backoff_min_ms": 100, "backoff_max_ms": 10000,
                        "max_restarts": 5, "window_s": 60 }'
(umask 077 && cat >"$state/services.json") <<JSON
{ "services": {
  "zone": { "command": "$bin/gameproc", "count": 3,
            "args": [$gp_common, "--players", "3", "--max-players", "16",
                     "--player-keys", "1-12", "--save-every-ms", "2000", "--session-s", "20",
                     "--master-rest", "--master-interval-s", "10", "--tags", "demo"],
            "env": { "SERVERDIR_URL": "$url" },
            $health, $restart,
            "stop": { "signal": "TERM", "grace_ms": 5000 } },
  "match": { "command": "$bin/gameproc",
             "args": [$gp_common, "--max-players", "8", "--map", "q3dm17"],
             "env": { "SERVERDIR_URL": "$url" },
             "pool": { "buffer": 2, "min": 2, "max": 20, "scale_down_delay_s": 30 },
             "on_release": "restart",
             $health, $restart,
             "stop": { "signal": "TERM", "grace_ms": 2000 } } } }
JSON
# The last run's Ctrl-C stopped the realm (a flag kept in Redis): start it again.
sdctl cluster start >/dev/null ||
    { start_failed "sdctl cluster start failed" "$state/serverdir.log"; exit 1; }
sdctl apply -f "$state/services.json" >"$state/apply.out" 2>&1 ||
    { echo "sdctl apply failed:"; cat "$state/apply.out"; exit 1; }

# The player locks the zone servers hold (one page of the lock list: there are 12 keys).
locks() { api "/v1/locks?limit=100" | grep -o '"key":"player:' | wc -l || true; }
ready_of() { count "/v1/clusters/local/processes?service=$1&state=ready" instance; }
primary() { api /v1/clusters/local/primary | grep -o '"holder":"[^"]*"' | cut -d'"' -f4; }

# Wait (at most 30 s) for a primary and the 3 zone servers, 2 match servers ready; then
# allocate a match (waiting for a server if none is ready yet) and give the pool the
# moment to refill its buffer.
start_wait=$SECONDS
while ((SECONDS - start_wait < 30)); do
    (($(ready_of zone) >= 3 && $(ready_of match) >= 2)) && break
    sleep 0.1
done
payload='{"match":"demo-1","players":["ann","bob"]}'
alloc_json=$(sdctl -o json allocate match --wait 20s --payload "$payload" 2>&1) ||
    { echo "sdctl allocate match failed: $alloc_json"; exit 1; }
alloc_id=$(grep -o '"allocation": *"[^"]*"' <<<"$alloc_json" | head -1 | cut -d'"' -f4)
alloc_inst=$(grep -o '"instance": *"[^"]*"' <<<"$alloc_json" | head -1 | cut -d'"' -f4)
# Then until the pool is back at 2 free (3 ready), the game confirmed the allocation, the
# zone servers are on the master list and hold their players: all 3 x 3 locked, or
# (players whose key another server holds wait and retry) at least one each after 5 s;
# at most 20 s in all.
start_wait=$SECONDS
while ((SECONDS - start_wait < 20)); do
    held=$(locks)
    # (the master list's count only then: it limits requests per address, 20 a second)
    (($(ready_of match) >= 3 && (held >= 9 || (held >= 3 && SECONDS - start_wait >= 5)))) &&
        (($(count /v1/master/servers address) >= 3)) &&
        api "/v1/clusters/local/allocations/$alloc_id" | grep -q '"state":"active"' && break
    sleep 0.1
done

zone_desired=$(api /v1/clusters/local/services/zone | grep -o '"count":[0-9]*' | head -1 | cut -d: -f2)
match_ready=$(ready_of match)
match_alloc=$(api "/v1/clusters/local/allocations?service=match" |
    grep -Eo '"state":"(pending|active)"' | wc -l || true)
alloc_state=$(api "/v1/clusters/local/allocations/$alloc_id" | grep -o '"state":"[^"]*"' |
    head -1 | cut -d'"' -f4)
cat <<MSG

ServerDir local cluster is up (cluster "local", Redis $redis_url).
  machines:           $(api /v1/clusters/local/machines | grep -o '"state":"live"' | wc -l) live (local-1, local-2: one bigbrother each, in cluster mode; primary $(primary))
  zone:               $(ready_of zone) ready of $zone_desired desired (desired service; sdctl scale zone 5)
  match:              pool of $match_ready ready, $match_alloc allocated, buffer 2 (sdctl allocate match)
  allocation:         $alloc_id ($alloc_state) on $alloc_inst, payload $payload
                      (its log: sdctl logs $alloc_inst | grep allocated)
  player locks held:  $(locks) (holder: the zone server's instance id)
  master servers:     $(count /v1/master/servers address)
  dashboard:          $url/?cluster=local#token=$viewer_token
  ops dashboard:      $url/?cluster=local#token=$ops_token
                      (with the ops token: scale, restart, stop, drain, allocate)
  shell:              . $state/env   (then sdctl and bbctl on PATH, ops token)
  try:                sdctl status; sdctl ps; sdctl scale zone 5; sdctl allocate match
                      sdctl drain local-2; sdctl undrain local-2; sdctl restart zone
                      bbctl status; bbctl --socket \$BB_SOCKET_2 status
  instance logs:      sdctl logs INSTANCE [-f]  (bigbrothers serve them on 127.0.0.1:${logs_port[local-1]}, :${logs_port[local-2]})
  tokens:             $state/tokens (ops, viewer, a bigbrother token per machine); the game
                      servers use their instance credentials
  logs:               $state/*.log, $state/local-1/, $state/local-2/
Press Ctrl-C to stop.
MSG
# Until Ctrl-C, or until redis or serverdir exits. A bigbrother that exits (kill -9: a
# lost machine) leaves the others running: the primary declares its machine lost after
# its lease and places its slots on the other one; the next run brings it back.
while :; do
    wait -n "${pids[@]}" || true
    for m in "${machines[@]}"; do
        p=${bb_of[$m]}
        if [[ -n $p ]] && ! kill -0 "$p" 2>/dev/null; then
            echo "bigbrother of $m exited (see $state/bigbrother-$m.log): $m will be declared lost"
            bb_of[$m]=""
        fi
    done
    core_left=1
    for p in "${pids[@]}"; do
        [[ " ${bb_pids[*]} " == *" $p "* ]] && continue
        kill -0 "$p" 2>/dev/null || core_left=""
    done
    [[ -n $core_left ]] || break
    # Only the processes still running stay on the lists the stop signals: a pid that
    # wait -n reaped may belong to another process by then.
    live=()
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && live+=("$p"); done
    pids=("${live[@]}")
    live=()
    for p in "${bb_pids[@]}"; do kill -0 "$p" 2>/dev/null && live+=("$p"); done
    bb_pids=("${live[@]}")
done
echo "a cluster process exited; see the logs in $state"
