#!/usr/bin/env bash
# Build Kueue's manager from the Go module proxy, once per KUEUE_VERSION, and print its
# path. Build output goes to stderr. Kept out of build.sh on purpose (as build-helm.sh):
# build.sh's cache key is its own content, and a Kueue pin must not rebuild Kubernetes.
# The module's CRDs and webhook manifests stay in the Go module cache, where
# tests/e2e/kueue.py reads them (`go env GOMODCACHE`).
#
#   RUNGUARD_E2E_CACHE   cache root (default ~/.cache/runguard/e2e), shared with build.sh
set -euo pipefail

KUEUE_VERSION=v0.19.2 # run out of cluster by tests/e2e/kueue.py (tests/e2e/test_kueue.py)

cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
dir="$cache/kueue-$KUEUE_VERSION"
if [[ ! -x $dir/bin/kueue ]]; then
    mkdir -p "$dir"
    exec 8>"$dir/.lock"
    flock 8 # one build at a time: a second caller waits, then finds the binary
    if [[ ! -x $dir/bin/kueue ]]; then
        tmp="$(mktemp -d "$dir/bin.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        started=$SECONDS
        echo "building kueue $KUEUE_VERSION into $dir/bin" >&2
        # Outside any module: `go install pkg@version` builds Kueue's own go.mod as is
        # (-mod=mod: its go.sum is read, not vendored).
        (cd "$tmp" && GOBIN="$tmp" GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n 19 go install \
            -trimpath -ldflags="-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >&2)
        chmod 755 "$tmp"
        rm -rf "$dir/bin"
        mv "$tmp" "$dir/bin"
        trap - EXIT
        echo "kueue built in $((SECONDS - started))s" >&2
    fi
    exec 8>&-
fi
echo "$dir/bin/kueue"
