"""The expensive tier's bounds (cluster.engine.verification.checks): compute-sanitizer on the kernels a
variant changed, every kernel where it changed anything else."""

from __future__ import annotations

from agents._base import Proposal
from agents.patch import source_files, variant_target
from cluster.config import load_target
from cluster.engine.verification.checks import changed_kernels
from tests.conftest import REPO

SOURCE = """
__global__ void scale(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }
__global__ void shift(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1.0f; }
int main() { return 0; }
"""


def variant(original, text: str):
    return variant_target(original, Proposal("t", "t", (("saxpy.cu", text),)))


def test_the_kernels_a_variant_changed_and_every_kernel_where_it_changed_host_code():
    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    base = variant(target, SOURCE)
    assert source_files(base)["saxpy.cu"] == SOURCE
    body_only = variant(target, SOURCE.replace("x[i] *= 2.0f", "x[i] = x[i] * 2.0f"))
    assert changed_kernels(base, body_only) == ("scale",)
    both = variant(target, SOURCE.replace("*= 2.0f", "*= 3.0f").replace("+= 1.0f", "+= 2.0f"))
    assert changed_kernels(base, both) == ("scale", "shift")
    host = variant(target, SOURCE.replace("return 0;", "return 1;"))
    assert changed_kernels(base, host) == ()  # host code changed: every kernel
    added = variant(target, SOURCE + "__global__ void more(float* x) { x[0] = 0; }\n")
    assert changed_kernels(base, added) == ()
