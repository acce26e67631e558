"""The device clock on a machine without a GPU: the union of recorded intervals, the record file's
parser, and the judgement end to end on programs that write the record the injection library would
(tests/fixtures/device_clock/recorded.c): work on a non-blocking stream and a printed third are
``clock_mismatch`` where the wall clock's floor is too high to judge them, streams that really
overlap win, a record begun and never ended is no way out, and a node without a device clock judges
by the wall clock alone."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import Candidate, Clock, DeviceRecord, Phase, Status
from cluster.measure.clock import device_problem
from cluster.measure.measure import Baseline, Reference, measure_candidate
from cluster.platform.devices import cpu_device
from cluster.runners._base import ProcessRunner
from cluster.runners.device_clock import RECORD_FILE, DeviceClock, busy_seconds, cupti_places, parse_record
from cluster.sandbox.untrusted_dir import UntrustedDir

FIXTURE = Path(__file__).parents[2] / "fixtures" / "device_clock" / "recorded.c"
MS = 1_000_000


def test_busy_time_is_the_union_of_the_intervals():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 10 * MS), (10 * MS, 20 * MS)]) == pytest.approx(0.020)  # back to back
    assert busy_seconds([(0, 10 * MS), (5 * MS, 15 * MS)]) == pytest.approx(0.015)  # overlapped: once
    assert busy_seconds([(0, 20 * MS), (5 * MS, 15 * MS)]) == pytest.approx(0.020)  # nested
    assert busy_seconds([(30 * MS, 31 * MS), (0, 1 * MS)]) == pytest.approx(0.002)  # out of order, a gap
    assert busy_seconds([(5, 5), (9, 3)]) == 0.0  # empty and reversed intervals count for nothing


def test_the_parser_reads_the_librarys_file_and_nothing_else():
    whole = parse_record("wf-device-record 1\nC 0 1000000\nK 1000000 11000000\nK 2000000 12000000\nend 3\n")
    assert whole == DeviceRecord(pytest.approx(0.012), 3, complete=True, kernel_s=pytest.approx(0.011),
                                 span_s=pytest.approx(0.011))
    gaps = parse_record("wf-device-record 1\nK 0 1000000\nC 1000000 9000000\nK 4000000 5000000\nend 3\n")
    assert gaps.kernel_s == pytest.approx(0.002) and gaps.span_s == pytest.approx(0.005)  # the idle gap counts
    assert parse_record("wf-device-record 1\nC 0 1000\nend 1\n").span_s is None  # no kernel: no span
    begun = parse_record("wf-device-record 1\nK 0 1000\n")
    assert begun.complete is False and begun.records == 1
    for text in ("", "K 0 1\nend 1\n", "wf-device-record 1\nK 0\nend 1\n", "wf-device-record 1\nK 0 1\nend 2\n",
                 "wf-device-record 1\nend 0\nK 0 1\n", "wf-device-record 1\nX 0 1\nend 1\n"):
        with pytest.raises(ValueError):
            parse_record(text)


def test_the_worker_reads_the_record_never_through_a_link(tmp_path):
    (tmp_path / "secret").write_text("wf-device-record 1\nend 0\n")
    with UntrustedDir(tmp_path) as files:
        assert DeviceClock.read(files) is None  # no record: the run never initialised CUDA
        (tmp_path / RECORD_FILE).symlink_to(tmp_path / "secret")
        assert DeviceClock.read(files) == DeviceRecord(0.0, 0, complete=False)
        DeviceClock.forget(files)
        assert not (tmp_path / RECORD_FILE).is_symlink()
        (tmp_path / RECORD_FILE).write_text("not the library's\n")
        assert DeviceClock.read(files).complete is False


def test_the_judgement_on_recorded_intervals():
    # A baseline busy 41 ms a run (a copy, 4 kernels one after another), its samples 40 ms.
    baseline = Clock(claimed_s=0.040, wall_s=0.5, device_s=0.041)
    overlapped = Clock(claimed_s=0.0115, wall_s=0.48, device_s=0.0125)  # the 4 kernels on 4 streams
    off_stream = Clock(claimed_s=0.000008, wall_s=0.5, device_s=0.041)  # its events time nothing
    a_third = Clock(claimed_s=0.0133, wall_s=0.5, device_s=0.041)
    small = Clock(claimed_s=0.0399, wall_s=0.5, device_s=0.041)  # 0.1 ms claimed: under the noise
    assert device_problem(overlapped, baseline) is None
    assert "device's own record" in device_problem(off_stream, baseline)
    assert device_problem(a_third, baseline) is not None
    assert device_problem(small, baseline) is None
    assert device_problem(Clock(0.0, 0.5), baseline) is None  # no record on one side: the wall clock judges
    assert device_problem(off_stream, Clock(0.040, 0.5)) is None


def test_a_kernels_saving_that_the_copies_noise_hides_shows_in_the_kernels_time():
    """Seen on an H200 (softmax_rows, 2026-11-29): a run busy 17.1 ms, mostly pageable copies of its
    inputs that vary by 1.5 ms run to run; an honest block size saving 1.2 ms of kernel time was
    failed on the whole busy time (18.6 ms against 17.1). The kernels' own busy time shows it; the
    cheats save nothing there either (their kernels still run)."""
    baseline = Clock(claimed_s=0.00156, wall_s=0.9, device_s=0.0171, kernel_s=0.0017)
    honest = Clock(claimed_s=0.00036, wall_s=0.9, device_s=0.0186, kernel_s=0.0005)
    off_stream = Clock(claimed_s=0.000008, wall_s=0.9, device_s=0.0186, kernel_s=0.0017)
    a_third = Clock(claimed_s=0.00052, wall_s=0.9, device_s=0.0174, kernel_s=0.00171)
    assert device_problem(honest, baseline) is None
    assert device_problem(off_stream, baseline) is not None and device_problem(a_third, baseline) is not None
    assert device_problem(honest, Clock(0.00156, 0.9, device_s=0.0171)) is not None  # the whole time alone


def test_a_saving_of_the_idle_gaps_between_launches_shows_in_the_kernels_span_beyond_its_noise():
    """Seen on an H200 (rodinia_nw, 2026-11-29): its larger blocks make 2-4x fewer launches of
    larger kernels; their events, around hundreds of launches a sample, saved 2.8 ms a run of the
    GPU's idle gaps while the kernels' busy time grew. The kernels' span (first start to last end)
    shows it; the cheats' span does not shrink (their kernels still run, one after another), and a
    span stretched by host work between kernels (its spread) judges nothing: the noise is added to
    what must show."""
    baseline = Clock(claimed_s=0.0304, wall_s=0.9, device_s=0.0384, kernel_s=0.0320, span_s=0.0360,
                     span_spread_s=0.0005)
    fewer_launches = Clock(claimed_s=0.0276, wall_s=0.9, device_s=0.0417, kernel_s=0.0345, span_s=0.0332,
                           span_spread_s=0.0005)
    off_stream = Clock(claimed_s=0.0276, wall_s=0.9, device_s=0.0384, kernel_s=0.0320, span_s=0.0360)
    noise_only = Clock(claimed_s=0.0276, wall_s=0.9, device_s=0.0384, kernel_s=0.0320, span_s=0.0355)
    assert device_problem(fewer_launches, baseline) is None
    assert device_problem(off_stream, baseline) is not None and device_problem(noise_only, baseline) is not None
    assert device_problem(dataclasses.replace(fewer_launches, span_s=None), baseline) is not None  # before
    host_work = dataclasses.replace(baseline, span_spread_s=0.004)  # host work between the kernels
    assert device_problem(fewer_launches, host_work) is not None
    # 100 samples of a 5 us kernel, the host's wait after each 20 us: moved to a stream the events do
    # not wait on, its kernels run back to back; its samples claim 0.5 ms less a run (1 us each, at
    # the floor), its timeline is 2 ms shorter, all of it the host's waits: not the claim's saving.
    tiny = Clock(claimed_s=0.0006, wall_s=0.3, device_s=0.0005, kernel_s=0.0005, span_s=0.0025)
    moved = Clock(claimed_s=0.0001, wall_s=0.3, device_s=0.0005, kernel_s=0.0005, span_s=0.0005)
    assert device_problem(moved, tiny) is not None


def test_a_harness_that_samples_for_a_fixed_time_is_judged_sample_for_sample_where_the_launches_agree():
    """Seen on an H200 (pb_fdtd2d, 2026-11-29, scripts/device_record.py): its harness samples for two
    seconds, 93-119 samples a run of 1,500 launches each, so every run's samples add up to about 2 s
    and its busy time follows the count (the baseline 274-310 ms a run). An honest restrict variant
    (109 samples to the baseline's 98) claimed 15.7 ms a run and was busier by 30 ms: failed on the
    totals. The baseline scaled to the candidate's count (the same records a sample) bears it out
    in the kernels' span; liars that print a third, whatever their count, do not pass."""
    from cluster.measure.clock import per_sample

    baseline = Clock(claimed_s=2.0077, wall_s=2.79, device_s=0.2739, kernel_s=0.2733, span_s=2.0371,
                     samples=98, records=148904)
    restrict = Clock(claimed_s=1.9920, wall_s=2.84, device_s=0.3042, kernel_s=0.3036, span_s=2.0207,
                     samples=109, records=165448)
    assert device_problem(dataclasses.replace(restrict, samples=None), baseline) is not None  # totals alone
    assert device_problem(restrict, baseline) is None
    scaled = per_sample(restrict, baseline)
    assert scaled.samples == 109 and abs(scaled.claimed_s - 2.0077 * 109 / 98) < 1e-9
    # A printed third, the baseline's count: nothing to scale, judged on the totals.
    third = dataclasses.replace(baseline, claimed_s=baseline.claimed_s / 3)
    assert per_sample(third, baseline) is None and device_problem(third, baseline) is not None
    # A third over more samples of the same work: fewer records a sample, judged on the totals.
    more = dataclasses.replace(third, samples=109)
    assert per_sample(more, baseline) is None and device_problem(more, baseline) is not None
    # A third over 109 samples of real work (the records agree): its span saves nothing a sample.
    worked = dataclasses.replace(restrict, claimed_s=0.70, span_s=2.0371 * 109 / 98)
    assert per_sample(worked, baseline) is not None and device_problem(worked, baseline) is not None


def test_cupti_is_found_in_a_toolkit_and_in_nvidias_pip_packages(tmp_path):
    toolkit, wheel = tmp_path / "cuda", tmp_path / "site" / "nvidia" / "cu13"
    for folder, header in ((toolkit / "include", "cuda.h"), (toolkit / "extras/CUPTI/include", "cupti.h"),
                           (wheel / "include", "cupti.h")):
        folder.mkdir(parents=True)
        (folder / header).write_text("")
    (toolkit / "extras/CUPTI/lib64").mkdir(parents=True)
    (toolkit / "extras/CUPTI/lib64/libcupti.so.13").write_bytes(b"")
    includes, library = cupti_places([toolkit])
    assert set(includes) == {toolkit / "include", toolkit / "extras/CUPTI/include"}
    assert library == toolkit / "extras/CUPTI/lib64/libcupti.so.13"
    (wheel / "lib").mkdir(parents=True)
    (wheel / "lib/libcupti.so.13").write_bytes(b"")
    assert cupti_places([wheel]) == ([wheel / "include"], None)  # cupti.h without cuda.h: cannot build
    assert cupti_places([wheel, toolkit])[1] == wheel / "lib/libcupti.so.13"


def _target(tmp_path: Path):
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / "recorded.c")
    (folder / "space.yaml").write_text("name: one\ntoolchain: cc\nflags: {opt_level: ['-O1']}\n")
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "name": "recorded", "toolchain": "cc", "sources": ["recorded.c"], "space": "space.yaml", "runner": "process",
        "run": ["{binary}"], "verify": {"outputs": ["out.bin"]}, "params": {"MODE": [0, 1, 2, 3, 4, 5]},
        "timeouts": {"build": 60, "run": 30}}))
    return load_target(folder / "target.yaml")


