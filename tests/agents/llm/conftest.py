"""Shared pieces of the LLM agent tests: the scripted server, a spec pointing the real openai
client at it, the C target the agents work on (tests/fixtures/targets/guarded, built and run with
cc for real) and a local verifier standing in for the cluster's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from agents._base import AnalysisContext, Proposal
from agents.llm import LLMSpec
from agents.llm.testing import Conversation, FakeOpenAIServer, Reply, call
from agents.workflow.steps import Plan, Verification, Verifier
from cluster.compile.build import compile_candidate
from cluster.config import Target, load_target
from cluster.core.types import Candidate, DeviceInfo, Status
from cluster.engine.verification.verify import GuardedVerifier
from cluster.engine.verification.verify import LocalVerifier as ClusterLocalVerifier
from cluster.measure.measure import Reference, measure_candidate
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "targets" / "guarded"
SECRET = "sk-test-0123456789-SECRET-do-not-store"
KEY_ENV = "WF_TEST_LLM_API_KEY"
CPU = DeviceInfo("cpu", "host", "host")

# guarded/work.c's compute(), lines 24-30, and an honest faster replacement.
COMPUTE_LINES = (24, 30)
HONEST_COMPUTE = """static void compute(float *out, const float *in, int n) {
    static float s[N + K];
    for (int j = 0; j < n + K; ++j) s[j] = sinf(in[j % n]);
    for (int i = 0; i < n; ++i) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += s[i + k] * (float)(k + 1);
        out[i] = acc;
    }
}"""
# A cheat: only the first call computes; later repetitions leave the buffer as it was.
SKIPPING_COMPUTE = """static void compute(float *out, const float *in, int n) {
    static int done = 0;
    if (done) return;
    done = 1;
    for (int i = 0; i < n; ++i) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += sinf(in[(i + k) % n]) * (float)(k + 1);
        out[i] = acc;
    }
}"""


def edit_compute(text: str) -> dict[str, object]:
    return {"op": "replace", "path": "work.c", "start_line": COMPUTE_LINES[0], "end_line": COMPUTE_LINES[1],
            "text": text}


ANALYSIS = Conversation("Analyse it.", [
    Reply(tool_calls=[call("read_source", path="work.c", start_line=20, end_line=40)]),
    Reply(tool_calls=[call("report_findings", findings=[
        {"location": "work.c:27 in compute", "applies": True, "evidence": ["sinf is called K times per input"],
         "reason": "compute sinf once per input"},
        {"location": "work.c:33 now_ms", "applies": False, "reason": "read-only timing code"}])]),
])
PLANNING = Conversation("Plan the change", [
    Reply(tool_calls=[call("submit_plan", changes=["in compute(), tabulate sinf of each input once"])]),
])


def transforming(compute: str = HONEST_COMPUTE, match: str = "Carry out this plan") -> Conversation:
    return Conversation(match, [
        Reply(tool_calls=[call("edit", edits=[edit_compute(compute)])]),
        Reply(tool_calls=[call("build")]),
        Reply(tool_calls=[call("finish", description="tabulate sinf once per input")]),
    ])


@pytest.fixture
def target() -> Target:
    return load_target(FIXTURE / "target.yaml")


@pytest.fixture
def context(target: Target) -> AnalysisContext:
    return AnalysisContext(target, "host", baseline_median=21.0)


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, SECRET)
    return SECRET


def spec_for(server: FakeOpenAIServer, **fields: object) -> LLMSpec:
    values: dict[str, object] = {"base_url": server.base_url, "model": "fake-model", "api_key_env": KEY_ENV,
                                 "timeout_s": 5, "retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.05,
                                 "max_steps": 8}
    values.update(fields)
    return LLMSpec.model_validate(values)


@pytest.fixture
def serve(api_key: str) -> Iterator[callable]:
    """Starts a scripted server (stopped after the test): serve([Conversation(...), ...])."""
    servers: list[FakeOpenAIServer] = []

    def start(conversations: Sequence[Conversation]) -> FakeOpenAIServer:
        servers.append(FakeOpenAIServer(list(conversations)).start())
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


class LocalVerifier(Verifier):
    """The cluster's own local verifier (cluster.engine.verification.verify.LocalVerifier: guards, dependence graph, a
    cc build, a run against the baseline's outputs), with the guardrails on top when ``cheats``
    (cluster.engine.verification.verify.GuardedVerifier); made for the target of the first proposal it sees."""

    def __init__(self, cheats: bool = False) -> None:
        self.cheats = cheats
        self.calls: list[Proposal] = []
        self._inner: Verifier | None = None

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        self.calls.append(proposal)
        if self._inner is None:
            target = context.target
            baseline = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), ())
            measured = measure_candidate(target, baseline, compile_candidate(target, baseline), CPU, None, runs=1)
            assert measured.status is Status.OK, measured.error_tail
            inner: Verifier = ClusterLocalVerifier(baseline, CPU, Reference(measured.outputs), runs=1)
            self._inner = GuardedVerifier(inner, baseline) if self.cheats else inner
        return self._inner.verify(context, plan, proposal)


def stored_text(run_dir: Path) -> str:
    """Everything written under a run directory, as text."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(run_dir.rglob("*")) if p.is_file())
