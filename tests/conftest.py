"""Shared fixtures: a tiny C target written on the fly, and one Ray instance per test session."""

from __future__ import annotations

import gc
import inspect
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent

# bubblewrap where scripts/test.sh unpacks it when the system has none: in the virtual environment.
_BWRAP_DIR = Path(sys.prefix) / "bubblewrap" / "usr" / "bin"
if shutil.which("bwrap") is None and (_BWRAP_DIR / "bwrap").is_file():
    os.environ["PATH"] = f"{_BWRAP_DIR}{os.pathsep}{os.environ.get('PATH', '')}"

TINY_C = r"""
#include <stdio.h>
#ifndef N
#define N 1000
#endif
int main(void) {
    FILE *f = fopen("out.bin", "wb");
    float v[4] = {1.0f, 2.0f, 3.0f, (float)N};
    fwrite(v, sizeof v, 1, f);
    fclose(f);
    for (int i = 0; i < 3; i++) printf("@warpfleet time_ms=%d.5\n", i + 1);
    return 0;
}
"""


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


_LOGGED: list[_Lines] = []


def logged_lines() -> list[str]:
    """Every line warpfleet logs from now until the test ends (what the CLI prints on stderr), in order."""
    lines: list[str] = []
    logger = logging.getLogger("warpfleet")
    if not _LOGGED:
        _LOGGED_LEVEL[:] = [logger.level]
    logger.setLevel(logging.INFO)
    handler = _Lines(lines)
    logger.addHandler(handler)
    _LOGGED.append(handler)
    return lines


_LOGGED_LEVEL: list[int] = []


@pytest.fixture(autouse=True)
def _logged_lines_end_with_the_test() -> Iterator[None]:
    yield
    logger = logging.getLogger("warpfleet")
    for handler in _LOGGED:
        logger.removeHandler(handler)
    if _LOGGED:
        logger.setLevel(_LOGGED_LEVEL[0])
    _LOGGED.clear()


def write_target(folder: Path, **fields: Any) -> Path:
    """A valid cc target in ``folder``; ``fields`` replace or add top-level fields."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.c").write_text(TINY_C)
    spec: dict[str, Any] = {
        "name": "tiny", "toolchain": "cc", "sources": ["tiny.c"], "run": ["{binary}"],
        "verify": {"outputs": ["out.bin"]}, "params": {"N": [1000, 2000]},
    }
    spec.update(fields)
    path = folder / "target.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_config(folder: Path, target_files: list[str], **fields: Any) -> Path:
    spec: dict[str, Any] = {"name": "t", "targets": target_files, "output_dir": str(folder / "runs")}
    spec.update(fields)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def init_local_ray() -> None:
    """The tests' local Ray instance, if none is up: a CPU for each GPU's measuring actor and two
    for compiles (with two CPUs in all, a sweep on a host of four GPUs refused to start: "4
    measuring workers leave none of the cluster's 2 CPUs")."""
    import ray

    from cluster.platform.devices import visible_gpu_count

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2 + visible_gpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)


# Fixtures that start a Ray instance of their own (shutting the shared one down): unsandboxed workers,
# more CPUs, several nodes. Tests marked own_ray do the same by themselves.
OWN_RAY_FIXTURES = frozenset({"ray_unsandboxed", "four_cpus", "two_gpu_nodes", "one_fake_gpu"})


def _own_ray(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))
    return bool(OWN_RAY_FIXTURES & fixtures) or item.get_closest_marker("own_ray") is not None


