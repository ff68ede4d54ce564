#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds with warnings as errors, and
# runs every unit and integration test through CTest.
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
sd_install_deps
sd_build build -DSD_WERROR=ON
cd "$SD_ROOT/build"
ctest --output-on-failure -j"$(nproc)"
