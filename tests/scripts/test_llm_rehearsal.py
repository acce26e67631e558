"""scripts/llm_rehearsal.py: the example script rehearses the unroll workflow end to end against
the scripted server (no model, no build), and a script whose match strings miss says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

REHEARSAL = REPO / "scripts" / "rehearsal"


@pytest.fixture
def rehearsal():
    import importlib.util

    spec = importlib.util.spec_from_file_location("llm_rehearsal", REPO / "scripts" / "llm_rehearsal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_script_rehearses_the_workflow(rehearsal, capsys) -> None:
    assert rehearsal.main([str(REHEARSAL / "script.json"), str(REHEARSAL / "target.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.count("conversation ") == 7 and "NO MATCH" not in out
    assert "unroll rows.cu:10 in row_sums: accepted" in out and "+#pragma unroll kWfUnrollN" in out
    assert "checks: guards passed, depgraph passed, contracts passed" in out


def test_a_script_that_misses_says_which_request(rehearsal, capsys, tmp_path: Path) -> None:
    script = json.loads((REHEARSAL / "script.json").read_text())
    script[1]["match"] = "Plan it"  # not what the planner's first message says
    (tmp_path / "script.json").write_text(json.dumps(script))
    assert rehearsal.main([str(tmp_path / "script.json"), str(REHEARSAL / "target.yaml")]) == 1
    out = capsys.readouterr().out
    assert "NO MATCH (HTTP 400): the first user message begins 'Target rehearsal (nvcc, sm_90)" in out
