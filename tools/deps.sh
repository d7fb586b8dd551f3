#!/usr/bin/env bash
# Install the Debian 12 packages the suite needs: compilers and libraries for
# the servers, Redis for the guestbook, load generators and nginx for the
# sweep, Python with pytest and matplotlib for tests and charts; taskset
# (util-linux) for pinned sweeps, ssh and sshd for multi-host sweeps (the test
# runs a private sshd on 127.0.0.1 and never uses the system one).
# Quiet and quick when everything is present, so `make test` can always call it.
set -euo pipefail

PACKAGES=(
    build-essential redis-server uthash-dev liburing-dev
    apache2-utils nginx wrk curl strace patch
    util-linux openssh-client openssh-server
    python3 python3-pytest python3-matplotlib
    clang clang-format libclang-rt-14-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
    echo "deps: missing packages: ${missing[*]}" >&2
    echo "deps: as root, run: apt-get update &&" \
        "apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
echo "deps: installing ${missing[*]}"
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "${missing[@]}"
