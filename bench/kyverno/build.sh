#!/usr/bin/env bash
# Build Kyverno's admission controller at a pinned version for bench/bench_kyverno.py,
# once per version, and print the binary's path on stdout (its CRDs beside it, in crds/).
# Build output goes to stderr.
#
#   kyverno: github.com/kyverno/kyverno's cmd/kyverno at KYVERNO_VERSION below. Its go.mod
#     has a `replace`, which `go install pkg@version` refuses, so the module is downloaded
#     from the Go module proxy (`go mod download`), copied somewhere writable and built
#     there as the main module, into its own cache folder keyed by that version, beside
#     the e2e binaries and OPA (bench/opa/build.sh: same cache root, same
#     lock-then-temp-dir-then-mv). Only `make bench` calls this; `make test` never does.
#
#   RUNGUARD_E2E_CACHE   cache root (default ~/.cache/runguard/e2e)
set -euo pipefail

KYVERNO_VERSION=v1.19.1

cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
dir="$cache/kyverno-$KYVERNO_VERSION"

built() { [[ -x "$dir/bin/kyverno" && -d "$dir/bin/crds" ]]; }

if ! built; then
    mkdir -p "$dir"
    # One build at a time per version: a second caller waits, then finds the binary.
    exec 8>"$dir/.lock"
    flock 8
    if ! built; then
        tmp="$(mktemp -d "$dir/bin.tmp.XXXXXX")"
        trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
        started=$SECONDS
        echo "building kyverno $KYVERNO_VERSION into $dir/bin (a cold build takes many" \
            "minutes of CPU)" >&2
        src="$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json \
            "github.com/kyverno/kyverno@$KYVERNO_VERSION" \
            | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
        [[ -n $src && -f $src/go.mod ]] || { echo "build.sh: no module dir for kyverno" >&2; exit 1; }
        # The module cache is read-only; the build writes nothing into the copy but go
        # wants a writable main module.
        cp -r "$src" "$tmp/src"
        chmod -R u+w "$tmp/src"
        pkg=github.com/kyverno/kyverno/pkg/version
        (cd "$tmp/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
            -ldflags="-s -w -X $pkg.BuildVersion=$KYVERNO_VERSION" \
            -o "$tmp/out/kyverno" ./cmd/kyverno >&2)
        # Its CRDs (ClusterPolicy and the others it watches), for bench_kyverno.py to install.
        cp -r "$tmp/src/config/crds" "$tmp/out/crds"
        chmod 755 "$tmp/out"
        rm -rf "$dir/bin"
        mv "$tmp/out" "$dir/bin"
        echo "kyverno built in $((SECONDS - started))s" >&2
    fi
    exec 8>&-
fi

echo "$dir/bin/kyverno"
