#!/usr/bin/env bash
# The whole test suite: installs what is missing, then
#   1. builds with warnings as errors and runs every unit and integration test (CTest),
#      the integration tests on standalone Redis, and most of them again on a Redis
#      Cluster (it.rc.*) and through a Redis Sentinel (it.rs.*);
#   2. builds again with ASan+UBSan (build-asan/) and runs the suite again (without the
#      it.rc.* / it.rs.* repeats: it.rcluster, it.locks_cluster and it.sentinel run the
#      Cluster and Sentinel code there; nor the plainonly ones: the dashboard's browser
#      screenshots, the packages, scripts/cluster.sh and the OpenAPI validator); a
#      sanitizer report in any test or in any daemon a test started fails the run;
#   3. runs the integration tests again with the daemons (serverdir, bigbrother) under
#      valgrind memcheck (H_VALGRIND=1; not the novalgrind ones, whose daemons it does not
#      wrap): any error or definite leak fails the run;
#   4. builds the libFuzzer targets (only them) with clang (build-fuzz/) and runs each for
#      SD_FUZZ_SECONDS (default 10) over its seed corpus and kept regressions.
# SD_TEST_STAGES="plain asan" (any subset of plain asan valgrind fuzz) selects stages.
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
sd_install_deps
sd_npm_tools
stages=${SD_TEST_STAGES:-"plain asan valgrind fuzz"}
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
         ctest --output-on-failure -j"$jobs" -LE "rcluster|rsentinel|plainonly")
        ;;
    valgrind)
        echo "== stage valgrind: integration tests with the daemons under valgrind"
        sd_build build -DSD_WERROR=ON
        (cd "$SD_ROOT/build" && H_VALGRIND=1 ctest --output-on-failure -j"$jobs" -L integration -LE novalgrind)
        ;;
    fuzz)
        echo "== stage fuzz: libFuzzer targets, ${SD_FUZZ_SECONDS:-10} s each"
        CC=clang SD_BUILD_TARGETS=fuzz_targets \
            sd_build build-fuzz -DSD_WERROR=ON -DSD_FUZZ=ON -DSD_FUZZ_SECONDS="${SD_FUZZ_SECONDS:-10}"
        (cd "$SD_ROOT/build-fuzz" && ctest --output-on-failure -j"$jobs" -L fuzz)
        ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
    esac
done
