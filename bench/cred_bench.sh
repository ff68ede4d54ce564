#!/usr/bin/env bash
# What checking an instance credential costs serverdir per request, in CPU us (goal:
# under 5 us), beside its external anchor: OpenSSL's own P-256 ECDSA verifications per
# second (`openssl speed ecdsap256`), the work of one uncached check. Prints each figure
# and the ratios. bench/README.md, "credentials".
#   BUILD_DIR (default build), SMOKE=1: one short round.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD_DIR=${BUILD_DIR:-$here/../build}
bin="$BUILD_DIR/bench/bench_cred"
[ -x "$bin" ] || { echo "cred_bench: $bin not built" >&2; exit 1; }
if [ "${SMOKE:-0}" = 1 ]; then
    args=(1 2000 50)
    secs=1
else
    args=(3 200000 2000)
    secs=1
fi
echo "loadavg: $(cat /proc/loadavg)"
out=$("$bin" "${args[@]}")
echo "$out"
cached=$(sed -n 's/^cred_cached_us=//p' <<<"$out")
uncached=$(sed -n 's/^cred_uncached_us=//p' <<<"$out")
live=$(sed -n 's/^cred_live_hmget_us=//p' <<<"$out")
[ -n "$cached" ] && [ -n "$uncached" ] && [ -n "$live" ] || { echo "cred_bench: a figure is missing" >&2; exit 1; }

# The anchor: `openssl speed` prints "256 bits ecdsa (nistp256)  sign/s verify/s" rows.
speed=$(openssl speed -seconds "$secs" ecdsap256 2>/dev/null)
vps=$(awk '/ecdsa \(nistp256\)/ {print $NF}' <<<"$speed" | tail -1)
[ -n "$vps" ] || { echo "cred_bench: no figure from openssl speed" >&2; exit 1; }
awk -v c="$cached" -v u="$uncached" -v l="$live" -v v="$vps" 'BEGIN {
    a = 1e6 / v
    printf "openssl speed ecdsap256: %.0f verify/s = %.1f us a verification\n", v, a
    printf "uncached credential check / one openssl verification = %.2f\n", u / a
    printf "cached credential check: %.3f us, %.0fx cheaper than a verification\n", c, a / c
    printf "per request, cached check + liveness HMGET: %.2f us CPU (goal < 5 us)\n", c + l
}'
