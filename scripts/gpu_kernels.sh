#!/usr/bin/env bash
# Kernel targets on the GPU machine (issue 14), from the repository root:
#   scripts/gpu_kernels.sh tests            the kernel runner's GPU tests and the CPU kernel tests
#   scripts/gpu_kernels.sh sweep [OUT]      a sweep of configs/kernels.yaml, then its launch export
#   scripts/gpu_kernels.sh fixed OUT        the kernel runner's fixed cost per run (scripts/bench_runners.py)
#   scripts/gpu_kernels.sh compare GPUS OUT the Kernel Tuner comparison on GPUS (1, 2 or 4) cards, kernel lane
# PYTHON picks the interpreter (default: python3); warpfleet's dependencies and cuda-bindings must be there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  tests)
    "$PYTHON" -m pytest -q -m gpu tests/cluster/runners/test_kernel_gpu.py
    "$PYTHON" -m pytest -q tests/cluster/config/test_kernel_target.py tests/cluster/config/test_kt_import.py \
      tests/cluster/compile/test_kernel.py tests/cluster/runners/test_kernel_harness.py \
      tests/cluster/runners/test_kernel_runner.py tests/cluster/outputs/test_launch_export.py \
      tests/scripts/test_kt_kernel_targets.py ;;
  sweep)
    out=${2:-/tmp/wf-kernels}
    "$PYTHON" -m cluster.cli sweep configs/kernels.yaml --output-dir "$out" --no-progress
    run=$(ls -d "$out"/kernels-* | tail -1)
    "$PYTHON" -m cluster.cli show "$run"
    "$PYTHON" -m cluster.cli export "$run" --format launch ;;
  fixed)
    "$PYTHON" scripts/bench_runners.py configs/kernels.yaml --repeats 10 --out "${2:?OUT}" ;;
  compare)
    gpus=${2:?GPUS: 1, 2 or 4}; out=${3:?OUT}
    "$PYTHON" scripts/bench_kerneltuner.py --out "$out" --gpus "$gpus" --wf-kind kernel --budget-s 540 ;;
  *)
    sed -n 2,7p "$0"; exit 2 ;;
esac
