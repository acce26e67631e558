"""Cc, and the registry that finds toolchains by name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cluster.core.placeholders import expand
from cluster.core.registry import TOOLCHAINS
from cluster.core.types import DeviceInfo, KernelResources
from cluster.toolchains import Cc, Nvcc, Toolchain, available_toolchains, get_toolchain, register

CPU = DeviceInfo(kind="cpu", name="AMD EPYC", arch="host")
GPU = DeviceInfo(kind="gpu", name="NVIDIA H100", arch="sm_90", compute_capability="9.0")


@pytest.mark.parametrize("device", [CPU, GPU])
def test_cc_builds_for_the_host_whatever_the_device(device: DeviceInfo) -> None:
    assert Cc().arch_for(device) == "host"


def test_cc_reports_no_kernels_even_for_a_ptxas_report() -> None:
    report = "ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Used 8 registers\n"
    assert Nvcc().parse_resources(report) == (KernelResources("k", "sm_90", registers=8),)
    assert Cc().parse_resources(report) == ()


@pytest.mark.skipif(shutil.which("cc") is None, reason="cc is not on PATH")
def test_ccs_default_build_makes_a_program_that_sees_its_defines(tmp_path: Path) -> None:
    source = tmp_path / "main.c"
    source.write_text('#include <math.h>\n#include <stdio.h>\nint main(void) { printf("%.0f", sqrt(N)); }\n')
    binary = tmp_path / "main"
    argv = expand(Cc.default_build, {
        "flags": ["-O2", *Cc.report_flags], "defines": ["-DN=49"], "binary": str(binary),
        "sources": [str(source)],
    })  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    assert subprocess.run([binary], capture_output=True, text=True, timeout=10).stdout == "7"


def test_the_registry_gives_an_instance_of_each_builtin_toolchain() -> None:
    assert {"cc", "nvcc"} <= set(available_toolchains())
    assert available_toolchains() == sorted(available_toolchains())
    cc, nvcc = get_toolchain("cc"), get_toolchain("nvcc")
    assert isinstance(cc, Cc) and cc.device_kind == "cpu"
    assert isinstance(nvcc, Nvcc) and nvcc.device_kind == "gpu"


def test_an_unknown_toolchain_is_a_key_error_naming_the_known_ones() -> None:
    with pytest.raises(KeyError) as raised:
        get_toolchain("foo")
    message = raised.value.args[0]
    assert message == f"unknown toolchain 'foo' (known: {', '.join(available_toolchains())})"
    assert "cc" in message and "nvcc" in message


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test vanish after it."""
    monkeypatch.setattr(TOOLCHAINS, "_entries", dict(TOOLCHAINS._entries))


class Clang(Toolchain):
    name = "clang"
    device_kind = "cpu"
    default_build = ("clang", "{flags}", "-o", "{binary}", "{sources}")

    def arch_for(self, device: DeviceInfo) -> str:
        return "host"

    def parse_resources(self, compiler_output: str) -> tuple[KernelResources, ...]:
        return ()


@pytest.mark.usefixtures("scratch_registry")
def test_a_registered_toolchain_can_be_got_by_name() -> None:
    assert register(Clang) is Clang
    register(Clang)  # again: harmless
    assert isinstance(get_toolchain("clang"), Clang)
    assert "clang" in available_toolchains()


@pytest.mark.usefixtures("scratch_registry")
def test_a_taken_name_or_a_non_toolchain_cannot_be_registered() -> None:
    class OtherCc(Clang):
        name = "cc"

    with pytest.raises(ValueError, match="'cc' is already taken"):
        register(OtherCc)
    with pytest.raises(TypeError):
        register(dict)  # type: ignore[arg-type]
    assert isinstance(get_toolchain("cc"), Cc)
