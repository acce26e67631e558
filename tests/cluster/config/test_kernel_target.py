"""Kernel targets (``kind: kernel``): the spec, its launch, and each config error in one line."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_target
from cluster.config.kernel import template_name
from cluster.core.errors import ConfigError
from tests.cluster.kernel_targets import N, vadd_kernel, write_kernel_target
from tests.conftest import write_config


def test_kernel_target_loads_with_its_runner_fields(tmp_path):
    target = load_target(write_kernel_target(tmp_path))
    spec = target.spec
    assert spec.kind == "kernel" and spec.toolchain == "nvcc"
    assert spec.run == ["{binary}", "--seed", "{seed}"]  # the kernel runner's process form: fresh seeds
    assert [(o.path, o.dtype) for o in spec.verify.outputs] == [("c.bin", "float32")]
    plan = spec.kernel.plan({"block_size_x": 256, "ITEMS": 4})
    assert plan.kernel == "vadd" and plan.block == (256, 1, 1) and plan.grid == (N // 1024, 1, 1)
    assert "-Dgrid_size_x=64" in plan.defines and "-Dblock_size_y=1" in plan.defines
    assert not any(d.startswith("-Dblock_size_x=") for d in plan.defines)  # a param: its own -D
    assert [a.fill for a in plan.arguments] == ["constant", "uniform", "uniform", "scalar"]
    assert plan.arguments[3].value == N


def test_kernel_tuner_defaults_and_explicit_geometry(tmp_path):
    # Kernel Tuner's defaults: a block_size_* name that is no param is 256 (x) or 1; an axis with no
    # grid_div divides by its block size when that is a param, else by 1.
    kernel = vadd_kernel(grid_div_x=None, problem_size=["n", 8])
    spec = load_target(write_kernel_target(tmp_path / "a", kernel=kernel, params={"ITEMS": [1]})).spec.kernel
    plan = spec.plan({"ITEMS": 1})
    assert plan.block == (256, 1, 1) and plan.grid == (N, 8, 1)
    kernel = vadd_kernel(problem_size=None, grid_div_x=None, grid=["n // (TILE * 2)"], block=["TILE", "TILE // 4"],
                         shared_mem="TILE * 4")
    spec = load_target(write_kernel_target(tmp_path / "b", kernel=kernel, params={"TILE": [16, 32]})).spec.kernel
    plan = spec.plan({"TILE": 32})
    assert plan.grid == (N // 64, 1, 1) and plan.block == (32, 8, 1) and plan.shared_mem == 128


def test_template_arguments_take_the_params_values():
    assert template_name("scale<FACTOR, float>", {"FACTOR": 3, "F": 9}) == "scale<3, float>"
    assert template_name("vadd", {"vadd": 1}) == "vadd"


def test_per_output_tolerances_and_sums(tmp_path):
    kernel = vadd_kernel()
    kernel["arguments"][0] = {**kernel["arguments"][0], "rtol": 0.01, "atol": 0.5, "compare": "sum"}
    outputs = load_target(write_kernel_target(tmp_path, kernel=kernel)).spec.verify.outputs
    assert [(o.path, o.dtype, o.rtol, o.atol) for o in outputs] == [("c.bin", "float64", 0.01, 0.5)]


def _arg(index: int, **fields):
    kernel = vadd_kernel()
    kernel["arguments"][index] = {**kernel["arguments"][index], **fields}
    return kernel


BAD = [
    ({"kernel": None}, "", "kernel: a target of kind: kernel needs its kernel section"),
    ({"run": ["{binary}"]}, "", "run: a kernel target has none"),
    ({"build": ["nvcc", "{sources}"]}, "", "build: a kernel target has none"),
    ({"kind": "program", "run": ["{binary}"]}, "", "kernel: only a target of kind: kernel has one"),
    ({"toolchain": "cc"}, "", "toolchain: a kernel target is CUDA"),
    ({"runner": "persistent"}, "", "runner: a kernel target always runs on the kernel runner"),
    ({"verify": {"outputs": ["out.bin"]}}, "", "verify: a kernel target's outputs are its arguments"),
    ({"kernel": vadd_kernel(grid=["n"])}, "kernel", "give either problem_size"),
    ({"kernel": vadd_kernel(block=["TILEX"])}, "kernel.block[0]", "unknown name 'TILEX'"),
    ({"kernel": vadd_kernel(grid_div_x=["block_size_x +"])}, "kernel.grid_div_x[0]", "not a valid expression"),
    ({"kernel": vadd_kernel(block_size_names=["bx"])}, "kernel.block_size_names", "'bx' is not a param"),
    ({"kernel": vadd_kernel(shared_mem="__import__('os')")}, "kernel.shared_mem", "not allowed"),
    ({"kernel": _arg(3, output=True)}, "kernel.arguments[3]", "a scalar cannot be an output"),
    ({"kernel": _arg(1, dtype="int32")}, "kernel.arguments[1]", "uniform fills float arrays only"),
    ({"kernel": _arg(1, uniform=[1.0, -1.0])}, "kernel.arguments[1]", "uniform needs finite lo < hi"),
    ({"kernel": _arg(1, constant=2.0)}, "kernel.arguments[1]", "give one of uniform, constant and file"),
    ({"kernel": _arg(1, dtype="complex64")}, "kernel.arguments[1].dtype", "Input should be"),
    ({"kernel": _arg(1, uniform=None, shape=None)}, "kernel.arguments[1]", "give a value (a scalar), or a shape"),
    ({"kernel": _arg(1, uniform=None, file="a.npy")}, "kernel.arguments[1].file", "a.npy is not among"),
    ({"kernel": _arg(0, output=False)}, "kernel", "no argument is an output"),
    ({"kernel": _arg(2, name="a")}, "kernel", "argument 'a' is named twice"),
    ({"kernel": _arg(0, shape=["m"])}, "kernel.arguments[0].shape[0]", "unknown name 'm'"),
    ({"kernel": vadd_kernel(sizes={"ITEMS": 4, "n": N})}, "kernel.sizes.ITEMS", "is also a param"),
    ({"kernel": vadd_kernel(name="vadd(")}, "kernel.name", "is not a kernel name"),
    ({"kernel": vadd_kernel(compiler="clang")}, "kernel.compiler", "Input should be"),
    ({"params": {"block_size_x": [2048], "ITEMS": [1]}}, "kernel", "more than 1024"),
    ({"kernel": vadd_kernel(grid_div_x=["block_size_x - 128"])}, "kernel", "the baseline's launch cannot be resolved"),
]


@pytest.mark.parametrize(("fields", "field", "message"), BAD, ids=[b[2][:40] for b in BAD])
def test_bad_kernel_target_names_file_and_field(tmp_path, fields, field, message):
    path = write_kernel_target(tmp_path, **fields)
    with pytest.raises(ConfigError) as info:
        load_target(path)
    assert info.value.field == field and message in info.value.message, str(info.value)
    assert "\n" not in str(info.value)


def test_validate_prints_one_error_line_and_exits_2(tmp_path):
    target = write_kernel_target(tmp_path, kernel=_arg(3, output=True))
    config = write_config(tmp_path, [target.name])
    result = CliRunner().invoke(main, ["validate", str(config)])
    assert result.exit_code == 2
    assert result.output == f"error: {target}: kernel.arguments[3]: n: a scalar cannot be an output\n"


def test_validate_counts_a_kernel_targets_space(tmp_path):
    target = write_kernel_target(tmp_path, space=None, constraints=["block_size_x * ITEMS <= 1024"])
    result = CliRunner().invoke(main, ["validate", str(write_config(tmp_path, [target.name]))])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("vadd: nvcc, space nvcc, ")
