"""Kernel Tuner's T4 results format: a study's rows as the published schema (1.0.0) describes them."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_target
from cluster.core.types import Phase, Status
from cluster.outputs.exports.t4 import T4_VERSION, t4_document
from cluster.store.results import read_results
from tests.cluster.outputs.fake_runs import Row, gpu, write_run
from tests.conftest import REPO

# The constraints of T4's results-schema.json (1.0.0, in Kernel Tuner's kernel_tuner/schema/T4),
# written out here: the version string, the required keys of each result, and their types.
T4_RESULTS_SCHEMA = {
    "type": "object",
    "properties": {
        "schema_version": {"type": "string", "pattern": "^[0-9]{1,}.[0-9]{1,}.[0-9]{1,}$"},
        "results": {"type": "array", "items": {
            "type": "object",
            "required": ["configuration", "times", "invalidity", "correctness"],
            "properties": {
                "timestamp": {"type": "string"},
                "configuration": {"type": "object"},
                "objectives": {"type": "array"},
                "times": {"type": "object", "properties": {
                    "compilation_time": {"type": "number"}, "runtimes": {"type": "array"},
                    "framework": {"type": "number"}, "search_algorithm": {"type": "number"},
                    "validation": {"type": "number"}}},
                "invalidity": {"enum": ["timeout", "compile", "runtime", "correctness", "constraints", "correct"]},
                "correctness": {"type": "number"},
                "measurements": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "value": {"type": ["number", "string", "array"]},
                    "unit": {"type": "string"}}}},
            },
        }},
    },
}

SAXPY = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")
H100 = gpu("NVIDIA H100 80GB HBM3", "9.0", "H100")
A100 = gpu("NVIDIA A100-SXM4-80GB", "8.0", "A100-80G")
ROWS = [
    Row({"BLOCK": 256, "ITEMS": 1}, (2.0, 2.1, 1.9), phase=Phase.BASELINE, energy_j=0.5, registers=16),
    Row({"BLOCK": 128, "ITEMS": 4}, (1.0, 1.1, 0.9), {"opt_level": "-Xptxas -O2"}, energy_j=0.3, registers=32),
    Row({"BLOCK": 64, "ITEMS": 8}, (), {"fast_math": "--use_fast_math"}, status=Status.COMPILE_ERROR),
    Row({"BLOCK": 512, "ITEMS": 2}, (0.5,), status=Status.VERIFY_FAILED),
    Row({"BLOCK": 128, "ITEMS": 4}, (1.0, 1.0, 1.0, 1.0, 1.0), {"opt_level": "-Xptxas -O2"}, phase=Phase.FINAL),
]


def _structure_problems(document: dict) -> list[str]:
    """The schema's constraints checked by hand, so that this test needs no jsonschema."""
    problems = []
    if not isinstance(document.get("schema_version"), str):
        problems.append("schema_version")
    for i, result in enumerate(document["results"]):
        missing = {"configuration", "times", "invalidity", "correctness"} - set(result)
        problems += [f"results[{i}].{key} missing" for key in sorted(missing)]
        if result.get("invalidity") not in T4_RESULTS_SCHEMA["properties"]["results"]["items"]["properties"][
                "invalidity"]["enum"]:
            problems.append(f"results[{i}].invalidity")
        problems += [f"results[{i}].measurements" for m in result.get("measurements", [])
                     if not (isinstance(m["name"], str) and isinstance(m["unit"], str))]
    return problems


@pytest.fixture
def study_rows(tmp_path):
    return read_results(write_run(tmp_path, "run-h100", SAXPY, H100, ROWS))


def test_document_follows_the_t4_schema(study_rows):
    document = json.loads(json.dumps(t4_document(study_rows), allow_nan=False))
    assert document["schema_version"] == T4_VERSION
    assert _structure_problems(document) == []
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(document, T4_RESULTS_SCHEMA)


def test_one_result_per_candidate_with_its_configuration_status_and_times(study_rows):
    results = t4_document(study_rows)["results"]
    assert len(results) == 4  # the final re-measurement is of a candidate already listed
    baseline, tuned, broken, wrong = results
    assert wrong["configuration"]["BLOCK"] == 512 and wrong["times"]["runtimes"] == [0.5]
    assert baseline["configuration"] == {"BLOCK": 256, "ITEMS": 1, "flag:opt_level": "", "flag:maxrregcount": "",
                                         "flag:fast_math": "", "flag:dlcm": "", "flag:extra_vectorization": ""}
    assert tuned["configuration"]["flag:opt_level"] == "-Xptxas -O2"
    assert [r["invalidity"] for r in results] == ["correct", "correct", "compile", "correctness"]
    assert [r["correctness"] for r in results] == [1, 1, 0, 0]
    assert tuned["objectives"] == ["time"]
    assert tuned["times"]["compilation"] == 1500.0 and tuned["times"]["benchmark"] == 250.0  # milliseconds
    assert tuned["times"]["validation"] == 50.0 and tuned["times"]["runtimes"] == [1.0, 1.1, 0.9]
    measured = {m["name"]: (m["value"], m["unit"]) for m in tuned["measurements"]}
    assert measured["time"] == (1.0, "ms") and measured["speedup"] == (2.0, "")
    assert measured["energy"] == (0.3, "J") and measured["registers"] == (32, "")
    assert broken["times"]["runtimes"] == [] and "time" not in {m["name"] for m in broken["measurements"]}
    assert tuned["timestamp"].startswith("2023-11-14T22:13")


def test_metadata_names_the_device_and_the_study(study_rows):
    metadata = t4_document(study_rows)["metadata"]
    assert metadata["environment"]["device_query"]["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert metadata["environment"]["device_query"]["compute_capability"] == "9.0"
    assert metadata["warpfleet"]["device_type"] == H100.device_type and metadata["warpfleet"]["arch"] == "sm_90"


def test_two_studies_are_refused_and_the_cli_picks_one(tmp_path, study_rows):
    import pandas as pd

    other = read_results(write_run(tmp_path, "run-a100", SAXPY, A100, ROWS[:2]))
    with pytest.raises(ValueError, match="one target on one device type"):
        t4_document(pd.concat([study_rows, other]))
    write_run(tmp_path, "both", SAXPY, H100, ROWS)
    run = write_run(tmp_path, "both", SAXPY, A100, ROWS[:2])  # one run holding two studies
    runner = CliRunner()
    refused = runner.invoke(main, ["export", str(run), "--format", "t4"])
    assert refused.exit_code == 2 and "--format" in refused.output and "--device" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    out = tmp_path / "a100.json"
    picked = runner.invoke(main, ["export", str(run), "--format", "t4", "--device", "a100", "--output", str(out)])
    assert picked.exit_code == 0, picked.output
    document = json.loads(out.read_text())
    assert document["metadata"]["warpfleet"]["device_type"] == A100.device_type and len(document["results"]) == 2


def test_every_status_has_its_invalidity():
    """A row of any status exports (metric_invalid, too_many_files and clock_mismatch raised KeyError)."""
    from cluster.core.types import Status
    from cluster.outputs.exports.t4 import INVALIDITY

    assert set(INVALIDITY) == set(Status)
