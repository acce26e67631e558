"""The expensive tier's bounds (cluster.engine.verification.checks): compute-sanitizer on the kernels a
variant changed, every kernel where it changed anything else."""

from __future__ import annotations

from agents._base import Proposal
from agents.patch import source_files, variant_target
from cluster.config import load_target
from cluster.core.types import Status
from cluster.engine.verification.checks import changed_kernels
from tests.conftest import REPO

SOURCE = """
__global__ void scale(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] *= 2.0f; }
__global__ void shift(float* x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1.0f; }
int main() { return 0; }
"""


def variant(original, text: str):
    return variant_target(original, Proposal("t", "t", (("saxpy.cu", text),)))


def test_the_kernels_a_variant_changed_and_every_kernel_where_it_changed_host_code():
    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    base = variant(target, SOURCE)
    assert source_files(base)["saxpy.cu"] == SOURCE
    body_only = variant(target, SOURCE.replace("x[i] *= 2.0f", "x[i] = x[i] * 2.0f"))
    assert changed_kernels(base, body_only) == ("scale",)
    both = variant(target, SOURCE.replace("*= 2.0f", "*= 3.0f").replace("+= 1.0f", "+= 2.0f"))
    assert changed_kernels(base, both) == ("scale", "shift")
    host = variant(target, SOURCE.replace("return 0;", "return 1;"))
    assert changed_kernels(base, host) == ()  # host code changed: every kernel
    added = variant(target, SOURCE + "__global__ void more(float* x) { x[0] = 0; }\n")
    assert changed_kernels(base, added) == ()


def test_a_sanitizer_run_again_is_put_off_while_the_variant_could_not_be_a_final():
    """A variant's racecheck ran out of its first budget, smaller than the baseline's own time under
    it: it is run again with the right one, but only while the variant could be a final; put off
    (never a pass) while it could not, and run when the finals ask for it."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from cluster.core.types import BuildArtifact
    from cluster.engine.scheduling.jobs import JobResult
    from cluster.engine.verification.checks import DeepChecks, Trust
    from cluster.measure.sanitize import SanitizerResult
    from cluster.store.variants import AcceptedVariant

    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    changed = AcceptedVariant(variant(target, SOURCE), "unroll saxpy.cu:2", {}, True)
    asked: list[tuple[str, tuple[str, ...], Future]] = []

    def sanitize(source, tools, timeout, timeouts, label="", value=0.0, kernels=(), launches=None):
        asked.append(("baseline" if source is None else "variant", tuple(tools), Future()))
        return asked[-1][2]

    def answer(index: int, *results: SanitizerResult) -> None:
        asked[index][2].set_result(JobResult(SimpleNamespace(), BuildArtifact("k", Status.OK), value=results))

    records: list[dict] = []
    checks = DeepChecks(SimpleNamespace(state=SimpleNamespace(name="s", target=target), sanitize=sanitize),
                        ("memcheck", "racecheck"), 1000.0, False, records.append)
    contends = [True]
    checks.contends = lambda source_hash: contends[0]
    checks.add(changed, None)
    assert checks.request(changed.source_hash, "measured 1.50x") is Trust.PENDING
    answer(0, SanitizerResult("memcheck", "clean"), SanitizerResult("racecheck", "timeout"))
    assert [a[:2] for a in asked] == [("variant", ("memcheck", "racecheck")), ("baseline", ("memcheck", "racecheck"))]
    contends[0] = False  # the flags passed it meanwhile
    answer(1, SanitizerResult("memcheck", "clean", seconds=5.0), SanitizerResult("racecheck", "clean", seconds=40.0))
    assert len(asked) == 2 and checks.trust(changed.source_hash) is Trust.NOT_RUN  # put off, not passed
    [put_off] = records  # the variants table says so: not run, and why
    assert put_off["checks"] == "" and "racecheck put off" in put_off["verdicts"], put_off
    contends[0] = True
    assert checks.request(changed.source_hash, "a finalist") is Trust.PENDING
    assert asked[2][:2] == ("variant", ("racecheck",))  # only what was put off
    answer(2, SanitizerResult("racecheck", "clean"))
    assert checks.trust(changed.source_hash) is Trust.PASSED and records[-1]["checks"] == "passed"
    assert [v.check for v in checks.variants[changed.source_hash].verdicts] == ["memcheck", "racecheck"]


def test_a_tool_the_baseline_ran_out_of_too_is_not_run_again_on_the_variant():
    """Where the baseline's own run under a tool ran out of its budget, the tool cannot judge the
    target: the variant's timed-out run is its verdict (skipped, ``sanitizer_timeout``), not a
    reason to run it again with more time."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from cluster.core.types import BuildArtifact
    from cluster.engine.scheduling.jobs import JobResult
    from cluster.engine.verification.checks import DeepChecks, Trust
    from cluster.measure.sanitize import SanitizerResult
    from cluster.store.variants import AcceptedVariant

    target = load_target(REPO / "configs/targets/saxpy/target.yaml")
    changed = AcceptedVariant(variant(target, SOURCE), "unroll saxpy.cu:2", {}, True)
    asked: list[Future] = []

    def sanitize(source, tools, timeout, timeouts, label="", value=0.0, kernels=(), launches=None):
        asked.append(Future())
        return asked[-1]

    def answer(index: int, *results: SanitizerResult) -> None:
        asked[index].set_result(JobResult(SimpleNamespace(), BuildArtifact("k", Status.OK), value=results))

    checks = DeepChecks(SimpleNamespace(state=SimpleNamespace(name="s", target=target), sanitize=sanitize),
                        ("racecheck",), 1000.0, False, lambda record: None)
    checks.add(changed, None)
    checks.request(changed.source_hash, "measured 1.50x")
    answer(0, SanitizerResult("racecheck", "timeout", seconds=100.0))
    answer(1, SanitizerResult("racecheck", "timeout", seconds=300.0))  # the baseline, out of a larger budget
    assert len(asked) == 2 and checks.trust(changed.source_hash) is Trust.PASSED
    [verdict] = checks.variants[changed.source_hash].verdicts
    assert verdict.status.value == "skipped" and "sanitizer_timeout" in verdict.detail
