#!/usr/bin/env bash
# make image: builds the runguard image from the Dockerfile with Debian's podman (no
# Docker daemon, no registry), tagged localhost/runguard:<version of pyproject.toml>.
#
#   1. scripts/image-tools.sh installs podman, buildah, runc, mmdebstrap... when missing;
#   2. the base image (the Dockerfile's PYTHON_IMAGE: python3, venv, pip) is made from
#      Debian's packages by mmdebstrap, cached as a tar under $cache keyed by its command
#      line, and imported into podman's storage once;
#   3. podman build of the Dockerfile as it is. Only Debian's mirrors (step 2) and the
#      package index pip reads (the RUN step) are reached.
#
# Prints the image name on stdout; progress and timings go to stderr.
#
#   RUNGUARD_IMAGE_CACHE   cache folder (default ~/.cache/runguard/image)
#   RUNGUARD_IMAGE         image name (default localhost/runguard)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${RUNGUARD_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runguard/image}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)"
image="${RUNGUARD_IMAGE:-localhost/runguard}:$version"
started=$SECONDS

bash "$repo/scripts/image-tools.sh"
mkdir -p "$cache"

# podman's defaults fail on this kind of host (cgroup v1 + a hugetlb-only cgroup2, no
# CAP_SYS_RESOURCE): crun refuses hybrid cgroups, and the default rlimits (1M files)
# are above the hard limits. runc, and limits within them.
conf="$cache/containers.conf"
nofile="$(ulimit -Hn)"
[[ $nofile == unlimited || $nofile -gt 20000 ]] && nofile=20000
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n' \
    "$nofile" "$nofile" >"$conf.tmp"
mv "$conf.tmp" "$conf"
export CONTAINERS_CONF="$conf"

# --- the base: Debian bookworm's python3 (3.11), venv and pip, nothing else ------------
mmdebstrap_args=(
    --variant=minbase
    --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
    --aptopt='APT::Install-Recommends "false"'
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    bookworm
)
key="$(printf '%s\n' "${mmdebstrap_args[@]}" | sha256sum | cut -c1-12)"
base="localhost/runguard-base:bookworm-$key"
tarball="$cache/base-$key.tar"

exec 9>"$cache/.lock" # one build at a time; a second caller waits
flock 9
if ! podman image exists "$base"; then
    if [[ ! -s $tarball ]]; then
        echo "making the base image with mmdebstrap (Debian bookworm's python3) into $tarball" >&2
        t=$SECONDS
        mmdebstrap --quiet --format=tar "${mmdebstrap_args[@]}" "$tarball.tmp" >&2
        mv "$tarball.tmp" "$tarball"
        echo "base made in $((SECONDS - t))s" >&2
    fi
    podman import --quiet --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' \
        "$tarball" "$base" >/dev/null
fi

# --- the image --------------------------------------------------------------------------
# A TLS-intercepting proxy's CA, when pip is configured with one, is lent to the RUN step
# only (a bind mount is not committed); the image keeps Debian's own bundle.
mounts=()
if [[ -f /etc/pip.conf ]] && grep -q '^ *cert *=' /etc/pip.conf; then
    cert="$(sed -n 's/^ *cert *= *//p' /etc/pip.conf | head -1)"
    mounts+=(-v "/etc/pip.conf:/etc/pip.conf:ro" -v "$cert:$cert:ro")
fi
t=$SECONDS
# --isolation chroot: RUN needs no OCI runtime (no cgroups); --network host: pip reaches
# the package index from the host's own network, no bridge or iptables.
podman build --quiet --isolation chroot --network host --pull=never \
    --build-arg "PYTHON_IMAGE=$base" "${mounts[@]}" -t "$image" "$repo" >/dev/null
echo "built $image in $((SECONDS - t))s ($((SECONDS - started))s in all)" >&2
echo "$image"
