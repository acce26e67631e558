"""The agent stage in a real sweep on the CPU: Ray, gcc, Optuna and Parquet, with scripted agents
doing steps 1-3 on a C fixture. Verification (step 4) is the real one."""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest

from agents._base import AnalysisContext, Proposal
from agents.patch import ReplaceText, apply, source_files
from agents.workflow import Analyst, Finding, Level, Plan, Planner, Transformer
from cluster.config import load_run
from cluster.engine.driver import Sweep
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from cluster.store.variants import VARIANT_SCHEMA, latest_outcomes
from tests.conftest import REPO

pytestmark = pytest.mark.usefixtures("ray_local")
CONFIG = REPO / "tests" / "fixtures" / "agents_cpu.yaml"
# The baseline's timed work (three computes of about 20 ms here) is large enough that the fast variant's
# honest saving shows in warpfleet's own clock above a loaded machine's noise: with a quarter of it,
# a run started under three pytest workers on two cores was seen slower than the baseline's, and the
# clock check failed the variant (clock_mismatch).
LOOP = "        for (int k = 0; k < 256; ++k) acc += x[i] * 0.5f;"
FAST = ("#ifndef WF_SPLIT\n#define WF_SPLIT 1\n#endif\n", "        acc = x[i] * (128.0f / WF_SPLIT) * WF_SPLIT;")
WRONG = "        acc = x[i] * 129.0f;"


class Scripted(Analyst, Planner, Transformer):
    """Steps 1-3 from a script: finding name -> one edit per attempt (a callable of the files)."""

    name = "scripted"
    takes_feedback = True

    def __init__(self, script):
        self.script = script
        self.calls: list[tuple[str, str | None]] = []

    def analyse(self, context: AnalysisContext) -> list[Finding]:
        return [Finding(name, Level.KERNEL, "agent_c.c:compute", True, ("scripted",), "scripted")
                for name in self.script]

    def plan(self, context: AnalysisContext, finding: Finding) -> Plan:
        return Plan(finding, (f"apply {finding.optimization}",))

    def transform(self, context: AnalysisContext, plan: Plan, feedback: str | None = None) -> list[Proposal]:
        self.calls.append((plan.optimization, feedback))
        attempts = self.script[plan.optimization]
        attempt = sum(1 for name, _ in self.calls if name == plan.optimization) - 1
        if attempt >= len(attempts):
            return []
        files, search = attempts[attempt](source_files(context.target))
        return [Proposal(self.name, plan.optimization, files, search)]


def patched(old: str, new: str, search=None, prelude: str = ""):
    def edit(files):
        text = files["agent_c.c"].replace(old, new)
        if prelude:
            text = text.replace("#define N 20000\n", "#define N 20000\n" + prelude)
        result = apply(files, [ReplaceText("agent_c.c", old, new)], ["agent_c.c"])
        assert not hasattr(result, "rule"), result  # the patch tool accepts edits outside read-only regions
        return ((("agent_c.c", text),), search or {})
    return edit


def raw(old: str, new: str):
    """A proposal made without the patch tools, as a careless agent might: the verifier's guards catch it."""
    return lambda files: ((("agent_c.c", files["agent_c.c"].replace(old, new)),), {})


def run_sweep(tmp_path, agent, trials=6, run_dir=None):
    plan = load_run(CONFIG)
    config = plan.config.model_copy(update={"output_dir": str(tmp_path),
                                            "search": plan.config.search.model_copy(update={"trials": trials})})
    plan = type(plan)(config, plan.file, plan.targets)
    run_dir = run_dir or RunDir.create(plan)
    from agents.workflow import Steps

    Sweep(plan, run_dir, agent_steps=lambda: [Steps.of(agent)]).run(show_progress=False)
    return run_dir


