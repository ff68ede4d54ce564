#!/usr/bin/env bash
# A longer chaos soak by hand: runs the it.chaos test program (tests/chaos.md) for SECONDS
# of faults (default 300) and prints its figures (faults=N violations=0 and one line per
# invariant). Not a benchmark; not part of ctest beyond the short default run. The program
# is run directly, not through ctest, so ctest's per-test timeout (300 s) does not cut a
# long soak short: its own watchdog allows SECONDS plus the set-up and the checks.
#
# Usage: bench/chaos.sh [SECONDS]   (env: BUILD_DIR, SD_CHAOS_SEED to replay a seed,
#        H_KEEP_TMP=1 to keep the logs)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
SECONDS_OF_CHAOS=${1:-300}
case $SECONDS_OF_CHAOS in
    ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
cmake --build "$BUILD_DIR" -j2 >/dev/null
SD_CHAOS_SECONDS=$SECONDS_OF_CHAOS "$BUILD_DIR/tests/it_chaos" 2>&1 |
    grep -E 'chaos:|faults=|desired:|directory:|outbox:|locks:|blobs:|stops:|processes:|stale:|agent_flood:|partition:|allocations:|VIOLATION|PASSED|FAILED|ERROR|LINE'
