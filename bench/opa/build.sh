#!/usr/bin/env bash
# Build OPA (the policy engine behind Gatekeeper) at a pinned version for bench/bench_opa.py,
# once per version, and print the binary's path on stdout. Build output goes to stderr.
#
#   opa: github.com/open-policy-agent/opa at OPA_VERSION below, `go install`ed outside any
#     module into its own cache folder keyed by that version, beside the e2e binaries
#     (tests/e2e/build.sh, build_kwok: same cache root, same lock-then-temp-dir-then-mv).
#
#   RUNGUARD_E2E_CACHE   cache root (default ~/.cache/runguard/e2e)
set -euo pipefail

OPA_VERSION=v1.22.2

cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
dir="$cache/opa-$OPA_VERSION"

if [[ ! -x "$dir/bin/opa" ]]; then
    mkdir -p "$dir"
    # One build at a time per version: a second caller waits, then finds the binary.
    exec 8>"$dir/.lock"
    flock 8
    if [[ ! -x "$dir/bin/opa" ]]; then
        tmp="$(mktemp -d "$dir/bin.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        started=$SECONDS
        echo "building opa $OPA_VERSION into $dir/bin (a cold build takes minutes of CPU)" >&2
        # Outside any module: `go install pkg@version` builds OPA's own go.mod as is.
        (cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags="-s -w" \
            "github.com/open-policy-agent/opa@$OPA_VERSION" >&2)
        chmod 755 "$tmp"
        rm -rf "$dir/bin"
        mv "$tmp" "$dir/bin"
        trap - EXIT
        echo "opa built in $((SECONDS - started))s" >&2
    fi
    exec 8>&-
fi

echo "$dir/bin/opa"
