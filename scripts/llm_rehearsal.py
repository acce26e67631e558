"""Rehearse an LLM setup with no model: the scripted OpenAI-compatible server of
agents.llm.testing answers the LLM agents from a JSON script, through the real protocol and the
real client, while the workflow runs as in a sweep (analysis, plan, transformation, the
verifier's static checks and, with --build, a build here). It prints which scripted conversation
and turn each request got, and what became of each finding.

    python scripts/llm_rehearsal.py scripts/rehearsal/script.json scripts/rehearsal/target.yaml \\
        --optimization unroll --build

The script: a JSON list of conversations, `{"match": "<substring of the first user message>",
"turns": [{"content": "...", "tool_calls": [{"name": "<tool>", "arguments": {...}}]}, ...]}`;
turn k answers the request holding k assistant messages. The first user messages contain
"Analyse it." (analyst), "Plan the change" (planner) and "Carry out this plan" (transformer).
The tools: list_files, read_source, analyze_source, kernel_resources, occupancy, edit (ops
insert_before, insert_after, insert_at_anchor, replace, replace_text, delete), show_diff, reset,
build, verify, profile; and the answers report_findings, submit_plan, no_plan, finish. Exit
status 0 when every request matched a conversation and a proposal was accepted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents._base import AnalysisContext, Proposal  # noqa: E402
from agents.llm import LLMSpec, build_steps  # noqa: E402
from agents.llm.testing import FakeOpenAIServer, load_script  # noqa: E402
from agents.patch import source_files, unified_diff  # noqa: E402
from agents.workflow import Outcome, Plan, Verification, Verifier, run_workflow  # noqa: E402
from agents.workflow.steps import Verdict, VerdictStatus  # noqa: E402
from cluster.config import load_target  # noqa: E402
from cluster.engine.verification.verify import static_verdicts  # noqa: E402  (the sweep's own static checks, rehearsed)


class RehearsalVerifier(Verifier):
    """The verifier's static checks and, when asked, a build here; nothing runs."""

    def __init__(self, build: bool) -> None:
        self.build = build

    def verify(self, context: AnalysisContext, plan: Plan, proposal: Proposal) -> Verification:
        verdicts = static_verdicts(context.target, proposal)
        if self.build and proposal.files and not any(v.failed for v in verdicts):
            from cluster.engine.agent_stage import build_report  # the LLM agents' build tool, as in a sweep

            report = build_report(context, dict(proposal.files))
            status = VerdictStatus.PASSED if report.startswith("build ok") else VerdictStatus.FAILED
            verdicts.append(Verdict("build", status, report.splitlines()[0]))
        return Verification(tuple(verdicts))


def rehearse(script: Path, target_path: Path, optimization: str, arch: str, build: bool,
             run_dir: Path) -> tuple[list[Outcome], FakeOpenAIServer]:
    target = load_target(target_path)
    choice = {optimization: {"analyst": "llm", "planner": "llm", "transformer": "llm"}}
    with FakeOpenAIServer(load_script(script)) as server:
        spec = LLMSpec(base_url=server.base_url, model="rehearsal", api_key_env=None, max_steps=12, retries=0)
        steps = build_steps(spec, choice, run_dir=run_dir)
        outcomes = run_workflow(AnalysisContext(target, arch), steps, RehearsalVerifier(build), retries=0)
    return outcomes, server


def report(outcomes: list[Outcome], server: FakeOpenAIServer, conversations: list, original: dict[str, str]) -> bool:
    unmatched = 0
    print("requests:")
    for request in server.completions():
        first = next((m.get("content") or "" for m in request.body.get("messages", []) if m.get("role") == "user"),
                     "")
        if request.conversation is None:
            unmatched += 1
            print(f"  NO MATCH (HTTP {request.status}): the first user message begins {first[:100]!r}")
        else:
            match = conversations[request.conversation].match
            print(f"  conversation {request.conversation} ({match!r}), turn {request.turn}: HTTP {request.status}")
    print("outcomes:")
    for outcome in outcomes:
        print(f"  {outcome.finding.optimization} {outcome.finding.location}: {outcome.stage}"
              + (f" ({outcome.reason})" if outcome.reason else ""))
        if outcome.verification is not None:
            print("    checks: " + ", ".join(f"{v.check} {v.status.value}" for v in outcome.verification.verdicts))
        if outcome.proposal is not None and outcome.proposal.files:
            for path, text in outcome.proposal.files:
                print("    " + unified_diff(path, original[path], text).replace("\n", "\n    "))
    return not unmatched and any(o.accepted for o in outcomes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", type=Path, help="a JSON file of scripted conversations")
    parser.add_argument("target", type=Path, help="the target's YAML file")
    parser.add_argument("--optimization", default="unroll", help="the expert optimization the LLM agents take")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--build", action="store_true", help="build each proposal here (needs the toolchain)")
    parser.add_argument("--run-dir", type=Path, help="where the exchanges are stored (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wf-rehearsal-") as scratch:
        run_dir = args.run_dir or Path(scratch)
        outcomes, server = rehearse(args.script, args.target, args.optimization, args.arch, args.build, run_dir)
        ok = report(outcomes, server, load_script(args.script), source_files(load_target(args.target)))
        print(f"exchanges stored under {run_dir / 'llm'}" if args.run_dir else "")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
