#!/usr/bin/env bash
# Sets up a virtual environment (once) and runs the test suite. GPU tests skip without a GPU.
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# kernels: NVRTC, so that the kernel targets compile here too. pip compiles what it installs on one
# core; compileall on both (a clean clone's set-up: 82 s, now 72 s; 3 s more where all is installed),
# skipping, as pip does, the odd file of a package that does not compile.
.venv/bin/python -m pip install -q --no-compile -e ".[test,kernels]"
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
.venv/bin/ruff check .
# The project's own bytecode, once: where PYTHONDONTWRITEBYTECODE is set (this machine and CI set it)
# every process the tests start (Ray's workers, the CLI, the sandbox's hosts) compiled it anew.
.venv/bin/python -m compileall -q -j 0 agents cluster search_spaces tests scripts >/dev/null
source scripts/bubblewrap.sh  # the sandbox every build and run goes through
.venv/bin/python -m cluster.cli doctor || echo "the sandbox does not work here: its tests skip, sweeps refuse to run"
# Two pytest-xdist workers by default (the tests with a Ray of their own, and the program suites'
# builds, are groups that each stay on one worker); WF_TEST_WORKERS=N for N, 0 for one process.
# Three are faster on an idle machine (a waiting worker leaves its core to the third: pytest 651 s
# against 742 s), but beside two spinning processes they made a load of 10, and the wall clock failed
# honest candidates of the sweeps' tests in two runs of two (README, Tests).
if [[ "${WF_TEST_WORKERS:-2}" != 0 ]]; then
    exec .venv/bin/python -m pytest -n "${WF_TEST_WORKERS:-2}" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest "$@"
