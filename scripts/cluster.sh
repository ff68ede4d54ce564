#!/usr/bin/env bash
# Runs a local ServerDir cluster in the foreground: a private redis-server and serverdir
# (state under .cluster/), and prints the URL. Ctrl-C stops everything it started.
# Ports: SD_PORT (default 7700), SD_REDIS_PORT (default 7379).
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
sd_install_deps
sd_build build

port=${SD_PORT:-7700}
rport=${SD_REDIS_PORT:-7379}
state="$SD_ROOT/.cluster"
mkdir -p "$state/redis"
pids=()
stop_all() {
    trap - INT TERM EXIT
    echo
    echo "stopping local cluster"
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap stop_all INT TERM EXIT

redis-server --port "$rport" --bind 127.0.0.1 --dir "$state/redis" --appendonly yes \
    --save "" --daemonize no >"$state/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done

"$SD_ROOT/build/bin/serverdir" --listen "127.0.0.1:$port" --redis "redis://127.0.0.1:$rport/0" \
    >"$state/serverdir.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.05; done
curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { echo "serverdir is not ready: see $state/serverdir.log"; exit 1; }

cat <<MSG

ServerDir local cluster is up.
  dashboard and API:  http://127.0.0.1:$port/
  health:             http://127.0.0.1:$port/readyz
  sdctl:              SERVERDIR_URL=http://127.0.0.1:$port $SD_ROOT/build/bin/sdctl ps
  logs:               $state/*.log
Press Ctrl-C to stop.
MSG
wait -n "${pids[@]}" || true
echo "a cluster process exited; see the logs in $state"
