#!/usr/bin/env bash
# Installs, when missing, Debian's packages that `make image` and the e2e real node use:
# podman/buildah (build the Dockerfile, no daemon, no registry), runc, mmdebstrap (the
# base image from Debian's packages), containerd and the CNI plugins (the real node).
# Idempotent: a machine that has them all does nothing and prints nothing.
# Needs root (apt-get); docs/operations.md "Building the image".
set -euo pipefail

packages=(podman buildah runc crun skopeo mmdebstrap uidmap fuse-overlayfs
          containerd containernetworking-plugins iptables iproute2)
commands=(podman buildah runc skopeo mmdebstrap containerd ctr /usr/lib/cni/bridge
          iptables ip)

missing() {
    local c
    for c in "${commands[@]}"; do
        if [[ $c == /* ]]; then [[ -x $c ]] || return 0; else command -v "$c" >/dev/null || return 0; fi
    done
    return 1
}

if missing; then
    if [[ $(id -u) != 0 ]]; then
        echo "scripts/image-tools.sh: missing tools and not root; install: ${packages[*]}" >&2
        exit 1
    fi
    # One apt at a time on this machine (a concurrent make test may ask as well).
    exec 9>/var/lock/runguard-image-tools.lock
    flock 9
    if missing; then
        started=$SECONDS
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
        echo "image tools installed in $((SECONDS - started))s" >&2
    fi
fi
