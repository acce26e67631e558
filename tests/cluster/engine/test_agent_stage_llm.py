"""LLM agents in a real sweep on the CPU: the config's `agents.llm` and a custom optimization, the
real openai client against the scripted server, the cluster's verification with the guardrails,
accounting in the variants table, and the key nowhere in the run directory."""

from __future__ import annotations

import yaml

from cluster.config import load_run
from cluster.engine.driver import Sweep
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir
from cluster.store.variants import VARIANT_SCHEMA
from tests.agents.llm.conftest import (  # noqa: F401  (api_key, serve: fixtures)
    ANALYSIS,
    FIXTURE,
    HONEST_COMPUTE,
    PLANNING,
    SECRET,
    SKIPPING_COMPUTE,
    api_key,
    serve,
    spec_for,
    stored_text,
    transforming,
)
from tests.agents.llm.test_custom import HOIST


def test_a_custom_llm_optimization_in_a_sweep(serve, tmp_path, ray_local):  # noqa: F811
    server = serve([ANALYSIS, PLANNING, transforming(HONEST_COMPUTE, match="poisoned_outputs"),
                    transforming(SKIPPING_COMPUTE)])
    llm = spec_for(server, rounds=1, proposals_per_round=1).model_dump(mode="json")
    config = {"name": "llm", "output_dir": str(tmp_path), "targets": [str(FIXTURE / "target.yaml")],
              "search": {"trials": 4, "seed": 0}, "measure": {"final_top_k": 1, "final_runs": 2},
              "agents": {"enabled": True, "experts": [], "custom": [HOIST], "llm": llm}}
    path = tmp_path / "llm.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = load_run(path)
    run_dir = RunDir.create(plan)
    Sweep(plan, run_dir).run(show_progress=False)

    variants = read_table(run_dir.path, "variants", VARIANT_SCHEMA)
    made = variants[variants["transformer"] != ""]
    assert list(made["stage"][:2]) == ["rejected", "accepted"]
    # The cheat, caught on the worker by its admission run (its outputs poisoned: no check job of its own)
    assert made["reason"].iloc[0].startswith("outputs: poisoned_outputs: with its output buffers poisoned")
    assert (made["llm_model"] == "fake-model").all() and (made["llm_tokens_in"] > 0).all()
    assert (made["llm_calls"] > 0).all() and made["llm_exchanges"].str.len().gt(0).all()
    accepted = made[made["stage"] == "accepted"]["source_hash"].iloc[0]
    rows = read_results(run_dir.path)
    assert accepted in set(rows.loc[rows["phase"] == "search", "source_hash"])
    assert (run_dir.path / "llm").is_dir()  # every exchange, stored for replay and audit
    assert SECRET not in stored_text(run_dir.path)
