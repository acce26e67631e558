#!/usr/bin/env bash
# Sets up a virtual environment (once) and runs the demo sweep on a local Ray instance:
# the CUDA target where a GPU is present, the C target on the CPU everywhere.
#   scripts/demo.sh [warpfleet sweep options]
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
source scripts/bubblewrap.sh  # the sandbox every build and run goes through
.venv/bin/warpfleet doctor || echo "the sandbox does not work here: scripts/demo.sh --unsandboxed runs without it"
exec .venv/bin/warpfleet sweep configs/demo.yaml "$@"
