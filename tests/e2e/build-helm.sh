#!/usr/bin/env bash
# Build helm from the Go module proxy, once per HELM_VERSION, and print its path. Build
# output goes to stderr. Kept out of build.sh on purpose: build.sh's cache key is its own
# content, and a helm pin must not rebuild the Kubernetes binaries.
#
#   RUNGUARD_E2E_CACHE   cache root (default ~/.cache/runguard/e2e), shared with build.sh
set -euo pipefail

HELM_VERSION=v3.22.0 # charts/runguard is linted and installed with it (tests/e2e/test_helm.py)

cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
dir="$cache/helm-$HELM_VERSION"
if [[ ! -x $dir/bin/helm ]]; then
    mkdir -p "$dir"
    exec 8>"$dir/.lock"
    flock 8 # one build at a time: a second caller waits, then finds the binary
    if [[ ! -x $dir/bin/helm ]]; then
        tmp="$(mktemp -d "$dir/bin.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        started=$SECONDS
        echo "building helm $HELM_VERSION into $dir/bin" >&2
        # Outside any module: `go install pkg@version` builds helm's own go.mod as is.
        (cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 nice -n 19 go install -trimpath \
            -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
            "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2)
        chmod 755 "$tmp"
        rm -rf "$dir/bin"
        mv "$tmp" "$dir/bin"
        trap - EXIT
        echo "helm built in $((SECONDS - started))s" >&2
    fi
    exec 8>&-
fi
echo "$dir/bin/helm"
