"""Kernel targets compiled to cubins: NVRTC (the default) and nvcc -cubin, the flags space, the
ptxas report per kernel, the launch in the binary, and the compile cache. CPU only."""

from __future__ import annotations

import shutil

import pytest

from cluster.compile import kernel as kernel_build
from cluster.compile.build import compile_candidate
from cluster.compile.kernel import KernelBinary, nvrtc_version
from cluster.config import load_target
from cluster.core.types import Candidate, Status
from tests.cluster.kernel_targets import N, vadd_kernel, write_kernel_target

needs_nvrtc = pytest.mark.skipif(nvrtc_version() is None, reason="NVRTC not loadable (pip install '.[kernels]')")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _candidate(target, flags=(), **params):
    values = {**target.baseline_params, **params}
    return Candidate(target.name, "nvcc", "H100", "sm_90", target.bundle.hash, tuple(flags), tuple(values.items()),
                     runner=target.runner)


@pytest.fixture
def vadd(tmp_path):
    return load_target(write_kernel_target(tmp_path / "vadd"))


@needs_nvrtc
def test_nvrtc_builds_a_cubin_with_its_launch_and_ptxas_report(vadd, tmp_path):
    artifact = compile_candidate(vadd, _candidate(vadd, block_size_x=512, ITEMS=2), tmp_path)
    assert artifact.status is Status.OK, artifact.error_tail
    binary = KernelBinary.unpack(artifact.binary)
    assert binary.compiler.startswith("nvrtc ") and binary.lowered_name == "vadd"
    assert binary.cubin[:4] == b"\x7fELF"
    assert binary.plan.grid == (N // 1024, 1, 1) and binary.plan.block == (512, 1, 1)
    [report] = artifact.kernels
    assert report.kernel == "vadd" and report.arch == "sm_90" and report.registers > 0
    assert artifact.binary_hash == artifact.hash_binary(artifact.binary)


@needs_nvrtc
def test_the_flags_space_reaches_ptxas(tmp_path):
    kernel = vadd_kernel(name="heavy", grid_div_x=None)
    target = load_target(write_kernel_target(tmp_path / "heavy", source="heavy.cu", kernel=kernel,
                                             params={"block_size_x": [128]}))
    free = compile_candidate(target, _candidate(target), tmp_path)
    capped = compile_candidate(target, _candidate(target, [("maxrregcount", "-maxrregcount=32"),
                                                           ("opt_level", "-Xptxas -O2")]), tmp_path)
    assert free.status is Status.OK and capped.status is Status.OK, free.error_tail + capped.error_tail
    assert free.kernels[0].registers > 32 >= capped.kernels[0].registers
    assert free.binary_hash != capped.binary_hash


@needs_nvrtc
def test_a_template_kernel_is_found_by_its_name_expression(tmp_path):
    kernel = vadd_kernel(name="scale<FACTOR, float>", grid_div_x=["block_size_x"], arguments=[
        {"name": "out", "shape": ["n"], "output": True}, {"name": "in", "shape": ["n"], "uniform": [0, 1]},
        {"name": "n", "dtype": "int32", "value": "n"}])
    target = load_target(write_kernel_target(tmp_path / "t", kernel=kernel, params={"FACTOR": [2, 3],
                                                                                    "block_size_x": [256]}))
    artifact = compile_candidate(target, _candidate(target, FACTOR=3), tmp_path)
    assert artifact.status is Status.OK, artifact.error_tail
    binary = KernelBinary.unpack(artifact.binary)
    assert binary.plan.kernel == "scale<3, float>" and binary.lowered_name == "_Z5scaleILi3EfEvPT0_PKS0_i"
    assert [k.kernel for k in artifact.kernels] == [binary.lowered_name]


@needs_nvrtc
def test_a_compile_error_is_a_row_with_the_compilers_words(tmp_path):
    path = write_kernel_target(tmp_path / "bad")
    (path.parent / "vadd.cu").write_text("extern \"C\" __global__ void vadd(float* c) { c[0] = undeclared; }\n")
    target = load_target(path)
    artifact = compile_candidate(target, _candidate(target), tmp_path)
    assert artifact.status is Status.COMPILE_ERROR and 'identifier "undeclared" is undefined' in artifact.error_tail


def test_a_launch_that_cannot_run_is_a_compile_error(vadd, tmp_path):
    artifact = compile_candidate(vadd, _candidate(vadd, block_size_x=2048), tmp_path)
    assert artifact.status is Status.COMPILE_ERROR and "more than 1024" in artifact.error_tail


@needs_nvrtc
def test_the_cache_compiles_each_content_once(vadd, tmp_path, monkeypatch):
    first = compile_candidate(vadd, _candidate(vadd), tmp_path)
    assert len(list((tmp_path / kernel_build.CACHE_DIR).glob("*.json"))) == 1

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(kernel_build, "_compile", no_compiler)
    again = compile_candidate(vadd, _candidate(vadd), tmp_path)
    assert again.status is Status.OK and again.binary == first.binary and again.kernels == first.kernels
    monkeypatch.undo()
    other = compile_candidate(vadd, _candidate(vadd, [("fast_math", "--use_fast_math")]), tmp_path)
    assert other.status is Status.OK and len(list((tmp_path / kernel_build.CACHE_DIR).glob("*.json"))) == 2


@needs_nvcc
@pytest.mark.nvcc
def test_nvcc_cubin_builds_the_same_kernel(tmp_path):
    for name, params, lowered in (("vadd", {}, "vadd"), ("scale<FACTOR, float>", {"FACTOR": 2},
                                                         "_Z5scaleILi2EfEvPT0_PKS0_i")):
        kernel = vadd_kernel(name=name, compiler="nvcc")
        target = load_target(write_kernel_target(tmp_path / lowered, kernel=kernel,
                                                 params={"block_size_x": [256], "ITEMS": [1], "FACTOR": [2]}))
        artifact = compile_candidate(target, _candidate(target, [("maxrregcount", "-maxrregcount=32")], **params),
                                     tmp_path)
        assert artifact.status is Status.OK, artifact.error_tail
        binary = KernelBinary.unpack(artifact.binary)
        assert binary.compiler.startswith("nvcc ") and binary.lowered_name == lowered
        assert binary.cubin[:4] == b"\x7fELF" and artifact.kernels[0].registers > 0


def test_the_binary_round_trips(vadd):
    plan = vadd.spec.kernel.plan(vadd.baseline_params)
    binary = KernelBinary(b"\x7fELFcubin", "vadd", plan, "nvrtc 13.0")
    assert KernelBinary.unpack(binary.pack()) == binary
    with pytest.raises(ValueError, match="not a warpfleet kernel binary"):
        KernelBinary.unpack(b"\x7fELF")


def _bwrap():
    from cluster.config.run import SandboxSpec
    from cluster.sandbox.isolation import start_bubblewrap
    from cluster.sandbox.sandbox import SandboxError

    try:
        return start_bubblewrap(SandboxSpec(pids=256, memory_mb=4096))
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")


@pytest.mark.parametrize("compiler", [pytest.param("nvrtc", marks=needs_nvrtc), pytest.param("nvcc", marks=needs_nvcc)])
def test_a_kernel_that_includes_a_file_outside_its_folder_reads_nothing_the_sandbox_hides(tmp_path, compiler):
    """An agent's variant is untrusted: its #include of a worker's file (here one in the worker's
    /tmp, mode 0600) must not bring the file's words into the row, as it does outside the sandbox."""
    from cluster.sandbox.sandbox import Unsandboxed

    secret = tmp_path / "secret" / "key.h"
    secret.parent.mkdir()
    secret.write_text('#error "SECRET-7f3a"\n')
    secret.chmod(0o600)
    path = write_kernel_target(tmp_path / "leak", kernel=vadd_kernel(compiler=compiler))
    source = path.parent / "vadd.cu"
    source.write_text(f'#include "{secret}"\n' + source.read_text())
    target = load_target(path)
    sandboxed = compile_candidate(target, _candidate(target), tmp_path / "a", sandbox=_bwrap())
    assert sandboxed.status is Status.COMPILE_ERROR
    assert "SECRET-7f3a" not in sandboxed.error_tail and "key.h" in sandboxed.error_tail, sandboxed.error_tail
    bare = compile_candidate(target, _candidate(target), tmp_path / "b", sandbox=Unsandboxed())
    assert bare.status is Status.COMPILE_ERROR and "SECRET-7f3a" in bare.error_tail  # what the sandbox stops


@needs_nvrtc
def test_nvrtc_compiles_in_one_host_per_sandbox_that_outlives_a_compile(vadd, tmp_path):
    sandbox = _bwrap()
    first = compile_candidate(vadd, _candidate(vadd), tmp_path, sandbox=sandbox)
    second = compile_candidate(vadd, _candidate(vadd, block_size_x=512), tmp_path, sandbox=sandbox)
    assert first.status is second.status is Status.OK, first.error_tail + second.error_tail
    [(host, _, root)] = [h for key, h in kernel_build.COMPILE_HOSTS.hosts.items() if key[0] == id(sandbox)]
    assert host.starts == 1 and host.proc is not None and host.proc.poll() is None
    assert root.is_dir() and not any(root.iterdir())  # each compile's directory removed
