#!/usr/bin/env bash
# The whole test suite: installs what is missing, then
#   1. builds with warnings as errors and runs every unit and integration test (CTest);
#   2. builds again with ASan+UBSan (build-asan/) and runs the suite again; a sanitizer
#      report in any test or in any daemon a test started fails the run.
# SD_TEST_STAGES="plain" (or "asan") runs one stage only.
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
sd_install_deps
stages=${SD_TEST_STAGES:-"plain asan"}
jobs=$(nproc)

for stage in $stages; do
    case $stage in
    plain)
        echo "== stage plain: -Werror build, unit + integration tests"
        sd_build build -DSD_WERROR=ON
        (cd "$SD_ROOT/build" && ctest --output-on-failure -j"$jobs")
        ;;
    asan)
        echo "== stage asan: ASan+UBSan build, unit + integration tests"
        sd_build build-asan -DSD_WERROR=ON -DSD_SANITIZE=ON
        (cd "$SD_ROOT/build-asan" &&
         ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
         ctest --output-on-failure -j"$jobs")
        ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
    esac
done
