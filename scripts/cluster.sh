#!/usr/bin/env bash
# Runs a local ServerDir cluster in the foreground: a private redis-server, serverdir, and
# one bigbrother (machine "local-1" of cluster "local") supervising 3 gameproc zone
# servers that simulate players (locks + fenced blob saves) and announce themselves to
# the master list. State and logs under .cluster/. Ctrl-C stops everything it started:
# the game processes first (bbctl stop all), then bigbrother, serverdir and redis.
# Access is by token (state dir's tokens file, made on the first run, mode 0600): an ops
# token for sdctl, a viewer token for the dashboard and a bigbrother token bound to machine
# local-1 of cluster local. The zone servers get no token: bigbrother obtains each one's
# instance credential and hands it over, and they lock, save and heartbeat with it as
# themselves only (--credential required; docs/operations.md, "Security").
# SD_REDIS=cluster: a local Redis Cluster (3 primaries, 3 replicas on SD_REDIS_PORT and the
# next 5 ports) instead of one redis-server.
# Ports: SD_PORT (default 7700), SD_REDIS_PORT (default 7379); state dir: SD_CLUSTER_DIR
# (default .cluster in the repository). SD_BIN: run the binaries of that directory and skip
# the package check and the build (it.cluster_script runs this script that way).
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
if [[ -z ${SD_BIN:-} ]]; then
    sd_install_deps "$sd_cluster_packages"
    SD_BUILD_TARGETS="serverdir bigbrother bbctl gameproc sdctl" sd_build build
fi

port=${SD_PORT:-7700}
rport=${SD_REDIS_PORT:-7379}
logs_port=${SD_LOGS_PORT:-$((port + 2))}   # bigbrother's logs port (sdctl logs)
state=${SD_CLUSTER_DIR:-$SD_ROOT/.cluster}
bin=${SD_BIN:-$SD_ROOT/build/bin}
url="http://127.0.0.1:$port"
mkdir -p "$state/redis" "$state/bb"
state=$(cd "$state" && pwd)
ctl_sock="$state/bb/control.sock"
pids=()
bb_pid=""

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
    if [[ -n $bb_pid ]] && kill -0 "$bb_pid" 2>/dev/null; then
        "$bin/bbctl" --socket "$ctl_sock" stop all >/dev/null 2>&1 || true
        # Bounded wait until no instance runs (each gets its stop grace).
        for _ in $(seq 100); do
            "$bin/bbctl" --socket "$ctl_sock" -o json status 2>/dev/null |
                grep -Eq '"state": *"(starting|ready|stopping|backoff)"' || break
            sleep 0.1
        done
    fi
    # bigbrother first (its games are stopped), then serverdir and every redis-server at
    # once; whatever has not exited after 10 s is killed.
    if [[ -n $bb_pid ]]; then
        kill "$bb_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$bb_pid" 2>/dev/null || break; sleep 0.1; done
    fi
    local p left
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

# The tokens, made once and kept with the state (so a second run keeps the same ones).
if [[ ! -s $state/tokens ]]; then
    tok() { head -c 24 /dev/urandom | base64 | tr -d '/+='; }
    (umask 077 && cat >"$state/tokens" <<TOKENS
# made by scripts/cluster.sh: ROLE TOKEN [bindings]
ops        $(tok)
viewer     $(tok)
bigbrother $(tok) cluster=local machine=local-1
TOKENS
    )
fi
token_of() { awk -v r="$1" '$1 == r { print $2; exit }' "$state/tokens"; }
ops_token=$(token_of ops)
viewer_token=$(token_of viewer)
bb_token=$(token_of bigbrother)
# This cluster's environment for a shell (`. .cluster/env`, then `sdctl ps`): sdctl's
# variables with the ops token, the tokens by role, and the binaries on PATH.
(umask 077 && cat >"$state/env") <<ENV
export SERVERDIR_URL=$url SERVERDIR_TOKEN=$ops_token SERVERDIR_CLUSTER=local
export SD=$url OPS_TOKEN=$ops_token VIEWER_TOKEN=$viewer_token BIGBROTHER_TOKEN=$bb_token
export PATH="$bin:\$PATH"
ENV