def _built(target, mode: int):
    params = {**target.baseline_params, "MODE": mode}
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (("opt_level", "-O1"),),
                          tuple(params.items()), Phase.SEARCH, runner=target.runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return candidate, artifact


def _measure(target, runner, mode: int, reference: Reference | None, runs: int = 1, beside: bool = False):
    candidate, artifact = _built(target, mode)
    baseline = None
    if beside:
        base_candidate, base_artifact = _built(target, 0)
        baseline = lambda: Baseline(target, base_candidate, base_artifact.binary)  # noqa: E731
    return measure_candidate(target, candidate, artifact, cpu_device("w"), reference, runs, runner,
                             baseline=baseline)


def test_claims_the_device_record_does_not_bear_out_are_clock_mismatch(tmp_path):
    target = _target(tmp_path)
    # The library's path matters to a CUDA driver only: these programs write their record themselves.
    runner = ProcessRunner(device_clock=DeviceClock(tmp_path / "libwf_device_clock.so"))
    baseline = _measure(target, runner, 0, None, runs=3)
    assert baseline.status is Status.OK and baseline.clock.device_s == pytest.approx(0.041), baseline.error_tail
    reference = Reference(baseline.outputs, baseline.clock)
    found = {mode: _measure(target, runner, mode, reference) for mode in (1, 2, 3, 4)}
    assert found[1].status is Status.OK, found[1].error_tail  # real overlap: the union shrank
    # The samples a run printed and the records it made (a copy, four kernels): ``clock.per_sample``.
    assert (baseline.clock.samples, baseline.clock.records, found[1].clock.samples) == (4, 5, 1)
    for mode in (2, 3):
        assert found[mode].status is Status.CLOCK_MISMATCH, (mode, found[mode].error_tail)
        assert "device's own record" in found[mode].error_tail
    assert found[4].status is Status.CLOCK_MISMATCH and "never ended" in found[4].error_tail
    # Without a device clock (a CPU node, a GPU node without CUPTI) the wall clock judges alone, and
    # its floor (a quarter of the 100 ms setup) is too high for these kernel-scale claims.
    bare = ProcessRunner()
    unclocked = Reference(baseline.outputs, Clock(baseline.clock.claimed_s, baseline.clock.wall_s))
    assert _measure(target, bare, 2, unclocked).status is Status.OK


