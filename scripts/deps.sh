# Sourced by the run scripts: installs the Debian packages the project needs when any
# is missing (apt-get update, then apt-get install -y), as root or through sudo.
# Extra packages can be passed in SD_EXTRA_PACKAGES. wrk, etcd-server and supervisor are
# what the benchmarks' smoke runs (ctest -L bench) load serverdir with or compare it to;
# jq, xxd and openssl are what the docs' examples run (it.docs_examples).
# zsh runs `sdctl completion zsh` in it.sdctl_help.
sd_packages="cmake make gcc pkg-config libmicrohttpd-dev libjansson-dev libhiredis-dev
libcurl4-openssl-dev libssl-dev libjwt-dev libcmocka-dev libjemalloc-dev redis-server redis-tools curl jq xxd openssl valgrind
clang libclang-rt-dev haproxy systemd binutils chromium qstat nodejs npm wrk etcd-server
supervisor zsh ${SD_EXTRA_PACKAGES:-}"

# What the main command (scripts/cluster.sh) needs: the build and the cluster's own
# programs, not the test tools (valgrind, clang, haproxy, chromium, qstat).
sd_cluster_packages="cmake make gcc pkg-config libmicrohttpd-dev libjansson-dev libhiredis-dev
libcurl4-openssl-dev libssl-dev libjwt-dev libcmocka-dev libjemalloc-dev redis-server redis-tools curl"

# Installs the missing ones of the packages given (default: all of $sd_packages).
sd_install_deps() {
    local missing=() want=${1:-$sd_packages}
    for p in $want; do
        # node and npm may come from another package source (NodeSource's nodejs bundles
        # npm, which conflicts with Debian's npm): having the command is enough
        case $p in
        nodejs) command -v node >/dev/null && continue ;;
        npm) command -v npm >/dev/null && continue ;;
        esac
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configures and builds into $1 (default build/) with extra cmake args after it.
sd_build() {
    local dir=${1:-build}
    shift || true
    cmake -S "$SD_ROOT" -B "$SD_ROOT/$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
    # SD_BUILD_TARGETS: only these (the main command builds the programs it runs)
    cmake --build "$SD_ROOT/$dir" -j"$(nproc)" ${SD_BUILD_TARGETS:+--target $SD_BUILD_TARGETS}
}

# The npm tools the suite runs (it.openapi_validate: the OpenAPI 3 validator of
# @apidevtools/swagger-parser and the @redocly/cli linter), in .npm-tools/ of the
# repository, pinned; installed when missing (in one npm install: a later one would
# prune what it did not name).
sd_npm_tools() {
    local dir="$SD_ROOT/.npm-tools"
    [ -f "$dir/node_modules/@apidevtools/swagger-parser/package.json" ] &&
        [ -f "$dir/node_modules/@redocly/cli/package.json" ] && return 0
    echo "installing npm tools into $dir"
    npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error \
        @apidevtools/swagger-parser@10.1.1 @redocly/cli@2.77.0 >/dev/null
}
