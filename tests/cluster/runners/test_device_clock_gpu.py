"""The device clock on a GPU (marked gpu): the cheats of tests/fixtures/device_clock/cheats.cu through
the process runner and the persistent host, each caught (timed work on a non-blocking stream, a
printed third: ``clock_mismatch``; outputs cached across runs: never found again; a first run's
warm-up with a liar's 1e-6 ms: ``metric_invalid``; the run directory's references: out of sight),
while the four kernels really overlapped on streams win, and the suite's hand-optimized programs
(multikernel's streams among them) pass against their baselines as a sweep's finals would judge them.

    pytest -m gpu -s tests/cluster/runners/test_device_clock_gpu.py
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import SandboxSpec, load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.measure import Baseline, Reference, measure_candidate
from cluster.runners._base import Invocation, ProcessRunner
from cluster.runners.device_clock import DeviceClock, build_library
from cluster.runners.persistent import PersistentRunner
from tests.conftest import REPO, gpu_present, needs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs an NVIDIA GPU"), needs("nvcc")]
FIXTURE = REPO / "tests" / "fixtures" / "device_clock" / "cheats.cu"
SUITE = ("multikernel", "conv2d", "matmul", "regpressure", "transpose", "unroll")


@pytest.fixture(scope="module")
def clock() -> DeviceClock:
    library, why = build_library()
    assert library is not None, why
    return DeviceClock(library)


@pytest.fixture(scope="module")
def device():
    from cluster.platform.devices import gpu_device
    return gpu_device(0, "test")


def _cheats(folder: Path, runner: str, ref_path: str = "/nonexistent"):
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE, folder / "cheats.cu")
    (folder / "ref_path.txt").write_text(ref_path + "\n")
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "name": "cheats", "toolchain": "nvcc", "sources": ["cheats.cu"], "files": ["ref_path.txt"], "runner": runner,
        "build": ["nvcc", "{flags}", "{defines}", "-arch={arch}", "-o", "{binary}", "{sources}"],
        "run": ["{binary}"], "verify": {"outputs": ["out.bin"]}, "params": {"MODE": [0, 1, 2, 3, 4, 5, 6]},
        "timeouts": {"build": 120, "run": 60}}))
    return load_target(folder / "target.yaml")


def _build(target, device, params: dict | None = None):
    from cluster.toolchains import get_toolchain
    values = {**target.baseline_params, **(params or {})}
    candidate = Candidate(target.name, "nvcc", device.device_type, get_toolchain("nvcc").arch_for(device),
                          target.bundle.hash, tuple(target.baseline_flags.items()), tuple(values.items()),
                          Phase.SEARCH, runner=target.runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return candidate, artifact


@pytest.fixture(scope="module")
def builds(tmp_path_factory, device):
    """Every build the tests measure, compiled at once (nvcc takes seconds a build): the cheats'
    seven modes for each runner, and the suite's programs with their hand-optimized versions."""
    jobs = []
    for kind in ("process", "persistent"):
        target = _cheats(tmp_path_factory.mktemp(kind) / "t", kind)
        jobs += [((kind, mode), target, {"MODE": mode}) for mode in range(7)]
    for name in SUITE:
        for version in ("target", "target_opt"):
            target = load_target(REPO / "configs" / "targets" / name / f"{version}.yaml")
            jobs.append(((name, version), target, {}))
    with ThreadPoolExecutor(16) as pool:
        done = pool.map(lambda job: (job[0], (job[1], *_build(job[1], device, job[2]))), jobs)
        return dict(done)


def _runner(kind: str, clock: DeviceClock | None, sandbox=None):
    return (PersistentRunner(sandbox, cuda=True, device_clock=clock) if kind == "persistent"
            else ProcessRunner(sandbox, device_clock=clock))