def test_a_claim_the_busy_time_misses_goes_to_runs_in_turn_only_where_it_is_large(tmp_path):
    """A program bound by its launches saves the GPU's idle gaps between them: its timer sees it, the
    busy time does not (on an H200, honest flags saving 44-115 ms a run of a sorting network's 66
    launches were failed on the record). A claim over ``WALL_JUDGES_S`` a run is judged again on runs
    in turn with the baseline; smaller ones, the lies of this fixture (40 ms and 27 ms) and its
    honest 20 ms of gaps alike, are failed on the record: the wall's noise under load let such lies
    through runs in turn."""
    from cluster.measure.clock import WALL_JUDGES_S, wall_judges

    baseline = Clock(claimed_s=0.420, wall_s=1.5, device_s=0.39)
    assert wall_judges(Clock(claimed_s=0.376, wall_s=1.45, device_s=0.389), baseline)  # 44 ms claimed
    assert not wall_judges(Clock(claimed_s=0.420 - WALL_JUDGES_S, wall_s=1.5, device_s=0.39), baseline)
    target = _target(tmp_path)
    runner = ProcessRunner(device_clock=DeviceClock(tmp_path / "libwf_device_clock.so"))
    measured = _measure(target, runner, 0, None, runs=3)
    reference = Reference(measured.outputs, measured.clock)
    for mode in (2, 3, 5):
        found = _measure(target, runner, mode, reference, beside=True)
        assert found.status is Status.CLOCK_MISMATCH and "judged again" not in found.error_tail, found.error_tail


def test_the_kernel_runner_takes_no_device_clock_its_samples_are_its_own_events(tmp_path):
    from cluster.runners.kernel import KernelRunner
    from cluster.runners.persistent import PersistentRunner

    clock = DeviceClock(tmp_path / "libwf_device_clock.so")
    kernel, persistent = KernelRunner(cuda=False, device_clock=clock), PersistentRunner(cuda=False, device_clock=clock)
    try:
        assert kernel.device_clock is None and kernel.host.env == {}
        assert persistent.device_clock is clock and persistent.host.env == clock.host_env()
    finally:
        kernel.close()
        persistent.close()
