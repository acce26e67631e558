"""The workflow loop: every finding's fate, retries with feedback, failures of any step as values."""

from __future__ import annotations

from agents._base import AnalysisContext, Proposal
from agents.workflow import (
    Analyst,
    Finding,
    Level,
    Plan,
    Planner,
    Steps,
    Transformer,
    Verdict,
    VerdictStatus,
    Verification,
    Verifier,
    run_workflow,
)

CONTEXT = AnalysisContext(target=None, arch="sm_90")  # type: ignore[arg-type]  # the loop never reads it


class Agent(Analyst, Planner, Transformer):
    name = "scripted"

    def __init__(self, findings, proposals, feedback=False, plan_none=(), raise_in=""):
        self.findings, self.proposals, self.takes_feedback = findings, proposals, feedback
        self.plan_none, self.raise_in = plan_none, raise_in
        self.feedback: list[str | None] = []

    def analyse(self, context):
        if self.raise_in == "analyse":
            raise RuntimeError("model unreachable")
        return self.findings

    def plan(self, context, finding):
        if self.raise_in == "plan":
            raise ValueError("bad plan")
        return None if finding.optimization in self.plan_none else Plan(finding, ("change",))

    def transform(self, context, plan, feedback=None):
        self.feedback.append(feedback)
        return self.proposals.pop(0) if self.proposals else []


class ByText(Verifier):
    """Passes proposals whose description is "good"; counts calls."""

    def __init__(self, raise_on=""):
        self.calls, self.raise_on = 0, raise_on

    def verify(self, context, plan, proposal):
        self.calls += 1
        if proposal.description == self.raise_on:
            raise OSError("worker lost")
        ok = proposal.description == "good"
        return Verification((Verdict("outputs", VerdictStatus.PASSED if ok else VerdictStatus.FAILED,
                                     "" if ok else f"{proposal.description} differs"),))


def finding(name, applies=True):
    return Finding(name, Level.KERNEL, "k.cu:1", applies, ("evidence",), f"{name} reason")


def prop(text):
    return Proposal("scripted", text, (("k.cu", text),))


def test_every_finding_gets_a_stage():
    agent = Agent([finding("a"), finding("b", applies=False), finding("c"), finding("d")],
                  [[prop("good")], [prop("bad")], []], plan_none=("d",))
    outcomes = run_workflow(CONTEXT, [Steps.of(agent)], ByText())
    assert [(o.finding.optimization, o.stage) for o in outcomes] == [
        ("a", "accepted"), ("b", "not_applicable"), ("c", "rejected"), ("d", "not_planned")]
    assert outcomes[2].reason == "outputs: bad differs" and outcomes[1].reason == "b reason"
    assert agent.feedback == [None, None]  # no feedback for an agent that does not take it


def test_a_feedback_taking_transformer_retries_with_the_failure():
    agent = Agent([finding("a")], [[prop("bad")], [prop("good")]], feedback=True)
    outcomes = run_workflow(CONTEXT, [Steps.of(agent)], ByText(), retries=2)
    assert [(o.stage, o.attempt) for o in outcomes] == [("rejected", 0), ("accepted", 1)]
    assert agent.feedback == [None, "outputs: bad differs"]


def test_retries_stop_at_the_budget_and_identical_proposals_are_verified_once():
    agent = Agent([finding("a")], [[prop("bad")], [prop("bad")], [prop("bad")]], feedback=True)
    verifier = ByText()
    outcomes = run_workflow(CONTEXT, [Steps.of(agent)], verifier, retries=1)
    assert [o.stage for o in outcomes] == ["rejected", "rejected"] and verifier.calls == 1


def test_a_step_that_raises_is_an_outcome_and_the_others_go_on():
    broken = Agent([], [], raise_in="analyse")
    planner_fails = Agent([finding("p")], [], raise_in="plan")
    fine = Agent([finding("a")], [[prop("boom"), prop("good")]])
    outcomes = run_workflow(CONTEXT, [Steps.of(broken), Steps.of(planner_fails), Steps.of(fine)],
                            ByText(raise_on="boom"))
    assert [o.stage for o in outcomes] == ["error", "error", "error", "accepted"]
    assert "analyse raised RuntimeError: model unreachable" in outcomes[0].reason
    assert "plan raised ValueError" in outcomes[1].reason and "verify raised OSError" in outcomes[2].reason


def test_steps_mix_implementations_per_step():
    class OtherPlanner(Planner):
        name = "other"

        def plan(self, context, finding):
            return Plan(finding, ("something else",))

    agent = Agent([finding("a")], [[prop("good")]])
    [outcome] = run_workflow(CONTEXT, [Steps(agent, OtherPlanner(), agent)], ByText())
    assert outcome.planner == "other" and outcome.plan.changes == ("something else",) and outcome.accepted


