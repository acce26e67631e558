"""Cheats that won sweeps, on C targets (tests/fixtures/attacks/): outputs cached across the runs of
a target without ``{seed}`` (in the scratch directory, in /tmp), a liar whose first run in a fresh
directory pays a warm-up that hid its lie under the wall clock's floor, metrics no clock can measure,
and the persistent host's two: a reply line written by the candidate, a process that outlives its
run to plant folders in later runs' directories. Each fails before the change it tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import MetricSpec, SandboxSpec, load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.clock import sample_floor_s
from cluster.measure.measure import Baseline, Reference, _cached, measure_candidate, metric_problem
from cluster.platform.devices import cpu_device
from cluster.runners._base import ProcessRunner
from cluster.runners.persistent import PersistentRunner
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.reaper import descendants
from cluster.sandbox.sandbox import SandboxError

ATTACKS = Path(__file__).parents[2] / "fixtures" / "attacks"


def _target(tmp_path: Path, source: str, runner: str = "process", params: dict | None = None):
    folder = tmp_path / source.removesuffix(".c")
    folder.mkdir(parents=True, exist_ok=True)
    for name in (source, "attack.h"):
        shutil.copy(ATTACKS / name, folder / name)
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "name": folder.name, "toolchain": "cc", "sources": [source], "files": ["attack.h"], "runner": runner,
        "run": ["{binary}"],
        "verify": {"outputs": ["out.bin"]}, "params": {"ATTACK": [0, 1, 2], **(params or {})},
        "timeouts": {"build": 60, "run": 20}}))
    return load_target(folder / "target.yaml")


def _built(target, **params):
    values = {**target.baseline_params, **params}
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), tuple(values.items()),
                          Phase.SEARCH, runner=target.runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return candidate, artifact


def _measure(target, runner, reference=None, runs=1, baseline=None, **params):
    candidate, artifact = _built(target, **params)
    return measure_candidate(target, candidate, artifact, cpu_device("w"), reference, runs, runner,
                             baseline=baseline)


def _bubblewrap():
    try:
        return start_bubblewrap(SandboxSpec(pids=64, memory_mb=1024))
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")


@pytest.mark.parametrize("runner", ["process", "persistent"])
def test_outputs_cached_across_runs_are_not_there_for_the_next_run(tmp_path, runner):
    target = _target(tmp_path, "cache_outputs.c", runner)
    sandbox = _bubblewrap()  # /tmp is the sandbox's own: a persistent host's is emptied after each candidate
    runs = ProcessRunner(sandbox) if runner == "process" else PersistentRunner(sandbox, cuda=False)
    try:
        baseline = _measure(target, runs, runs=1, ATTACK=0)
        reference = Reference(baseline.outputs, baseline.clock)
        found = {attack: _measure(target, runs, reference, runs=3, ATTACK=attack) for attack in (1, 2)}
    finally:
        runs.close()
    for attack, measured in found.items():
        assert measured.status is Status.OK, (attack, measured.error_tail)
        assert 0.001 not in measured.samples, (attack, measured.samples)  # every run did the work
        assert sorted(measured.samples) == sorted(baseline.samples * 3)


def test_a_liar_behind_a_first_run_warm_up_is_caught_in_the_finals_and_a_real_win_is_not(tmp_path):
    """Each fresh directory's first run pays 400 ms untimed; the liar does the baseline's 2 x 120 ms
    of work and prints a third of it. A quarter of the baseline's untimed time (100 ms) is a floor
    over half its claim (80 ms): the wall rule cannot judge it. The finals (3 runs or more) judge
    every claim on runs in turn with the baseline, where there is no device record: the liar fails
    there and the honest 3x candidate passes."""
    target = _target(tmp_path, "sweep_cheats.c", params={"ATTACK": [0, 1, 2, 3]})
    runner = ProcessRunner()
    base_candidate, base_artifact = _built(target, ATTACK=0)
    fetched = []

    def baseline() -> Baseline:
        fetched.append(1)
        return Baseline(target, base_candidate, base_artifact.binary)

    first = measure_candidate(target, base_candidate, base_artifact, cpu_device("w"), None, 1, runner)
    reference = Reference(first.outputs, first.clock)
    searched = _measure(target, runner, reference, runs=1, baseline=baseline, ATTACK=1)
    final = _measure(target, runner, reference, runs=3, baseline=baseline, ATTACK=1)
    honest = _measure(target, runner, reference, runs=3, baseline=baseline, ATTACK=3)
    assert searched.status is Status.OK  # one run cannot say: the search's claims are judged in the finals
    assert final.status is Status.CLOCK_MISMATCH and "judged again beside the baseline" in final.error_tail
    assert honest.status is Status.OK, honest.error_tail
    assert len(fetched) == 2  # every finalist's claim is judged in turn with the baseline, the honest one's too


@pytest.mark.parametrize("runner", ["process", "persistent"])
def test_the_finals_poison_reaches_the_program_and_a_reuse_that_hides_from_it_measures_its_work(tmp_path, runner):
    """sweep_cheats.c's ATTACK 4 reuses its output after the first sample unless WARPFLEET_POISON is
    set (the poisoned-outputs check's variable): 120x by its samples without it. The finals' runs
    (``poison``) all have it, in a process and in the persistent host alike (where a variable had
    sent the run to a process of its own): there it does the baseline's 120 ms a sample."""
    target = _target(tmp_path, "sweep_cheats.c", runner, params={"WARM_MS": [0]})
    runs = ProcessRunner() if runner == "process" else PersistentRunner(cuda=False)
    try:
        candidate, artifact = _built(target, ATTACK=4, WARM_MS=0)
        plain = measure_candidate(target, candidate, artifact, cpu_device("w"), None, 1, runs)
        poisoned = measure_candidate(target, candidate, artifact, cpu_device("w"), None, 2, runs, poison=True)
        assert plain.status is Status.OK and plain.stats.median == 1.0
        assert poisoned.status is Status.OK and poisoned.samples == (120.0,) * 4
        if runner == "persistent":
            assert runs.host.starts == 1  # the poisoned runs shared the host
    finally:
        runs.close()


def test_a_later_run_far_faster_than_the_first_on_the_same_inputs_is_a_cache():
    """``cache_check`` (a finalist's runs on a target without ``{seed}``): the runs' medians."""
    assert _cached([100.0, 1.0, 1.2], "minimize").startswith("cached_results: ")
    assert _cached([100.0, 90.0, 110.0], "minimize") is None  # a cold first run is not a cache
    assert _cached([1.0, 100.0, 90.0], "maximize").startswith("cached_results: ")  # a rate: higher is faster
    assert _cached([5.0], "minimize") is None
    # Seen on a loaded 2-core machine: an honest finalist's first run 4.5x its second, its search's
    # (a first run of its own, in a stage of its own) as fast as the later ones: load, not a cache.
    assert _cached([5.2, 1.16], "minimize", earlier=1.2) is None
    assert _cached([5.2, 1.16], "minimize", earlier=5.0).startswith("cached_results: ")
    assert _cached([1.0, 100.0, 90.0], "maximize", earlier=95.0) is None


def test_metrics_no_clock_can_measure_are_invalid():
    ms = MetricSpec(regex=r"t=(\S+)", unit="ms")
    cpu, gpu = sample_floor_s(False), sample_floor_s(True)
    assert "less than" in metric_problem([1e-300, 2.0], ms, cpu)  # under a picosecond: nothing is that fast
    assert metric_problem([1e-6], ms, cpu) is None  # a nanosecond: a per-item average, maybe
    assert "GPU work" in metric_problem([1e-6], ms, gpu)  # under a kernel launch
    assert metric_problem([0.002], ms, gpu) is None
    assert metric_problem([1e-300], MetricSpec(regex=r"t=(\S+)", unit="GB/s", goal="maximize")) is None


def _settled(root: int, wanted: int, seconds: float = 3.0) -> list[int]:
    """The processes below ``root`` once there are at most ``wanted``, or after ``seconds``: one still
    exiting on a loaded machine is not one that outlived its run (the planter's daemon lives 20 s)."""
    deadline = time.monotonic() + seconds
    while len(found := descendants(root)) > wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def _attack_in_the_host(tmp_path: Path, source: str, sandbox=None):
    """The baseline, the attack (ATTACK=1), then the baseline twice more, in one persistent host;
    and the processes below the host after the baseline and after the attack."""
    target = _target(tmp_path, source, "persistent")
    runner = PersistentRunner(sandbox, cuda=False)
    try:
        baseline = _measure(target, runner, runs=1, ATTACK=0)
        before = descendants(runner.host.proc.pid)
        reference = Reference(baseline.outputs, baseline.clock)
        attack = _measure(target, runner, reference, runs=1, ATTACK=1)
        left = _settled(runner.host.proc.pid, len(before)) if runner.host.proc else []
        after = _measure(target, runner, reference, runs=2, ATTACK=0)
    finally:
        runner.close()
    return baseline, attack, after, (len(before), len(left))


def test_a_reply_line_written_by_the_candidate_is_not_the_hosts(tmp_path):
    baseline, forged, after, _ = _attack_in_the_host(tmp_path, "reply_forge.c")
    assert forged.status is Status.CRASHED and "did not write" in forged.error_tail, forged.error_tail
    assert after.status is Status.OK and after.samples == baseline.samples * 2, after.error_tail


def test_a_process_a_run_started_ends_with_the_run(tmp_path):
    """The planter's daemon (a double fork and setsid) would plant out.bin folders in later runs'
    directories; in the host's sandbox (a PID namespace) it would be an orphan of the sandbox's init,
    below the host's bubblewrap: there must be nothing more there after it than before."""
    _, planted, after, (before, left) = _attack_in_the_host(tmp_path, "planter.c", _bubblewrap())
    assert planted.status is Status.OK, planted.error_tail
    assert left == before, f"{left - before} process(es) of the candidate outlived its run"
    assert after.status is Status.OK, after.error_tail


def test_the_reaper_ends_a_daemon_that_left_its_session():
    """A process that double-forks into a session of its own, below a subreaper: ``end_strays`` ends it."""
    script = ("import os, subprocess, time\n"
              "from cluster.sandbox.reaper import adopt_orphans, end_strays, descendants\n"
              "adopt_orphans()\n"
              "subprocess.run(['sh', '-c', 'setsid sh -c \"sleep 60 & exit 0\" & exit 0'])\n"
              "time.sleep(0.3)\n"
              "print(len(descendants(os.getpid())), end_strays(), len(descendants(os.getpid())))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[3])
    assert done.returncode == 0, done.stderr
    found, ended, left = map(int, done.stdout.split())
    assert found >= 1 and ended >= found and left == 0, done.stdout


def test_a_lie_on_a_real_saving_against_a_clock_of_heavier_load_is_judged_beside_the_baseline(tmp_path):
    """Seen on the 2-core machine at load 6-7 (the suite under two spinning processes): sweep_cheats.c's
    ATTACK 5, a real 2x (2 x 60 ms) printing a thousandth of it, won its finals, `ok`: the baseline's
    clock was taken under heavier load, its wall saved more than the whole claim, and against what
    seemed to remain of the baseline's time its claim passed REST. A saving seen beyond the claim says
    the clock is stale: the finals judge it on runs in turn, where the lie fails and the real 3x passes."""
    import dataclasses

    target = _target(tmp_path, "sweep_cheats.c", params={"ATTACK": [0, 3, 5], "WARM_MS": [0]})
    runner = ProcessRunner()
    base_candidate, base_artifact = _built(target, ATTACK=0, WARM_MS=0)

    def baseline() -> Baseline:
        return Baseline(target, base_candidate, base_artifact.binary)

    first = measure_candidate(target, base_candidate, base_artifact, cpu_device("w"), None, 3, runner)
    assert first.status is Status.OK, first.error_tail
    heavier = Reference(first.outputs, dataclasses.replace(first.clock, wall_s=first.clock.wall_s + 0.5))
    lie = _measure(target, runner, heavier, runs=3, baseline=baseline, ATTACK=5, WARM_MS=0)
    honest = _measure(target, runner, heavier, runs=3, baseline=baseline, ATTACK=3, WARM_MS=0)
    assert lie.status is Status.CLOCK_MISMATCH and "judged again beside the baseline" in lie.error_tail, lie.error_tail
    assert honest.status is Status.OK, honest.error_tail
