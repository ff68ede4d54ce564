#!/usr/bin/env bash
# A longer chaos soak by hand: runs the it.chaos test (tests/chaos.md) for SECONDS of
# faults (default 300) and prints its figures (faults=N violations=0 and one line per
# invariant). Not a benchmark; not part of ctest beyond the short default run.
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
cd "$BUILD_DIR"
SD_CHAOS_SECONDS=$SECONDS_OF_CHAOS ctest -R '^it\.chaos$' -V \
    --timeout $((SECONDS_OF_CHAOS + 300)) |
    grep -E 'chaos:|faults=|desired:|directory:|outbox:|locks:|blobs:|stops:|VIOLATION|Passed|Failed|ERROR|LINE'
