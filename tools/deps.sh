#!/usr/bin/env bash
# Install the Debian 12 packages the suite needs: compilers and libraries for
# the servers, Redis for the guestbook, load generators and nginx for the
# sweep (httperf: its open-loop --rate mode), Python with pytest and
# matplotlib for tests and charts; taskset
# (util-linux) for pinned sweeps, ssh and sshd for multi-host sweeps (the test
# runs a private sshd on 127.0.0.1 and never uses the system one); strace and
# perf (linux-perf) for make trace, which records what a server does; unshare
# (util-linux) and ip (iproute2) to run the handouts' blocks in namespaces of
# their own (tools/lab blocks), ss (iproute2) for the reuseport handout; headless Chromium, its WebDriver and Selenium
# for the browser test (tests/browser.py runs under a Python that has
# selenium: .venv sees apt's); then, in a
# virtualenv (.venv, git-ignored), the Python packages Debian does not have.
# Quiet and quick when everything is present, so `make test` can always call it.
set -euo pipefail

PACKAGES=(
    build-essential redis-server uthash-dev liburing-dev
    apache2-utils nginx wrk httperf curl strace linux-perf patch
    util-linux iproute2 openssh-client openssh-server
    python3 python3-pytest python3-pytest-xdist python3-matplotlib python3-venv
    python3-pip
    clang clang-format libclang-rt-14-dev
    chromium chromium-driver python3-selenium
)

# From PyPI, into .venv: httplint (the linter behind REDbot), which the tests
# run on real responses. Debian's python3 refuses a plain `pip install` (PEP
# 668); a virtualenv with --system-site-packages still sees apt's pytest and
# matplotlib, and tools/python prefers it.
PYPI=(httplint)
VENV="$(dirname "$0")/../.venv"

missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -gt 0 && $(id -u) -ne 0 ]]; then
    echo "deps: missing packages: ${missing[*]}" >&2
    echo "deps: as root, run: apt-get update &&" \
        "apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "deps: installing ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y \
        --no-install-recommends "${missing[@]}"
fi

# --labs: the Debian packages only. Graders need nothing from PyPI, so
# `make grade` never reaches for the network (nor prints) once apt's are in.
[[ ${1:-} == --labs ]] && exit 0

imports=$(printf 'import %s;' "${PYPI[@]}")
if ! "$VENV/bin/python" -c "$imports" 2>/dev/null; then
    echo "deps: installing ${PYPI[*]} into $VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/python" -m pip install --quiet "${PYPI[@]}"
fi