def test_an_experts_findings_are_verified_at_once_in_order_and_each_proposal_once():
    """findings_at_once: an expert's findings are pursued in threads, so their verifications (jobs on
    the cluster) overlap; the outcomes keep the findings' order, and a proposal made for two
    findings is verified once. An LLM's steps (concurrent False) take their findings in turn."""
    import threading

    class ByFinding(Agent):
        def transform(self, context, plan, feedback=None):
            name = plan.finding.optimization
            return [prop("good")] if name in ("b", "c") else [prop(f"good {name}")]

    class Overlapping(ByText):
        """Each verification waits until another is under way (or ``wait_s`` passes): in turn, none
        overlap. Concurrent ones may wait long (a loaded machine may start the second late, and
        the first's 0.5 s would then pass alone); in turn, each waits its ``wait_s`` for nothing."""

        def __init__(self, wait_s: float):
            super().__init__()
            self.lock, self.running, self.most, self.wait_s = threading.Lock(), 0, 0, wait_s
            self.together = threading.Event()

        def verify(self, context, plan, proposal):
            with self.lock:
                self.calls += 1
                self.running += 1
                self.most = max(self.most, self.running)
                if self.running >= 2:
                    self.together.set()
            self.together.wait(timeout=self.wait_s)
            with self.lock:
                self.running -= 1
            return Verification((Verdict("outputs", VerdictStatus.PASSED, ""),))

    names = ["a", "b", "c", "d", "e"]
    verifier = Overlapping(wait_s=60)
    outcomes = run_workflow(CONTEXT, [Steps.of(ByFinding([finding(n) for n in names], []))], verifier,
                            findings_at_once=4)
    assert [o.finding.optimization for o in outcomes] == names and all(o.accepted for o in outcomes)
    assert verifier.most >= 2 and verifier.calls == 4  # b and c proposed the same change: verified once

    class InTurn(ByFinding):
        concurrent = False  # as agents.llm's steps

    verifier = Overlapping(wait_s=0.5)
    run_workflow(CONTEXT, [Steps.of(InTurn([finding(n) for n in names], []))], verifier, findings_at_once=4)
    assert verifier.most == 1


def test_a_finding_on_a_kernel_the_profile_never_saw_launched_does_not_apply(tmp_path):
    """An expert's finding about a kernel the baseline's profile never saw launched (a sample's
    other variants, a kernel chosen at run time) is a not_applicable row, with the kernels that ran;
    a profile naming none of the findings' kernels (another naming) decides nothing."""
    from agents.experts.restrict import RestrictExpert
    from cluster.measure.profile import kernel_name
    from tests.agents.test_restrict import target

    class PassAll(Verifier):
        def verify(self, context, plan, proposal):
            return Verification((Verdict("outputs", VerdictStatus.PASSED, ""),))

    assert kernel_name("void ns::gather<float>(const float *, const int *, float *, int)") == "gather"
    assert kernel_name("axpy(float, float *, float *, int)") == "axpy"

    def stages(launched: frozenset[str]) -> dict[str, tuple[str, str]]:
        context = AnalysisContext(target(tmp_path), "sm_90", launched=launched)
        outcomes = run_workflow(context, [Steps.of(RestrictExpert())], PassAll())
        return {o.finding.location.split()[-1]: (o.stage, o.reason) for o in outcomes}

    assert stages(frozenset())["gather"][0] == "accepted"  # no profile: the source decides
    found = stages(frozenset({"axpy"}))
    assert found["axpy"][0] == "accepted"
    assert found["gather"] == ("not_applicable", "gather is never launched in the baseline's profile (launched: axpy)")
    assert stages(frozenset({"_Z4axpyfPfS_i"}))["gather"][0] == "accepted"  # mangled names: no match, no verdict


def test_a_verification_that_raised_is_tried_again_for_the_same_change():
    """Identical proposals share one verification, but one that raised (a worker lost) is not
    kept: the same change proposed again is verified again."""
    agent = Agent([finding("a"), finding("b")], [[prop("flaky")], [prop("flaky")]])

    class OnceFlaky(ByText):
        def verify(self, context, plan, proposal):
            self.calls += 1
            if self.calls == 1:
                raise OSError("worker lost")
            return Verification((Verdict("outputs", VerdictStatus.PASSED, ""),))

    verifier = OnceFlaky()
    first, second = run_workflow(CONTEXT, [Steps.of(agent)], verifier)
    assert first.stage == "error" and "worker lost" in first.error
    assert second.accepted and verifier.calls == 2


class Busy(Agent):
    """Records how many of its kind compute at once (each analysis and transformation holds a
    moment), while the verifications of its proposals overlap freely."""

    inside = 0
    most = 0
    lock = __import__("threading").Lock()

    def __init__(self, name, computes_here=True):
        super().__init__([finding(name)], [[Proposal("scripted", "good", (("k.cu", name),))]])
        self.name, self.computes_here = name, computes_here

    def _busy(self):
        import time

        with Busy.lock:
            Busy.inside += 1
            Busy.most = max(Busy.most, Busy.inside)
        time.sleep(0.05)
        with Busy.lock:
            Busy.inside -= 1

    def analyse(self, context):
        self._busy()
        return self.findings

    def transform(self, context, plan, feedback=None):
        self._busy()
        return super().transform(context, plan, feedback)


class Waits(ByText):
    """Each verification waits until ``at_once`` are waiting together (a GPU job's wait)."""

    def __init__(self, at_once):
        import threading

        super().__init__()
        self.barrier = threading.Barrier(at_once, timeout=10)

    def verify(self, context, plan, proposal):
        self.barrier.wait()
        return super().verify(context, plan, proposal)


def test_the_experts_compute_one_thread_at_a_time_and_their_verifications_overlap():
    # Many threads of Python computing gain nothing (the GIL) and starved the driver's loop that
    # shares their process: an expert's analysis and transformation take COMPUTING in turn, while
    # the verifications (waits on the GPU) run at once: all four wait together here.
    Busy.inside = Busy.most = 0
    agents = [Busy(f"e{i}") for i in range(4)]
    outcomes = run_workflow(CONTEXT, [Steps.of(a) for a in agents], Waits(4), parallel=4)
    assert [o.stage for o in outcomes] == ["accepted"] * 4
    assert Busy.most == 1


def test_an_agent_that_waits_on_a_service_does_not_take_the_experts_turn():
    Busy.inside = Busy.most = 0
    agents = [Busy(f"llm{i}", computes_here=False) for i in range(3)]
    outcomes = run_workflow(CONTEXT, [Steps.of(a) for a in agents], Waits(3), parallel=3)
    assert [o.stage for o in outcomes] == ["accepted"] * 3
    assert Busy.most > 1  # at once, as LLM calls are
