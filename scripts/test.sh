#!/usr/bin/env bash
# The whole test suite: installs what is missing, then
#   1. builds with warnings as errors and runs every unit and integration test (CTest)
#      and every benchmark in smoke mode (bench.*),
#      the integration tests on standalone Redis, and most of them again on a Redis
#      Cluster (it.rc.*) and through a Redis Sentinel (it.rs.*);
#   2. builds again with ASan+UBSan (build-asan/) and runs the suite again (without the
#      it.rc.* / it.rs.* repeats: it.rcluster, it.locks_cluster and it.sentinel run the
#      Cluster and Sentinel code there; nor the plainonly ones: the dashboard's browser
#      screenshots, the packages, scripts/cluster.sh and the OpenAPI validator; nor the
#      benchmarks' smoke runs, label bench); a
#      sanitizer report in any test or in any daemon a test started fails the run;
#   3. runs the integration tests again with the daemons (serverdir, bigbrother) under
#      valgrind memcheck (H_VALGRIND=1; not the novalgrind ones: those whose daemons it does
#      not wrap, and it.chaos, run with ASan's leak checks in stage 2): any error or
#      definite leak fails the run;
#   4. builds the libFuzzer targets (only them) with clang (build-fuzz/) and runs each for
#      SD_FUZZ_SECONDS (default 10) over its seed corpus and kept regressions.
# SD_TEST_STAGES="plain asan" (any subset of plain asan valgrind fuzz) selects stages.
# The ASan tree builds (nice 19) while the plain stage's tests run, the fuzz tree while
# the ASan stage's do (logs: build-asan.bg.log, build-fuzz.bg.log).
set -euo pipefail
SD_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$SD_ROOT/scripts/deps.sh"
sd_install_deps
sd_npm_tools
stages=${SD_TEST_STAGES:-"plain asan valgrind fuzz"}
# Tests at once: an integration test mostly waits (leases running out, processes starting,
# timeouts), so the plain stage and valgrind's run the cores plus one (on 2 cores: plain
# 383 -> 269 s, valgrind 317 -> 235 s; the whole suite 17 min 29 s -> 13 min 59 s, and
# the fuzzers got back their 10 s each with part of it). The ASan stage stays at one per
# core: with 4 at once (2.5x the CPU each, and the fuzz tree building beside them), it.chaos
# saw a bigbrother miss its lease renewals and it.bbctl a log rotation come late. The
# fuzzers are CPU-bound: one per core. SD_TEST_JOBS overrides the plain and valgrind
# stages'.
cores=$(nproc)
jobs=${SD_TEST_JOBS:-$((cores + 1))}
fuzz_args=(-DSD_WERROR=ON -DSD_FUZZ=ON -DSD_FUZZ_SECONDS="${SD_FUZZ_SECONDS:-10}")

# The ASan and fuzz trees are built in the background, at the lowest CPU priority, while
# the stage before them runs its tests (which leave much of the CPU idle: they wait on
# the daemons they start). A stage waits for its tree, then builds it in the foreground:
# nothing is left to do, or the error is shown there.
has_stage() { [[ " $stages " == *" $1 "* ]]; }
asan_bg="" fuzz_bg=""
trap 'kill $asan_bg $fuzz_bg 2>/dev/null || true' EXIT
# Gives PID and every process below it the niceness N (the background build's make and
# compilers inherit the lowest priority; the ones it starts later inherit the new one).
renice_tree() { # PID N
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do renice_tree "$child" "$2"; done
    renice -n "$2" -p "$1" >/dev/null 2>&1 || true
}
# Waits for a background build. It is still running when the stage before it left no CPU
# idle (a busy machine: at the lowest priority beside CPU-bound work it gets about 1% of a
# core and takes hours), so from here on it runs at this script's own priority.
bg_wait() { # PID NAME
    [[ -n $1 ]] || return 0
    renice_tree "$1" "$(nice)"
    wait "$1" || echo "(the background build of $2 failed: building it again here)"
}

for stage in $stages; do
    case $stage in
    plain)
        echo "== stage plain: -Werror build, unit + integration tests"
        sd_build build -DSD_WERROR=ON
        if has_stage asan; then
            (renice -n 19 -p "$BASHPID" >/dev/null
             sd_build build-asan -DSD_WERROR=ON -DSD_SANITIZE=ON >"$SD_ROOT/build-asan.bg.log" 2>&1) &
            asan_bg=$!
        fi
        (cd "$SD_ROOT/build" && ctest --output-on-failure -j"$jobs")
        ;;
    asan)
        echo "== stage asan: ASan+UBSan build, unit + integration tests"
        bg_wait "$asan_bg" build-asan
        asan_bg=""
        sd_build build-asan -DSD_WERROR=ON -DSD_SANITIZE=ON
        if has_stage fuzz; then
            (renice -n 19 -p "$BASHPID" >/dev/null
             export CC=clang SD_BUILD_TARGETS=fuzz_targets
             sd_build build-fuzz "${fuzz_args[@]}" >"$SD_ROOT/build-fuzz.bg.log" 2>&1) &
            fuzz_bg=$!
        fi
        (cd "$SD_ROOT/build-asan" &&
         ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
         ctest --output-on-failure -j"$cores" -LE "rcluster|rsentinel|plainonly|bench")
        ;;
    valgrind)
        echo "== stage valgrind: integration tests with the daemons under valgrind"
        sd_build build -DSD_WERROR=ON
        (cd "$SD_ROOT/build" && H_VALGRIND=1 ctest --output-on-failure -j"$jobs" -L integration -LE novalgrind)
        ;;
    fuzz)
        echo "== stage fuzz: libFuzzer targets, ${SD_FUZZ_SECONDS:-10} s each"
        bg_wait "$fuzz_bg" build-fuzz
        fuzz_bg=""
        CC=clang SD_BUILD_TARGETS=fuzz_targets sd_build build-fuzz "${fuzz_args[@]}"
        (cd "$SD_ROOT/build-fuzz" && ctest --output-on-failure -j"$cores" -L fuzz)
        ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
    esac
done
