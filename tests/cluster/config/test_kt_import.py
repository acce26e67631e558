"""`warpfleet kt-import`: Kernel Tuner scripts (its own examples) turned into kernel targets."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from cluster.cli import main
from cluster.compile.build import compile_candidate
from cluster.compile.kernel import KernelBinary, nvrtc_version
from cluster.config import load_target
from cluster.config.kt_import import KtImportError, kt_import
from cluster.core.types import Candidate, Status
from tests.conftest import REPO

EXAMPLES = REPO / "tests" / "fixtures" / "kernel_tuner"


def _compile_baseline(target, tmp_path):
    if nvrtc_version() is None:
        pytest.skip("NVRTC not loadable")
    candidate = Candidate(target.name, "nvcc", "H100", "sm_90", target.bundle.hash, (),
                          tuple(target.baseline_params.items()))
    artifact = compile_candidate(target, candidate, tmp_path)
    assert artifact.status is Status.OK, artifact.error_tail
    return KernelBinary.unpack(artifact.binary)


def test_vector_add_example(tmp_path):
    shutil.copyfile(EXAMPLES / "vector_add.py", tmp_path / "vector_add.py")
    out = tmp_path / "target" / "target.yaml"
    result = CliRunner().invoke(main, ["kt-import", str(tmp_path / "vector_add.py"), "--output", str(out)])
    assert result.exit_code == 0, result.output
    target = load_target(out)
    kernel = target.spec.kernel
    assert target.spec.kind == "kernel" and target.spec.sources == ["vector_add.cu"]
    assert target.spec.params == {"block_size_x": [128 + 64 * i for i in range(15)]}
    assert kernel.name == "vector_add" and kernel.problem_size == [10000000]
    assert [(a.name, a.dtype, a.output) for a in kernel.arguments] == [
        ("c", "float32", True), ("a", "float32", False), ("b", "float32", False), ("n", "int32", False)]
    assert kernel.arguments[0].constant == 0 and kernel.arguments[1].uniform is not None
    assert kernel.arguments[3].value == 10000000
    assert target.spec.verify.atol == 1e-6 and [o.path for o in target.spec.verify.outputs] == ["c.bin"]
    binary = _compile_baseline(target, tmp_path)
    assert binary.plan.grid == (78125, 1, 1) and binary.plan.block == (128, 1, 1)


def test_convolution_example_with_constant_memory_and_restrictions(tmp_path):
    for name in ("convolution.py", "convolution.cu"):
        shutil.copyfile(EXAMPLES / name, tmp_path / name)
    out = tmp_path / "target.yaml"
    spec = kt_import(tmp_path / "convolution.py", out, name="conv", params_only=True).spec
    target = load_target(out)
    kernel = target.spec.kernel
    assert spec["name"] == "conv" and target.space.flags == {"none": ("",)}
    assert kernel.grid_div_x == ["block_size_x", "tile_size_x"] and kernel.grid_div_y == ["block_size_y", "tile_size_y"]
    assert [a.name for a in kernel.arguments] == ["output", "input", "filter"]
    assert [(c.name, c.shape) for c in kernel.constants] == [("d_filter", [33 * 33])]
    assert target.spec.constraints == ["use_padding==0 or (block_size_x % 32 != 0)"]
    assert len(target.spec.params["filter_height"]) == 16 and "read_only" in target.spec.params
    binary = _compile_baseline(target, tmp_path)
    assert binary.lowered_name == "_Z18convolution_kernelPfS_S_"
    assert binary.plan.grid == (4096 // 16, 4096, 1) and binary.plan.block == (16, 1, 1)


SCRIPT = '''
import numpy
from kernel_tuner import tune_kernel
from kernel_tuner.file_utils import store_output_file

src = "__global__ void gather(float* out, const int* idx, const float* x, float scale) {{ }}"
idx = numpy.array([3, 1, 2, 0], dtype=numpy.int32)
x = numpy.linspace(0, 1, 4).astype(numpy.float32)
out = numpy.ones(4, dtype=numpy.float32)
args = [out, idx, x, numpy.float32(2.0)]
tune_params = {{"block_size_x": [32, 64], "UNROLL": [1, 2]}}
if __name__ == "__main__":
    tune_kernel("gather", src, 4, args, tune_params, answer=[x, None, None, None], atol=1e-3,
                restrictions={restrictions}, {extra})
'''


def _script(tmp_path, restrictions="['block_size_x * UNROLL <= 64']", extra="block_size_names=['block_size_x']"):
    path = tmp_path / "tune.py"
    path.write_text(SCRIPT.format(restrictions=restrictions, extra=extra))
    return path


def test_a_script_with_npy_inputs_answer_and_restrictions(tmp_path):
    spec = kt_import(_script(tmp_path), tmp_path / "t" / "target.yaml", inputs="npy").spec
    args = {a["name"]: a for a in spec["kernel"]["arguments"]}
    assert args["out"]["output"] and args["out"]["constant"] == 1.0  # from the answer, not from zeros
    assert args["idx"]["file"] == "idx.npy" and args["x"]["file"] == "x.npy"
    assert args["scale"] == {"name": "scale", "dtype": "float32", "value": 2.0}
    assert np.array_equal(np.load(tmp_path / "t" / "idx.npy"), [3, 1, 2, 0])
    assert spec["constraints"] == ["block_size_x * UNROLL <= 64"] and spec["defaults"] == {
        "block_size_x": 32, "UNROLL": 1}
    assert spec["verify"]["atol"] == 1e-3 and spec["files"] == ["idx.npy", "x.npy"]
    target = load_target(tmp_path / "t" / "target.yaml")
    assert target.baseline_params == {"block_size_x": 32, "UNROLL": 1}


@pytest.mark.parametrize(("restrictions", "extra", "message"), [
    ("[lambda p: p['UNROLL'] < 2]", "", "restrictions[0] is a Python function"),
    ("['UNROLL in (1, 2)']", "", "restrictions[0]: not allowed in a constraint"),
    ("None", "verify=lambda a, b, atol: True", "verify cannot be carried over"),
    ("None", "grid_div_x=lambda p: 1", "grid_div_x is a Python function"),
    ("None", "lang='OpenCL'", "lang 'OpenCL': only CUDA"),
])
def test_what_cannot_be_converted_is_one_line(tmp_path, restrictions, extra, message):
    script = _script(tmp_path, restrictions, extra)
    with pytest.raises(KtImportError, match=re.escape(message)):
        kt_import(script, tmp_path / "target.yaml")
    result = CliRunner().invoke(main, ["kt-import", str(script), "--output", str(tmp_path / "target.yaml")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and message in result.output


def test_a_script_that_never_tunes(tmp_path):
    script = tmp_path / "none.py"
    script.write_text("import kernel_tuner\nprint('hello')\n")
    with pytest.raises(KtImportError, match="never called tune_kernel"):
        kt_import(script, tmp_path / "target.yaml")
    import sys

    assert "kernel_tuner" not in sys.modules  # the stand-in does not outlive the import


def test_the_written_file_is_plain_yaml(tmp_path):
    kt_import(_script(tmp_path), tmp_path / "target.yaml")
    text = (tmp_path / "target.yaml").read_text()
    assert text.startswith("# Converted from tune.py") and yaml.safe_load(text)["kind"] == "kernel"
    assert (tmp_path / "gather.cu").read_text().startswith("__global__ void gather(")


def test_what_the_target_does_not_carry_is_said_on_the_command_line_and_in_the_file(tmp_path):
    """Seen: metrics=, objective='GBs', strategy=, observers= and iterations= dropped without a
    word, and the objective silently became time."""
    extra = ("metrics={'GBs': lambda p: 1.0}, objective='GBs', strategy='genetic_algorithm', "
             "observers=[object()], iterations=32, verbose=True")
    script = _script(tmp_path, extra=extra)
    out = tmp_path / "target.yaml"
    result = CliRunner().invoke(main, ["kt-import", str(script), "--output", str(out)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert [n.split(": ")[2].split(" is not")[0] for n in notes] == [
        "objective='GBs'", "metrics={GBs}", "strategy='genetic_algorithm'", "observers=list", "iterations=32"]
    assert "warpfleet minimizes the kernel's time" in notes[0] and "search.sampler" in notes[2]
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert header[1:] == [f"# {n.split(': ', 2)[2]}" for n in notes]
    quiet = CliRunner().invoke(main, ["kt-import", str(_script(tmp_path)), "--output", str(out)])
    assert quiet.exit_code == 0 and "note:" not in quiet.output  # defaults say nothing (iterations=7)


def test_a_script_that_raises_is_one_line_naming_its_line(tmp_path):
    script = tmp_path / "tune.py"
    script.write_text("import numpy\n\nsizes = {'n': 4}\nn = sizes['m']\n")
    result = CliRunner().invoke(main, ["kt-import", str(script), "--output", str(tmp_path / "t.yaml")])
    assert result.exit_code == 2 and result.output.splitlines() == [
        f"error: {script}: tune.py raised KeyError at line 4: 'm'"]
    assert not (tmp_path / "t.yaml").exists()


def test_an_output_that_cannot_be_written_is_one_line_and_a_missing_folder_is_made(tmp_path):
    script = _script(tmp_path)
    blocked = tmp_path / "tune.py" / "t" / "target.yaml"  # under a file
    result = CliRunner().invoke(main, ["kt-import", str(script), "--output", str(blocked)])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith(f"error: {blocked}: --output: cannot be written"), result.output
    made = tmp_path / "new" / "folder" / "target.yaml"
    assert CliRunner().invoke(main, ["kt-import", str(script), "--output", str(made)]).exit_code == 0
    assert load_target(made).spec.kind == "kernel"


@pytest.mark.parametrize(("draw", "noted"), [("numpy.random.randn", True), ("numpy.random.rand", False)])
def test_inputs_drawn_unevenly_are_noted_where_they_become_uniform(tmp_path, draw, noted):
    """Seen: np.random.randn inputs became `uniform: [-5.2, 5.2]` without a word."""
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT.format(restrictions="None", extra="").replace(
        "x = numpy.linspace(0, 1, 4).astype(numpy.float32)",
        f"numpy.random.seed(0); x = {draw}(100000).astype(numpy.float32)").replace("tune_kernel(\"gather\", src, 4,",
                                                                                "tune_kernel(\"gather\", src, 100000,"))
    out = tmp_path / "target.yaml"
    result = CliRunner().invoke(main, ["kt-import", str(script), "--output", str(out)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    [x] = [a for a in load_target(out).spec.kernel.arguments if a.name == "x"]
    assert x.uniform is not None
    if noted:
        assert len(notes) == 1 and notes[0].startswith(f"note: {script}: x: the script's values are not spread "
                                                       "evenly over their range"), notes
        assert "--inputs npy" in notes[0] and f"uniform: [{x.uniform[0]}, {x.uniform[1]}]" in notes[0]
        assert f"# {notes[0].split(': ', 2)[2]}" in out.read_text()
    else:
        assert notes == []
