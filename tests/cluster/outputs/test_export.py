"""Export: every format parses back, and the header compiles and picks the right values."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from cluster.core.types import BestConfig, Scalar
from cluster.outputs.exports import ExportRequest, render

FORMATS = ["cmake", "flags", "header", "json", "yaml"]  # the text formats


def export(best, fmt: str) -> str:
    return render(fmt, ExportRequest(best, pd.DataFrame(), Path(".")))


def _best(target: str, arch: str, params: dict[str, Scalar], flags: dict[str, str] | None = None,
          device: str = "NVIDIA H100") -> BestConfig:
    return BestConfig(target=target, device_type=f"{device} ({arch})", arch=arch,
                      toolchain="cc" if arch == "host" else "nvcc", candidate_key=f"key-{target}-{arch}",
                      flags=flags or {}, params=params, median=1.25, baseline_median=2.5, speedup=2.0,
                      unit="ms", iqr=0.01, reason="fastest")


SAXPY_H100 = _best("saxpy", "sm_90", {"BLOCK": 256, "VEC": 4},
                   {"opt_level": "-Xptxas -O2", "fast_math": "--use_fast_math", "dlcm": ""})
SAXPY_A100 = _best("saxpy", "sm_80", {"BLOCK": 128, "VEC": 2}, device="NVIDIA A100")
SAXPY_HOST = _best("saxpy", "host", {"BLOCK": 16, "VEC": 1}, {"opt_level": "-O3"}, device="AMD EPYC")
STENCIL = _best("stencil-2d", "host", {"REAL": "double", "ALPHA": 0.5, "NAME": "two words"},
                {"opt_level": "-O2"}, device="AMD EPYC")
ALL = [STENCIL, SAXPY_HOST, SAXPY_A100, SAXPY_H100]


def test_flags_of_one_config_is_one_line_of_flags_then_defines():
    assert export([SAXPY_H100], "flags") == "-Xptxas -O2 --use_fast_math -DBLOCK=256 -DVEC=4\n"


def test_flags_of_several_configs_are_each_preceded_by_a_comment():
    lines = export(ALL, "flags").splitlines()
    assert lines[0::2] == ["# saxpy on AMD EPYC (host)", "# saxpy on NVIDIA A100 (sm_80)",
                           "# saxpy on NVIDIA H100 (sm_90)", "# stencil-2d on AMD EPYC (host)"]
    assert shlex.split(lines[7]) == ["-O2", "-DREAL=double", "-DALPHA=0.5", "-DNAME=two words"]


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_json_and_yaml_are_lists_of_records(fmt):
    text = export(ALL, fmt)
    records = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert [(r["target"], r["arch"]) for r in records] == \
        [("saxpy", "host"), ("saxpy", "sm_80"), ("saxpy", "sm_90"), ("stencil-2d", "host")]
    h100 = records[2]
    assert h100["flags"] == {"opt_level": "-Xptxas -O2", "fast_math": "--use_fast_math", "dlcm": ""}
    assert h100["flag_argv"] == ["-Xptxas", "-O2", "--use_fast_math"]
    assert h100["params"] == {"BLOCK": 256, "VEC": 4}
    assert (h100["median"], h100["baseline_median"], h100["speedup"], h100["unit"]) == (1.25, 2.5, 2.0, "ms")
    assert {"device_type", "toolchain", "candidate_key", "reason"} <= set(h100)
    assert records[3]["params"] == {"REAL": "double", "ALPHA": 0.5, "NAME": "two words"}


def test_json_and_yaml_agree_and_take_numpy_values():
    config = _best("saxpy", "sm_90", {"BLOCK": np.int64(256)})
    config = BestConfig(**{**config.__dict__, "median": np.float64(1.25), "speedup": float("inf")})
    from_json = json.loads(export([config], "json"))
    assert from_json == yaml.safe_load(export([config], "yaml"))
    assert from_json[0]["params"] == {"BLOCK": 256} and from_json[0]["speedup"] is None


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_output_does_not_depend_on_the_input_order(fmt):
    assert export(ALL, fmt) == export(list(reversed(ALL)), fmt)


def test_an_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="flags, json, yaml, header, cmake, t4, patch, bundle"):
        export(ALL, "toml")


def test_header_guards_archs_of_one_target_with_cuda_arch():
    header = export([SAXPY_H100, SAXPY_A100, SAXPY_HOST], "header")
    assert "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800" in header
    assert "#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900" in header
    assert "WARPFLEET_TARGET_" not in header  # one target: plain defines
    single = export([SAXPY_H100], "header")
    assert "__CUDA_ARCH__" not in single and "#define BLOCK 256\n" in single


def test_header_writes_values_as_their_defines_expand():
    header = export([STENCIL], "header")
    assert "#define REAL double\n" in header and "#define ALPHA 0.5\n" in header
    assert "#define NAME two words\n" in header


def test_a_param_with_a_newline_cannot_be_a_header_define():
    with pytest.raises(ValueError, match="BAD"):
        export([_best("t", "host", {"BAD": "a\nb"})], "header")


CC = shutil.which("cc")


def _check_c(tmp_path: Path, header: str, body: str, *defines: str) -> None:
    (tmp_path / "tuned.h").write_text(header)
    (tmp_path / "use.c").write_text(f'#include "tuned.h"\n#include "tuned.h"\n{body}\n')
    result = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", "-fsyntax-only", *defines,  # type: ignore[list-item]
                             str(tmp_path / "use.c")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")
@pytest.mark.parametrize(("defines", "block"), [((), 16), (("-D__CUDA_ARCH__=800",), 128),
                                                (("-D__CUDA_ARCH__=900",), 256)])
def test_header_compiles_and_picks_the_arch(tmp_path, defines, block):
    header = export(ALL, "header")
    body = (f"_Static_assert(BLOCK == {block}, \"BLOCK\");\n"
            "#ifdef REAL\n#error the defines of stencil-2d leaked into saxpy\n#endif")
    _check_c(tmp_path, header, body, "-DWARPFLEET_TARGET_SAXPY", *defines)


@pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")
def test_header_of_another_target_compiles_with_its_types(tmp_path):
    body = ("typedef REAL real_t;\n_Static_assert(sizeof(real_t) == sizeof(double), \"REAL\");\n"
            "static const double alpha = ALPHA;\n#ifdef BLOCK\n#error saxpy leaked\n#endif\n"
            "double use(void) { return alpha; }")
    _check_c(tmp_path, export(ALL, "header"), body, "-DWARPFLEET_TARGET_STENCIL_2D")


@pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")
def test_two_device_types_of_one_arch_do_not_redefine_macros(tmp_path):
    h200 = _best("saxpy", "sm_90", {"BLOCK": 512, "VEC": 8}, device="NVIDIA H200")
    header = export([SAXPY_H100, h200], "header")
    assert "unreachable" in header
    _check_c(tmp_path, header, '_Static_assert(BLOCK == 256, "the first sm_90 config wins");',
             "-D__CUDA_ARCH__=900")


def test_cmake_lists_each_archs_options_whole_and_its_defines():
    text = export(ALL, "cmake")
    assert 'set(WARPFLEET_SAXPY_SM_90_FLAGS "-Xptxas -O2" "--use_fast_math")' in text  # one option, one item
    assert 'set(WARPFLEET_SAXPY_SM_90_DEFINES "BLOCK=256" "VEC=4")' in text
    assert "set(WARPFLEET_SAXPY_SM_80_FLAGS)" in text  # the A100's winner changed no flag
    assert 'set(WARPFLEET_STENCIL_2D_HOST_DEFINES "REAL=double" "ALPHA=0.5" "NAME=two words")' in text
    assert "function(warpfleet_tuned cmake_target warpfleet_target arch)" in text
    h200 = _best("saxpy", "sm_90", {"BLOCK": 512, "VEC": 8}, device="NVIDIA H200")
    assert "# not used: an earlier configuration of saxpy has arch sm_90" in export([SAXPY_H100, h200], "cmake")


def test_cmake_refuses_a_value_that_would_split_a_list():
    with pytest.raises(ValueError, match="CMake list element"):
        export([_best("t", "host", {"BAD": "a;b"})], "cmake")


@pytest.mark.skipif(CC is None or shutil.which("cmake") is None, reason="needs cmake and a C compiler")
def test_cmake_snippet_builds_a_program_with_the_tuned_flags_and_defines(tmp_path):
    tuned = _best("3d-stencil", "host", {"TILE": 32, "NAME": "two words", "GREETING": '"hi $x"'},
                  {"opt_level": "-O2", "march": "", "link": "-Xlinker --no-undefined"}, device="AMD EPYC")
    (tmp_path / "warpfleet.cmake").write_text(export([tuned, SAXPY_H100], "cmake"))
    (tmp_path / "main.c").write_text(
        '#include <stdio.h>\n#define STR2(x) #x\n#define STR(x) STR2(x)\n'
        'int main(void) { printf("%d|%s|%s|%d\\n", TILE, STR(NAME), GREETING, __OPTIMIZE__); return 0; }\n')
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(t LANGUAGES C)\ninclude(warpfleet.cmake)\n"
        "add_executable(app main.c)\nwarpfleet_tuned(app 3d-stencil host)\n")
    build = tmp_path / "build"
    for argv in (["cmake", "-S", str(tmp_path), "-B", str(build)], ["cmake", "--build", str(build)]):
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
    output = subprocess.run([str(build / "app")], capture_output=True, text=True, check=True).stdout
    assert output == "32|two words|hi $x|1\n"  # __OPTIMIZE__: -O2 reached the compiler