def test_verified_variants_join_the_search_and_failures_are_reverted(tmp_path):
    agent = Scripted({
        "fast": [patched(LOOP, FAST[1], {"WF_SPLIT": (1, 2)}, FAST[0])],
        "retry": [patched(LOOP, WRONG), patched(LOOP, FAST[1].replace("128.0f", "128.000f"), {"WF_SPLIT": (1, 2)},
                                                  FAST[0])],
        "readonly": [raw("compute(y, x, N);", "compute(y, x, N / 2);")],
    })
    run_dir = run_sweep(tmp_path, agent)
    variants = read_table(run_dir.path, "variants", VARIANT_SCHEMA)
    labels = variants["optimization"] + ":" + variants["attempt"].astype(str)
    stages = dict(zip(labels, variants["stage"], strict=True))
    assert stages == {"fast:0": "accepted", "retry:0": "rejected", "retry:1": "accepted", "readonly:0": "rejected"}
    wrong = variants[(variants["optimization"] == "retry") & (variants["attempt"] == 0)].iloc[0]
    verdicts = {v["check"]: v for v in json.loads(wrong["verdicts"])}
    assert verdicts["outputs"]["status"] == "failed" and verdicts["build"]["status"] == "passed"
    assert ("retry", None) in agent.calls
    assert any(name == "retry" and fb and "outputs" in fb for name, fb in agent.calls)
    guard = variants[variants["optimization"] == "readonly"].iloc[0]
    assert "read-only region" in guard["reason"] and "build" not in guard["verdicts"]
    accepted = variants[variants["stage"] == "accepted"]
    assert accepted["diff"].str.contains("acc = x\\[i\\] \\* \\(128").all()
    fast_plan = accepted.loc[accepted["optimization"] == "fast", "plan"].iloc[0]  # recorded as they come
    assert json.loads(fast_plan)["changes"] == ["apply fast"]

    rows = read_results(run_dir.path)
    duckdb = pytest.importorskip("duckdb")  # parts before the variant's p_WF_SPLIT rewritten with it
    query = f"select count(*), count(p_WF_SPLIT) from read_parquet('{run_dir.path}/results/*.parquet')"
    assert rows["p_WF_SPLIT"].notna().sum() > 0
    assert duckdb.connect().execute(query).fetchone() == (len(rows), rows["p_WF_SPLIT"].notna().sum())
    assert pd.read_parquet(run_dir.path / "results")["p_WF_SPLIT"].count() == rows["p_WF_SPLIT"].notna().sum()
    verify = rows[rows["phase"] == "verify"]
    assert sorted(verify["status"]) == ["ok", "ok", "verify_failed"]  # the guard failure never ran
    fast_hash = accepted[accepted["optimization"] == "fast"]["source_hash"].iloc[0]
    search = rows[rows["phase"] == "search"]
    on_variant = search[search["source_hash"] == fast_hash]
    assert set(on_variant["p_WF_SPLIT"]) == {1, 2}  # the plan's search, entered ahead of the sampler
    assert rows["candidate_key"][rows["phase"] != "final"].is_unique
    best = select_best(rows)[0]
    best_source = rows.loc[rows["candidate_key"] == best.candidate_key, "source_hash"].iloc[0]
    assert best.speedup > 2 and best_source in set(accepted["source_hash"])

    # Resume with a larger budget: the agents are not asked again, the variants stay in the search.
    calls = len(agent.calls)
    run_sweep(tmp_path, agent, trials=9, run_dir=RunDir.open(run_dir.path))
    assert len(agent.calls) == calls
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"]
    own = search[~search["source_hash"].isin(set(accepted["source_hash"]))]
    # Each stream's trials are its own: the target's sources have the 9 a sweep without agents has.
    assert len(own) == 9 and 0 < len(search) - len(own) <= 9
    assert rows["candidate_key"][rows["phase"] != "final"].is_unique
    # the same outcomes (a variant's expensive checks may add a later record of one of them)
    assert len(latest_outcomes(read_table(run_dir.path, "variants", VARIANT_SCHEMA))) == len(latest_outcomes(variants))


COMPUTE = "static void compute(float *y, const float *x, int n) {\n"
REUSE = (COMPUTE + "    static int done = 0;  /* the result is already in y */\n"
         "    if (done && !getenv(\"WARPFLEET_POISON\")) return;\n    done = 1;\n")


