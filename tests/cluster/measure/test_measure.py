"""Metric parsing and verification against the baseline's outputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cluster.compile.build import compile_candidate
from cluster.config import MetricSpec, VerifySpec, load_target
from cluster.core.types import Candidate, DeviceInfo, Phase, RunOutputs, Status
from cluster.measure.measure import Reference, measure_candidate, parse_samples, verify_outputs
from tests.conftest import needs, write_target


def test_line_protocol_takes_every_sample_of_the_named_metric():
    out = "hello\n@warpfleet time_ms=1.5 energy_j=3\n@warpfleet time_ms=2e-1\n@warpfleet  time_ms=x\nnoise\n"
    assert parse_samples(out, MetricSpec()) == [1.5, 0.2]
    assert parse_samples(out, MetricSpec(name="energy_j")) == [3.0]
    assert parse_samples("time_ms=1.5 (protocol lines only)", MetricSpec()) == []


def test_regex_metric_takes_every_match():
    assert parse_samples("GFLOPS: 10.5\nGFLOPS: 11\n", MetricSpec(regex=r"GFLOPS: ([0-9.]+)")) == [10.5, 11.0]


def test_text_outputs_and_stdout_numbers(tmp_path):
    (tmp_path / "res.txt").write_text("1.0 2.0\n3.0\n")
    verify = VerifySpec(outputs=["res.txt"], stdout_regex=r"checksum=([0-9.]+)", rtol=1e-3)
    reference = RunOutputs((("res.txt", b"1.0 2.0 3.0001"),), (42.0,))
    assert verify_outputs(tmp_path, "checksum=42.0", verify, reference) is None
    assert "stdout" in verify_outputs(tmp_path, "checksum=41.0", verify, reference)
    (tmp_path / "res.txt").write_text("1.0 2.0\n3.5\n")
    assert "res.txt: 1 of 3" in verify_outputs(tmp_path, "checksum=42.0", verify, reference)
    (tmp_path / "res.txt").unlink()
    assert verify_outputs(tmp_path, "", verify, reference) == "res.txt: not written"


@needs("cc")
@pytest.mark.parametrize(("test_cmd", "status"), [(["true"], Status.OK), (["false"], Status.TEST_FAILED),
                                                  (["test", "-s", "out.bin"], Status.OK)])
def test_user_test_command_runs_in_the_candidate_directory(tmp_path, test_cmd, status):
    target = load_target(write_target(tmp_path, verify={"outputs": ["out.bin"], "test": test_cmd}))
    candidate = Candidate("tiny", "cc", "cpu", "host", target.bundle.hash, (("opt_level", "-O1"),),
                          (("N", 1000),), Phase.BASELINE)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK and artifact.binary and artifact.binary_hash
    device = DeviceInfo("cpu", "test cpu", "host")
    baseline = measure_candidate(target, candidate, artifact, device, None, runs=2)
    assert baseline.status is status
    if status is Status.OK:
        assert baseline.samples == (1.5, 2.5, 3.5, 1.5, 2.5, 3.5)
        assert len(baseline.outputs) == 1  # no {seed} in the run: one reference serves every run
        assert dict(baseline.outputs[0].files)["out.bin"] == np.array([1, 2, 3, 1000], np.float32).tobytes()
        # A candidate with another N writes another last value: it fails against the baseline.
        other = dataclasses.replace(candidate, params=(("N", 2000),), phase=Phase.SEARCH)
        result = measure_candidate(target, other, compile_candidate(target, other), device,
                                   Reference(baseline.outputs), runs=1)
        assert result.status is Status.VERIFY_FAILED and "index 3" in result.error_tail


SEEDED_C = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int seed = atoi(argv[1]);
#ifdef CACHED
    seed = 0;  /* a cheat: replays the outputs of its first run */
#endif
    float v[2] = {(float)seed, 2.0f * seed};
    FILE *f = fopen("out.bin", "wb");
    fwrite(v, sizeof v, 1, f);
    fclose(f);
    printf("@warpfleet time_ms=1\n");
    return 0;
}
"""


@needs("cc")
def test_each_run_gets_its_own_seed_so_cached_outputs_fail(tmp_path):
    path = write_target(tmp_path, run=["{binary}", "{seed}"], params={"CACHED": [0, 1]})
    (tmp_path / "tiny.c").write_text(SEEDED_C.replace("#ifdef CACHED", "#if CACHED"))
    target = load_target(path)
    device = DeviceInfo("cpu", "test cpu", "host")

    def candidate(cached: int) -> Candidate:
        return Candidate("tiny", "cc", "cpu", "host", target.bundle.hash, (), (("CACHED", cached),))

    honest, cheat = candidate(0), candidate(1)
    baseline = measure_candidate(target, honest, compile_candidate(target, honest), device, None, runs=3)
    assert baseline.status is Status.OK and len(baseline.outputs) == 3
    reference = Reference(baseline.outputs)
    assert measure_candidate(target, honest, compile_candidate(target, honest), device, reference, 4).status \
        is Status.OK
    result = measure_candidate(target, cheat, compile_candidate(target, cheat), device, reference, 3)
    assert result.status is Status.VERIFY_FAILED and "out.bin" in result.error_tail


RACED_C = r"""
#include <stdio.h>
int main(void) {
    float v[1] = {1.0f};
    FILE *f = fopen("out.bin", "wb");
    fwrite(v, sizeof v, 1, f);
    fclose(f);
    for (int i = 0; i < 10; ++i) printf("@warpfleet time_ms=3\n");
    printf("@warpfleet samples=10 median_ms=3 noise=0 converged=0 raced=1 region_start_unix=1 region_end_unix=2\n");
    return 0;
}
"""


@needs("cc")
def test_the_race_bound_reaches_the_runner_and_a_raced_run_is_marked(tmp_path):
    from cluster.runners._base import ProcessRunner
    from cluster.store.results import make_row

    bounds: list[float | None] = []

    class Recording(ProcessRunner):
        def execute(self, staged, invocation):
            bounds.append(invocation.stop_above)
            return super().execute(staged, invocation)

    path = write_target(tmp_path, params={})
    (tmp_path / "tiny.c").write_text(RACED_C)
    target = load_target(path)
    candidate = Candidate("tiny", "cc", "cpu", "host", target.bundle.hash, (), (), Phase.SEARCH)
    artifact = compile_candidate(target, candidate)
    device = DeviceInfo("cpu", "test cpu", "host")
    runner = Recording()
    result = measure_candidate(target, candidate, artifact, device, None, 2, runner, stop_above=2.5)
    assert result.status is Status.OK and result.raced and bounds == [2.5, 2.5]
    row = make_row("r", candidate, artifact, result, 1.0, "minimize")
    assert row.raced is True and row.n_samples == 20
    assert make_row("r", candidate, artifact, None, 1.0, "minimize").raced is None