def _group(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return None
    return marker.args[0] if marker.args else marker.kwargs.get("name")


def _shared_fixture(item: pytest.Item) -> str | None:
    """The module- or session-scoped fixture of this suite's own that ``item`` uses (a sweep, a set
    of builds), named for its one instance: a session's by its name, a module's by the module."""
    info = getattr(item, "_fixtureinfo", None)
    for name in info.names_closure if info else ():
        fixturedef = (info.name2fixturedefs.get(name) or [None])[-1]
        if fixturedef is None or fixturedef.scope == "function":
            continue
        source = inspect.getsourcefile(fixturedef.func)
        if source and Path(source).resolve().is_relative_to(REPO / "tests"):
            return name if fixturedef.scope == "session" else item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that start a Ray instance of their own run together (in their order), so that the
    shared one (ray_local) starts once: after each of them the next test started it again, seconds
    each. Under pytest-xdist (scripts/test.sh with WF_TEST_WORKERS: ``--dist loadgroup``) they are one group, run by
    one worker, each worker having a shared instance of its own; the groups go first, the longest
    work of the suite (the program suites' builds, the own instances' sweeps), so that the many
    short tests fill the end on every worker. Those that use ray_unsandboxed go first among them, one
    after another, and share its instance.

    The tests that share a module- or session-scoped fixture (a sweep, a set of builds) are a group
    too, after those: spread over the workers, each worker set the fixture up (the suite targets'
    builds, the attacks' sweep and the portability runs were each made twice)."""
    for item in items:
        if _own_ray(item):
            item.add_marker(pytest.mark.xdist_group("own_ray"))
        elif _group(item) is None and (shared := _shared_fixture(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(f"shared:{shared}"))
    first = {"nvcc_builds": 0, "own_ray": 1}
    items.sort(key=lambda item: (3 if (group := _group(item)) is None else first.get(group, 2),
                                 "ray_unsandboxed" not in getattr(item, "fixturenames", ())))  # stable


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--dist loadgroup`` pytest-xdist marks each grouped test's id with its group; pytest 9.2
    ignores the mark of pytest-xdist 3.8 and older (pytest-dev/pytest-xdist#1386) and the groups are
    spread over the workers: each worker then builds every program suite's baselines, and the
    own-Ray tests run at once. Stop in one line (the test extra pins a pytest that works)."""
    if config.getoption("dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    import xdist

    xdist_version = tuple(int(part) for part in xdist.__version__.split(".")[:2] if part.isdigit())
    if pytest.version_tuple[:2] >= (9, 2) and xdist_version <= (3, 8):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} loses --dist loadgroup's groups "
            "(pytest-dev/pytest-xdist#1386): pip install -e '.[test]' installs a pytest that keeps them")


@pytest.fixture
def ray_local() -> Iterator[None]:
    """A local Ray instance, started once and shared (a start costs seconds); the tests that start one
    of their own shut it down, and run together (pytest_collection_modifyitems)."""
    init_local_ray()
    yield


@pytest.fixture
def ray_address(ray_local: None) -> str:
    """The shared instance's address, for a ``warpfleet sweep`` in a process of its own to join
    (``RAY_ADDRESS`` or ``--address``: a sweep on a cluster that is up already, a path users take)
    rather than start a Ray of its own: that start cost 5 CPU-seconds more a sweep (12.6 against 7.5
    for test_secrets' sweep, 2026-11-29). A test of the default path, a sweep that starts its own
    local Ray, leaves the variable unset (test_secrets, test_attacks, the SIGTERM test)."""
    import ray

    gc.collect()  # an earlier in-process sweep's measuring actors hold CPUs until their handles are freed
    return ray.get_runtime_context().gcs_address


_NEXT_TEST: list[pytest.Item | None] = [None]
_UNSANDBOXED_UP: list[bool] = []  # the Ray instance up now is ray_unsandboxed's


@pytest.hookimpl(tryfirst=True)  # before the fixtures' teardown, which reads it
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _NEXT_TEST[0] = nextitem


@pytest.fixture
def ray_unsandboxed() -> Iterator[None]:
    """A local Ray instance whose workers run candidates without the sandbox (``--unsandboxed``):
    for the tests of what only an unsandboxed candidate can do (kill its worker). Ray is started
    afresh and shut down after the last of the tests in a row that use it (they run one after
    another: pytest_collection_modifyitems), so that the next test's workers get the default sandbox."""
    import ray

    from cluster.sandbox.isolation import ENV_POLICY, Policy

    previous = os.environ.get(ENV_POLICY)
    os.environ[ENV_POLICY] = Policy("off").encode()
    try:
        if not _UNSANDBOXED_UP:
            ray.shutdown()
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            _UNSANDBOXED_UP.append(True)
        yield
    finally:
        following = _NEXT_TEST[0]
        if following is None or "ray_unsandboxed" not in getattr(following, "fixturenames", ()):
            ray.shutdown()
            _UNSANDBOXED_UP.clear()
        if previous is None:
            os.environ.pop(ENV_POLICY, None)
        else:
            os.environ[ENV_POLICY] = previous


def needs(tool: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not on PATH")


def repo_pythonpath(*first: str) -> str:
    """PYTHONPATH for a warpfleet subprocess: ``first``, this checkout, then the caller's own
    PYTHONPATH (where the dependencies may live: a GPU machine's unpacked site-packages)."""
    return os.pathsep.join([*first, str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])


def gpu_present() -> bool:
    """An NVIDIA GPU answers NVML and nvcc is on PATH: the GPU tests can run."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0 and shutil.which("nvcc") is not None
    except Exception:
        return False


@pytest.fixture(scope="session")
def portability_cpu_runs(tmp_path_factory):
    """Two real sweeps of the C stencil with different flags spaces (one relabelled as another
    machine's) and an evaluation here of both winners: tests/cluster/portability_runs.py."""
    from tests.cluster.outputs.portability_runs import cpu_runs

    init_local_ray()
    return cpu_runs(tmp_path_factory.mktemp("portability_cpu"))


@pytest.fixture(scope="session")
def portability_gpu_runs(tmp_path_factory):
    """H100 and H200 sweeps and an evaluation, written from given measurements."""
    from tests.cluster.outputs.portability_runs import gpu_runs

    return gpu_runs(tmp_path_factory.mktemp("portability_gpu"))
