"""The platform seam: every registered platform is a whole ``Platform``, and a node gets the one whose
devices it has (NVIDIA's, the first registered, where it has none)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cluster.core import registry
from cluster.core.registry import PLATFORMS, Registry
from cluster.core.types import DeviceInfo
from cluster.platform import Platform, node_platform
from cluster.platform.nvidia import FakeNvmlSource, Nvidia


def test_every_registered_platform_implements_the_contract():
    for name in PLATFORMS:
        platform = PLATFORMS.load(name)()
        assert isinstance(platform, Platform) and platform.name == name
        assert platform.device_nodes and platform.profiler and platform.sanitizer and platform.query


def test_nvidias_commands_are_ncu_and_compute_sanitizer():
    nvidia = Nvidia()
    assert nvidia.profiler_prefix(["m1", "m2"], ["--launch-count", "1"])[:2] == ["ncu", "--csv"]
    assert nvidia.profiler_prefix(["m1", "m2"], ["--launch-count", "1"])[-4:] == ["--launch-count", "1", "--metrics",
                                                                                 "m1,m2"]
    assert nvidia.sanitizer_prefix("racecheck", 86)[:5] == ["compute-sanitizer", "--tool", "racecheck",
                                                            "--error-exitcode", "86"]


class Other(Platform):
    """A second vendor, present everywhere: what a port adds, one class and one registration."""

    name = "other"
    device_nodes = ("null",)
    visible_env = "OTHER_VISIBLE_DEVICES"
    profiler, sanitizer, query = "other-prof", "other-san", ("true",)

    def present(self) -> bool:
        return True

    def visible_gpu_count(self) -> int:
        return 1

    def describe(self, index: int) -> DeviceInfo:
        return DeviceInfo(kind="gpu", name="Other", arch="other_1")

    def telemetry(self, index: int) -> FakeNvmlSource:
        return FakeNvmlSource()

    def profiler_prefix(self, metrics: Sequence[str], launches: Sequence[str]) -> list[str]:
        return ["other-prof", *launches]

    def sanitizer_prefix(self, tool: str, error_exit: int) -> list[str]:
        return ["other-san", tool]


@pytest.fixture
def with_other(monkeypatch: pytest.MonkeyPatch):
    entries = {**dict(PLATFORMS), "other": f"{__name__}:Other"}
    monkeypatch.setattr(registry, "PLATFORMS", Registry("platform", entries))
    monkeypatch.setattr("cluster.platform.PLATFORMS", registry.PLATFORMS)
    node_platform.cache_clear()
    yield
    node_platform.cache_clear()


def test_a_node_gets_the_registered_platform_whose_devices_it_has(with_other):
    from cluster.measure.profile import ncu_prefix
    from cluster.platform.devices import gpu_device

    expected = "nvidia" if Nvidia().present() else "other"
    assert node_platform().name == expected
    if expected == "other":
        assert gpu_device(0, "w").arch == "other_1" and gpu_device(0, "w").worker_id == "w"
        assert ncu_prefix(["m"])[0] == "other-prof"
        assert node_platform().device_paths() == ("/dev/null",)


def test_the_sanitizer_checks_only_the_kernels_named_and_a_bounded_number_of_launches():
    nvidia = PLATFORMS.load("nvidia")()
    assert nvidia.sanitizer_filters(("mm", "scale"), 16) == ["--kernel-name", "kns=mm", "--kernel-name", "kns=scale",
                                                              "--launch-count", "16"]
    assert nvidia.sanitizer_filters((), None) == []
