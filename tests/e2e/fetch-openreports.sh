#!/usr/bin/env bash
# Fetch the OpenReports CRDs (openreports.io/v1alpha1 Report and ClusterReport) from their
# published definitions, the Go module github.com/openreports/reports-api (config/crd), once
# per OPENREPORTS_VERSION, and print the directory holding them. Later runs are offline: the
# files are copied into the e2e cache. tests/e2e/test_openreports.py installs them.
#
#   RUNGUARD_E2E_CACHE   cache root (default ~/.cache/runguard/e2e), shared with build.sh
set -euo pipefail

OPENREPORTS_VERSION=v0.2.1 # tests/openreports/ holds the same files, for the unit tests
MODULE=github.com/openreports/reports-api
FILES=(openreports.io_reports.yaml openreports.io_clusterreports.yaml)

cache="${RUNGUARD_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/e2e}"
dir="$cache/openreports-$OPENREPORTS_VERSION"
have() { for f in "${FILES[@]}"; do [[ -s $dir/crd/$f ]] || return 1; done; }
if ! have; then
    mkdir -p "$dir"
    exec 8>"$dir/.lock"
    flock 8 # one fetch at a time: a second caller waits, then finds the files
    if ! have; then
        tmp="$(mktemp -d "$dir/crd.tmp.XXXXXX")"
        trap 'rm -rf "$tmp"' EXIT
        echo "fetching $MODULE@$OPENREPORTS_VERSION's CRDs into $dir/crd" >&2
        # Outside any module: the proxy's zip, checked against the checksum database.
        module="$(cd "$tmp" && go mod download -json "$MODULE@$OPENREPORTS_VERSION" |
            sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
        for f in "${FILES[@]}"; do cp "$module/config/crd/$f" "$tmp/$f"; done
        chmod 755 "$tmp" && chmod 644 "$tmp"/*
        rm -rf "$dir/crd"
        mv "$tmp" "$dir/crd"
        trap - EXIT
    fi
    exec 8>&-
fi
echo "$dir/crd"
