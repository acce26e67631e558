#!/usr/bin/env bash
# Sets up a virtual environment (once) and runs the test suite. GPU tests skip without a GPU.
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,kernels]"  # kernels: NVRTC, so that the kernel targets compile here too
.venv/bin/ruff check .
source scripts/bubblewrap.sh  # the sandbox every build and run goes through
.venv/bin/python -m cluster.cli doctor || echo "the sandbox does not work here: its tests skip, sweeps refuse to run"
# One process by default. WF_TEST_WORKERS=2 runs two pytest-xdist workers (about 9 minutes instead of
# 12 on 2 cores), but the load one worker puts on the other fails an honest variant's clock check now
# and then (clock_mismatch: the baseline's clock is taken once; README, Development): not for CI yet.
if [[ "${WF_TEST_WORKERS:-0}" != 0 ]]; then
    exec .venv/bin/python -m pytest -n "$WF_TEST_WORKERS" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest "$@"
