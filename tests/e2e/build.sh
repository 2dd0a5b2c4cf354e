#!/usr/bin/env bash
# Build the e2e cluster's binaries, once per content of go.mod, go.sum, cmd/*/main.go
# and this script, and print the folder holding them. Build output goes to stderr.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kubelet: the e2e
#     module (k8s.io/kubernetes and etcd pinned in go.mod), one `go build` per binary so
#     the links (~2 GB each) run one after the other; pause, the real node's sandbox
#     program (cmd/pause, tests/e2e/realnode.py);
#   kwok: sigs.k8s.io/kwok at KWOK_VERSION below, `go install`ed into its own cache
#     folder keyed by that version, then linked into the bin folder.
#
#   RUNGUARD_E2E_CACHE        cache root (default ~/.cache/runguard/e2e)
#   RUNGUARD_E2E_KUBERNETES   another Kubernetes release, e.g. 1.37: the same mains built
#                             with go.kubernetes-<it>.mod and .sum (`go build -modfile`)
#                             instead of go.mod (docs/e2e.md, "Other Kubernetes releases")
set -euo pipefail

KWOK_VERSION=v0.8.0 # simulated nodes; its stage configs are tests/e2e/kwok-stages.yaml

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
modfile=go.mod
if [[ -n ${RUNGUARD_E2E_KUBERNETES:-} ]]; then
    modfile="go.kubernetes-$RUNGUARD_E2E_KUBERNETES.mod"
    [[ -f $here/$modfile ]] || { echo "build.sh: no $here/$modfile" >&2; exit 2; }
fi
key="$(cd "$here" && cat "$modfile" "${modfile%.mod}.sum" cmd/*/*.go build.sh \
    | sha256sum | cut -c1-16)"
kubernetes=(kube-apiserver kube-controller-manager kube-scheduler etcd kubelet pause)
# Another release gets its own kubectl (one minor of skew); 1.33 uses the machine's.
[[ $modfile == go.mod ]] || kubernetes+=(kubectl)
binaries=("${kubernetes[@]}" kwok)
bin="$cache/$key/bin"

have_all() {
    local name
    for name in "${binaries[@]}"; do
        [[ -x "$bin/$name" ]] || return 1
    done
}

# kwok into $cache/kwok-$KWOK_VERSION/bin/kwok (the same version is never built twice).
build_kwok() {
    local dir="$cache/kwok-$KWOK_VERSION"
    [[ -x "$dir/bin/kwok" ]] && return
    mkdir -p "$dir"
    exec 8>"$dir/.lock"
    flock 8
    if [[ ! -x "$dir/bin/kwok" ]]; then
        local tmp started
        tmp="$(mktemp -d "$dir/bin.tmp.XXXXXX")"
        started=$SECONDS
        echo "building kwok $KWOK_VERSION into $dir/bin" >&2
        # Outside any module: `go install pkg@version` builds kwok's own go.mod as is.
        (cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags="-s -w" \
            "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2) || { rm -rf "$tmp"; return 1; }
        chmod 755 "$tmp"
        rm -rf "$dir/bin"
        mv "$tmp" "$dir/bin"
        echo "kwok built in $((SECONDS - started))s" >&2
    fi
    exec 8>&-
}

if ! have_all; then
    mkdir -p "$cache/$key"
    # One build at a time per key: a second caller waits, then finds the binaries.
    exec 9>"$cache/$key/.lock"
    flock 9
    if ! have_all; then
        build_kwok
        tmp="$(mktemp -d "$cache/$key/bin.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        echo "building ${kubernetes[*]} into $bin (cold build: see docs/e2e.md)" >&2
        # Stamp the version as upstream's hack/lib/version.sh does: unstamped, the
        # apiserver says v0.0.0-master and kubectl (and its dispatcher) cannot parse it.
        version="$(awk '$1 == "k8s.io/kubernetes" { print $2 }' "$here/$modfile")"
        minor="$(cut -d. -f2 <<<"$version")"
        ldflags="-s -w"
        for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
            ldflags+=" -X $pkg.gitTreeState=clean"
        done
        flags=(-trimpath "-modfile=$modfile")
        # Later releases' NewKubeletCommand takes a context (cmd/kubelet/main_context.go).
        upstream="$(cd "$here" && go list "-modfile=$modfile" -f '{{.Dir}}' k8s.io/kubernetes/cmd/kubelet)"
        if grep -q 'NewKubeletCommand(context' "$upstream/kubelet.go"; then
            flags+=(-tags=kubelet_context)
        fi
        for name in "${kubernetes[@]}"; do
            started=$SECONDS
            (
                cd "$here"
                CGO_ENABLED=0 go build "${flags[@]}" -ldflags="$ldflags" -o "$tmp/$name" \
                    "./cmd/$name" >&2
            )
            echo "$name built in $((SECONDS - started))s" >&2
        done
        ln "$cache/kwok-$KWOK_VERSION/bin/kwok" "$tmp/kwok" 2>/dev/null \
            || cp "$cache/kwok-$KWOK_VERSION/bin/kwok" "$tmp/kwok"
        chmod 755 "$tmp"
        rm -rf "$bin"
        mv "$tmp" "$bin"
        trap - EXIT
    fi
fi

echo "$bin"
