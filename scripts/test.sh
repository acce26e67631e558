#!/usr/bin/env bash
# Sets up a virtual environment (once) and runs the test suite. GPU tests skip without a GPU.
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,kernels]"  # kernels: NVRTC, so that the kernel targets compile here too
.venv/bin/ruff check .
# The sandbox (bubblewrap) that every build and run of a candidate goes through: where the system
# has none, Debian's package unpacked into the virtual environment (no root needed to unpack).
if ! command -v bwrap >/dev/null && [[ ! -x .venv/bubblewrap/usr/bin/bwrap ]]; then
    download=$(mktemp -d)
    (cd "$download" && { apt-get download bubblewrap >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && apt-get download bubblewrap >/dev/null 2>&1; }; })
    dpkg -x "$download"/bubblewrap_*.deb .venv/bubblewrap
    rm -rf "$download"
fi
if [[ -x .venv/bubblewrap/usr/bin/bwrap ]]; then
    export PATH="$PWD/.venv/bubblewrap/usr/bin:$PATH"
fi
.venv/bin/python -m cluster.cli doctor || echo "the sandbox does not work here: its tests skip, sweeps refuse to run"
exec .venv/bin/python -m pytest "$@"