@pytest.mark.parametrize("kind", ["process", "persistent"])
def test_gpu_cheats_are_caught_and_real_overlap_wins(kind, clock, device, builds):
    target, *_ = builds[(kind, 0)]
    runner = _runner(kind, clock)
    try:
        base = measure_candidate(target, *builds[(kind, 0)][1:], device, None, 3, runner)
        assert base.status is Status.OK and base.clock.device_s, base.error_tail
        reference = Reference(base.outputs, base.clock)
        _, candidate, artifact = builds[(kind, 0)]
        found = {m: measure_candidate(target, *builds[(kind, m)][1:], device, reference, 3, runner,
                                      baseline=lambda: Baseline(target, candidate, artifact.binary))
                 for m in (1, 2, 3, 4, 6)}
    finally:
        runner.close()
    print(f"\n{kind}: baseline {statistics.median(base.samples):.4f} ms a sample, device busy "
          f"{1e3 * base.clock.device_s:.3f} ms a run")
    for mode, m in found.items():
        busy = f"{1e3 * m.clock.device_s:.3f} ms" if m.clock and m.clock.device_s else "-"
        print(f"{kind}: MODE {mode}: {m.status.value}, sample {statistics.median(m.samples or [0]):.4f} ms, "
              f"device busy {busy}; {m.error_tail[:160]!r}")
    # Events that time nothing read a few microseconds, or 0 (no time at all: invalid before any clock).
    assert found[1].status in (Status.CLOCK_MISMATCH, Status.METRIC_INVALID), found[1].error_tail
    assert found[1].status is Status.METRIC_INVALID or "device's own record" in found[1].error_tail
    assert found[2].status is Status.CLOCK_MISMATCH and "device's own record" in found[2].error_tail
    assert found[3].status is Status.OK and min(found[3].samples) > 0.5 * min(base.samples), found[3].samples
    assert found[4].status is Status.METRIC_INVALID, found[4].error_tail
    assert found[6].status is Status.OK, found[6].error_tail
    assert statistics.median(found[6].samples) < 0.7 * statistics.median(base.samples)


def test_the_references_in_the_run_directory_are_out_of_sight_on_a_gpu(device, builds):
    from cluster.sandbox.isolation import start_bubblewrap
    from cluster.sandbox.sandbox import SandboxError

    root = Path(tempfile.mkdtemp(prefix="warpfleet-runs-", dir="/var/tmp"))
    try:
        root.chmod(0o755)
        reference = root / "references" / "out.bin"
        reference.parent.mkdir(mode=0o755)
        reference.write_bytes(b"\0" * 16)
        reference.chmod(0o644)
        try:
            seeing = start_bubblewrap(SandboxSpec(), gpu=True)
            blind = start_bubblewrap(SandboxSpec(), gpu=True, out_of_sight=[root])
        except SandboxError as exc:
            pytest.skip(f"no sandbox here: {exc}")
        target, candidate, artifact = builds[("process", 5)]
        said = {}
        for name, sandbox in (("seeing", seeing), ("blind", blind)):
            with ProcessRunner(sandbox).stage(target, dict(candidate.params), candidate.arch, artifact.binary) as st:
                st.files.write("ref_path.txt", f"{reference}\n".encode())
                result = st.run(Invocation())
            assert result.ok, result.tail()
            said[name] = result.stdout.splitlines()[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert said == {"seeing": "READ", "blind": "HIDDEN"}


@pytest.mark.parametrize("name", SUITE)
def test_the_suites_hand_optimized_programs_pass_the_device_clock(name, clock, device, builds):
    """Each _opt program against its baseline: the baseline's one run as in the search, the
    program's three as in the finals, the baseline at hand to be run beside it."""
    plain, bc, ba = builds[(name, "target")]
    opt, oc, oa = builds[(name, "target_opt")]
    runners = {kind: _runner(kind, clock) for kind in {plain.runner, opt.runner}}
    try:
        base = measure_candidate(plain, bc, ba, device, None, 1, runners[plain.runner])
        assert base.status is Status.OK, base.error_tail
        reference = Reference(base.outputs, base.clock)
        won = measure_candidate(opt, oc, oa, device, reference, 3, runners[opt.runner],
                                baseline=lambda: Baseline(plain, bc, ba.binary))
    finally:
        for runner in runners.values():
            runner.close()
    speedup = statistics.median(base.samples) / statistics.median(won.samples) if won.samples else 0.0
    print(f"\n{name}: {won.status.value} {speedup:.2f}x, device busy {base.clock.device_s} s -> "
          f"{won.clock.device_s if won.clock else None} s ({plain.runner}); {won.error_tail[:200]!r}")
    assert won.status is Status.OK, won.error_tail
