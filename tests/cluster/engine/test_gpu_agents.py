"""The workflow's GPU path: compute-sanitizer verdicts on real kernels, and `optimize` on the
transpose target, where the padding expert must find, verify and win with its variant.

Marked ``gpu``: skipped where no NVIDIA GPU answers NVML (CI); run on the GPU machine.
"""

from __future__ import annotations

import json
import shutil

import pytest

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import Candidate, Phase
from cluster.measure.sanitize import sanitize_candidate
from cluster.platform.devices import gpu_device
from cluster.store.results import read_results, read_table
from cluster.store.variants import VARIANT_SCHEMA
from tests.conftest import REPO, gpu_present, write_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no NVIDIA GPU and nvcc")]

KERNELS = r"""
#include <cstdio>
__global__ void k(float* out, int n) {
    __shared__ float s[64];
    int i = threadIdx.x;
    s[i] = (float)i;
#ifdef RACE
    // no __syncthreads(): lane i reads what lane 63 - i writes
#else
    __syncthreads();
#endif
    float v = s[63 - i];
#ifdef OOB
    out[i + n] = v;
#else
    out[i] = v;
#endif
}
int main() {
    float* d;
    cudaMalloc(&d, 64 * sizeof(float));
    k<<<1, 64>>>(d, 64);
    cudaError_t e = cudaDeviceSynchronize();
    printf("@warpfleet time_ms=1.0\n");
    FILE* f = fopen("out.bin", "wb"); float h[64]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    fwrite(h, sizeof h, 1, f); fclose(f);
    return e == cudaSuccess ? 0 : 3;
}
"""


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="no compute-sanitizer")
@pytest.mark.parametrize("define, tool, outcome", [
    ("", "memcheck", "clean"), ("", "racecheck", "clean"),
    ("OOB", "memcheck", "errors"), ("RACE", "racecheck", "errors")])
def test_sanitizer_finds_what_it_should(tmp_path, define, tool, outcome):
    folder = tmp_path / "k"
    write_target(folder, name="k", toolchain="nvcc", sources=["k.cu"], params={}, verify={"outputs": ["out.bin"]})
    (folder / "k.cu").write_text(KERNELS)
    target = load_target(folder / "target.yaml")
    device = gpu_device(0, "gpu-0")
    params = ((define, 1),) if define else ()
    candidate = Candidate("k", "nvcc", device.device_type, device.arch, target.bundle.hash, (), params, Phase.VERIFY)
    artifact = compile_candidate(target, candidate)
    assert artifact.binary, artifact.error_tail
    [result] = sanitize_candidate(target, candidate, artifact.binary, (tool,), 120)
    assert result.outcome == outcome, result


def test_optimize_pads_the_transpose_and_the_variant_wins(tmp_path):
    from click.testing import CliRunner

    from cluster.cli import main

    target = REPO / "configs" / "targets" / "transpose" / "target.yaml"
    result = CliRunner().invoke(main, ["optimize", str(target), "--trials", "6", "--output-dir", str(tmp_path),
                                       "--experts", "padding,registers", "--no-progress"])
    assert result.exit_code == 0, result.output
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    variants = read_table(run, "variants", VARIANT_SCHEMA)
    padding = variants[(variants["optimization"] == "padding") & (variants["stage"] == "accepted")]
    assert len(padding) >= 1, variants[["optimization", "stage", "reason"]].to_string()
    verdicts = {v["check"]: v["status"] for v in json.loads(padding["verdicts"].iloc[0])}
    assert verdicts["outputs"] == "passed" and verdicts["memcheck"] == "passed" and verdicts["racecheck"] == "passed"
    seconds = {v["check"]: v["seconds"] for v in json.loads(padding["verdicts"].iloc[0])}
    assert all(seconds[check] > 0 for check in ("build", "outputs", "memcheck", "racecheck")), seconds
    assert "l1tex__data_bank_conflicts" in padding["evidence"].iloc[0]  # the profile that motivated it
    rows = read_results(run)
    assert set(padding["source_hash"]) & set(rows.loc[rows["phase"] == "search", "source_hash"])
    assert "Nsight Compute, baseline -> winner" in result.output and "bank conflicts" in result.output
