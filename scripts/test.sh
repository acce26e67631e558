#!/usr/bin/env bash
# Sets up a virtual environment (once) and runs the test suite. GPU tests skip without a GPU.
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q -e ".[test,kernels]"  # kernels: NVRTC, so that the kernel targets compile here too
.venv/bin/ruff check .
# The project's own bytecode, once: where PYTHONDONTWRITEBYTECODE is set (this machine and CI set it)
# every process the tests start (Ray's workers, the CLI, the sandbox's hosts) compiled it anew.
.venv/bin/python -m compileall -q -j 0 agents cluster search_spaces tests scripts >/dev/null
source scripts/bubblewrap.sh  # the sandbox every build and run goes through
.venv/bin/python -m cluster.cli doctor || echo "the sandbox does not work here: its tests skip, sweeps refuse to run"
# Two pytest-xdist workers by default (the tests with a Ray of their own, and the program suites'
# builds, are groups that each stay on one worker); WF_TEST_WORKERS=N for N, 0 for one process.
if [[ "${WF_TEST_WORKERS:-2}" != 0 ]]; then
    exec .venv/bin/python -m pytest -n "${WF_TEST_WORKERS:-2}" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest "$@"
