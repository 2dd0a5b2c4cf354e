#!/usr/bin/env bash
# Build kube-apiserver and etcd for the e2e tests, once per content of go.mod, go.sum,
# cmd/*/main.go and this script, and print the folder holding them. Build output
# goes to stderr.
#
#   RUNGUARD_E2E_CACHE   cache root (default ~/.cache/runguard/e2e)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
key="$(cd "$here" && cat go.mod go.sum cmd/*/main.go build.sh | sha256sum | cut -c1-16)"
bin="$cache/$key/bin"
binaries=(kube-apiserver etcd)

have_all() {
    local name
    for name in "${binaries[@]}"; do
        [[ -x "$bin/$name" ]] || return 1
    done
}

if ! have_all; then
    mkdir -p "$cache/$key"
    # One build at a time per key: a second caller waits, then finds the binaries.
    exec 9>"$cache/$key/.lock"
    flock 9
    if ! have_all; then
        tmp="$(mktemp -d "$cache/$key/bin.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        echo "building kube-apiserver and etcd into $bin (cold build: see docs/e2e.md)" >&2
        # Stamp the version as upstream's hack/lib/version.sh does: unstamped, the
        # apiserver says v0.0.0-master and kubectl (and its dispatcher) cannot parse it.
        version="$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/go.mod")"
        minor="$(cut -d. -f2 <<<"$version")"
        ldflags="-s -w"
        for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
            ldflags+=" -X $pkg.gitTreeState=clean"
        done
        (
            cd "$here"
            CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$tmp/" ./cmd/... >&2
        )
        chmod 755 "$tmp"
        rm -rf "$bin"
        mv "$tmp" "$bin"
        trap - EXIT
    fi
fi

echo "$bin"