# A real PONG: while Redis loads its append-only file, PING answers an error (LOADING) and
# redis-cli still exits 0.
wait_pong() {
    for _ in $(seq 600); do [[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] && return 0; sleep 0.05; done
    echo "redis-server on port $1 did not answer PONG: see $2"
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
    for i in 0 1 2 3 4 5; do wait_pong $((rport + i)) "$state/redis-cluster/$i.log" || exit 1; done
    if ! redis-cli -p "$rport" cluster info | grep -q "cluster_known_nodes:6"; then
        redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
            >"$state/redis-cluster/create.log" 2>&1 ||
            { echo "redis-cli --cluster create failed: see $state/redis-cluster/create.log"; exit 1; }
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
    wait_pong "$rport" "$state/redis.log" || exit 1
    redis_url="redis://127.0.0.1:$rport/0"
fi

setsid "$bin/serverdir" --listen "127.0.0.1:$port" --redis "$redis_url" \
    --tokens "$state/tokens" >"$state/serverdir.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fs "$url/healthz" >/dev/null && break; sleep 0.05; done
curl -fs "$url/readyz" >/dev/null || { echo "serverdir is not ready: see $state/serverdir.log"; exit 1; }

# bigbrother's config: 3 zone servers with the agent health check; each simulates 3
# players on keys player:1..12 (holder: its instance id), saves every 2 s, lets a player
# go after 20 s, and heartbeats the REST master list every 10 s, all with its instance
# credential (no shared game token).
(umask 077 && cat >"$state/bigbrother.json") <<JSON
{ "machine": "local-1", "cluster": "local", "address": "127.0.0.1",
  "serverdir": { "urls": ["$url"], "token": "$bb_token" },
  "state_dir": "$state/bb", "logs_listen": "127.0.0.1:$logs_port",
  "services": [
    { "name": "zone", "command": "$bin/gameproc",
      "args": ["--tick-hz", "20", "--udp-port", "0", "--players", "3", "--max-players", "16",
               "--player-keys", "1-12", "--save-every-ms", "2000", "--session-s", "20",
               "--master-rest", "--master-interval-s", "10", "--region", "local",
               "--tags", "demo", "--credential", "required"],
      "env": { "SERVERDIR_URL": "$url" },
      "count": 3,
      "health":  { "type": "agent", "start_timeout_ms": 10000, "liveness_timeout_ms": 3000 },
      "restart": { "policy": "always", "backoff_min_ms": 100, "backoff_max_ms": 10000,
                   "max_restarts": 5, "window_s": 60 },
      "stop":    { "signal": "TERM", "grace_ms": 5000 } } ] }
JSON
setsid "$bin/bigbrother" --config "$state/bigbrother.json" >"$state/bigbrother.log" 2>&1 &
bb_pid=$!
pids+=("$bb_pid")
# The last run's Ctrl-C stopped the zone servers with `bbctl stop all`, and bigbrother
# keeps an operator's stop across its restarts (state_dir/state.json): start them again.
started=""
for _ in $(seq 100); do
    "$bin/bbctl" --socket "$ctl_sock" start all >/dev/null 2>&1 && { started=1; break; }
    sleep 0.05
done
[[ -n $started ]] || { echo "bigbrother did not start: see $state/bigbrother.log"; exit 1; }

# What the dashboard will show, once the zone servers are up (bounded wait).
count() {
    curl -fs -H "Authorization: Bearer $viewer_token" "$url$1" 2>/dev/null |
        grep -o "\"$2\":" | wc -l || true
}
# The player locks the zone servers hold (one page of the lock list: there are 12 keys).
locks() {
    curl -fs -H "Authorization: Bearer $viewer_token" "$url/v1/locks?limit=100" 2>/dev/null |
        grep -o '"key":"player:' | wc -l || true
}
# 3 zone servers ready and listed, each with its players: all 3 x 3 locked, or (players
# whose key another server holds wait and retry) at least one each after 5 s; at most
# 20 s in all. The banner then shows what is really there.
start_wait=$SECONDS
while ((SECONDS - start_wait < 20)); do
    ready=$(count /v1/clusters/local/processes?state=ready instance)
    listed=$(count /v1/master/servers address)
    held=$(locks)
    ((ready >= 3 && listed >= 3 && (held >= 9 || (held >= 3 && SECONDS - start_wait >= 5)))) &&
        break
    sleep 0.1
done

cat <<MSG

ServerDir local cluster is up.
  dashboard:          $url/?cluster=local#token=$viewer_token
  redis:              $redis_url
  machines:           $(count /v1/clusters/local/machines machine) (local-1, supervised by bigbrother)
  processes ready:    $(count /v1/clusters/local/processes?state=ready instance) (zone servers, gameproc)
  player locks held:  $(locks) (holder: the zone server's instance id)
  master servers:     $(count /v1/master/servers address)
  shell:              . $state/env   (then: sdctl ps; sdctl and bbctl on PATH, ops token)
  sdctl:              SERVERDIR_URL=$url SERVERDIR_TOKEN=$ops_token SERVERDIR_CLUSTER=local $bin/sdctl ps
  bbctl:              $bin/bbctl --socket $ctl_sock status
  instance logs:      sdctl logs INSTANCE [-f]  (bigbrother serves them on 127.0.0.1:$logs_port)
  tokens:             $state/tokens (ops, viewer, bigbrother bound to local-1); the zone
                      servers use their instance credentials ($state/bb/credentials/)
  logs:               $state/*.log, $state/bb/
Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a cluster process exited; see the logs in $state"