def test_a_variant_that_does_its_work_only_under_the_checks_variable_measures_its_work_in_its_finals(tmp_path):
    """An agent's variant computes once and returns at once on the later repetitions (its outputs
    right, its timer honest, the wall clock bearing its claim out) unless WARPFLEET_POISON (the
    poisoned-outputs check's variable) is set. Its search runs make it the fastest by far; its
    admission run and its finals have the variable, so it measures its real work where it is
    judged, and no winner of the sweep is faster than the baseline by its trick. Before the cheat
    checks were the finals' runs, their poisoned run came apart from the finals and it passed."""
    agent = Scripted({"reuse": [patched(COMPUTE, REUSE)]})
    run_dir = run_sweep(tmp_path, agent)
    variants = latest_outcomes(read_table(run_dir.path, "variants", VARIANT_SCHEMA))
    [cheat] = variants.loc[variants["stage"] == "accepted", "source_hash"]
    rows = read_results(run_dir.path)

    def tricked(samples) -> bool:  # in most runs, the first repetition did the work and the others returned at once
        # Run by run (the program's three repetitions a run): one repetition stretched by a loaded
        # machine is no trick (4.5 ms among 0.4 ms ones; at load 6-7, 91 ms among 0.7 ms ones, which
        # put a final's median under its maximum's fiftieth); the trick's later repetitions take
        # microseconds in every run.
        runs = [samples[i:i + 3] for i in range(0, len(samples), 3)]
        return sum(statistics.median(run[1:]) < run[0] / 50 for run in runs if len(run) == 3) > len(runs) / 2

    search = rows[(rows["phase"] == "search") & (rows["source_hash"] == cheat) & (rows["status"] == "ok")]
    assert search["samples"].map(tricked).any()  # the trick, unwatched
    finals = rows[(rows["phase"] == "final") & (rows["source_hash"] == cheat) & (rows["status"] == "ok")]
    assert len(finals) >= 1 and not finals["samples"].map(tricked).any()  # its work, under the variable
    [best] = select_best(rows)
    winner = rows[(rows["phase"] == "final") & (rows["candidate_key"] == best.candidate_key)]
    assert not winner["samples"].map(tricked).any()


def test_report_and_patch_export_of_a_variant_winner(tmp_path):
    import subprocess

    from click.testing import CliRunner

    from cluster.cli import main
    from cluster.outputs.optimize_report import render

    agent = Scripted({"fast": [patched(LOOP, FAST[1], {"WF_SPLIT": (1, 2)}, FAST[0])], "wrong": [patched(LOOP, WRONG)]})
    run_dir = run_sweep(tmp_path, agent)
    report = render(run_dir.path)
    assert "## agent_c" in report and "- winner: variant " in report and "(fast at agent_c.c:compute)" in report
    table = next(line for line in report.splitlines() if line.startswith("| fast | kernel | 1 | 0 |"))
    alone, best = (float(cell.strip().rstrip("x")) for cell in table.split("|")[5:7])
    assert best >= alone > 2  # the transformation alone already gains; the flags add to it
    assert "| wrong | agent_c.c:compute | rejected | scripted | outputs:" in report
    assert "```diff" in report

    result = CliRunner().invoke(main, ["export", str(run_dir.path), "--format", "patch"])
    assert result.exit_code == 0, result.output
    patch = result.output
    assert patch.startswith("# agent_c on ") and "--- a/agent_c.c" in patch
    work = tmp_path / "apply"
    work.mkdir()
    (work / "agent_c.c").write_bytes((REPO / "tests/fixtures/targets/agent_c/agent_c.c").read_bytes())
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "apply", "-"], cwd=work, input=patch.encode(), check=True)
    assert "128.0f / WF_SPLIT" in (work / "agent_c.c").read_text()


def test_cli_optimize_runs_the_experts_and_writes_the_report(tmp_path):
    from click.testing import CliRunner

    from cluster.cli import main

    target = REPO / "tests/fixtures/targets/agent_c/target.yaml"
    result = CliRunner().invoke(main, ["optimize", str(target), "--trials", "3", "--output-dir", str(tmp_path),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run / "report.md").read_text() in result.output
    assert "## agent_c" in result.output and "- winner:" in result.output
    config = (tmp_path / "optimize-agent_c.yaml").read_text()
    assert "enabled: true" in config and "streamify" in config
    rows = read_results(run)
    assert (rows["phase"] == "search").sum() == 3
    bad = CliRunner().invoke(main, ["optimize", str(tmp_path / "missing.yaml"), "--output-dir", str(tmp_path)])
    assert bad.exit_code == 2 and "missing.yaml" in bad.output and len(bad.output.strip().splitlines()) == 1
