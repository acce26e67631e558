"""warpfleet report: a self-contained HTML page and markdown with PNG plots, from real CPU runs and
from GPU runs written from given measurements (energy, two GPUs, three targets)."""

from __future__ import annotations

import base64
import re

import optuna
import pytest
from click.testing import CliRunner

from cluster.cli import main
from cluster.outputs import plots
from cluster.outputs.compare import build_matrices, load_run_dir
from cluster.outputs.report import importances
from tests.cluster.outputs.portability_runs import cli

PNG = b"\x89PNG\r\n\x1a\n"


def _report(tmp_path, *runs) -> tuple[str, str]:
    out = tmp_path / "report"
    cli("report", *map(str, runs), "--output", str(out))
    return (out / "report.html").read_text(), (out / "report.md").read_text()


def _images_of(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def test_html_is_self_contained_and_markdown_links_its_pngs(tmp_path, portability_cpu_runs):
    runs = portability_cpu_runs
    page, markdown = _report(tmp_path, runs["a"], runs["b"], runs["e"])
    images = _images_of(markdown)
    assert {"speedup.png", "portability_stencil_c.png", "best_so_far.png"} <= set(images)
    for name in images:
        assert (tmp_path / "report" / name).read_bytes().startswith(PNG)
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == len(images) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert all(base64.b64decode(s.split(",", 1)[1]).startswith(PNG) for s in sources)
    assert "href=" not in page and "<link" not in page  # nothing fetched from elsewhere
    assert "No energy measured" in markdown  # CPU workers: no NVML
    assert f"<strong>tuned on Other CPU (host) in {runs['a'].name}</strong>" in page  # the best worst case, in bold
    assert "not measured" in markdown and "(own best)" in markdown
    assert f"optuna-dashboard {(runs['a'] / 'optuna.journal').resolve()}" in markdown


def test_gpu_runs_get_energy_portability_and_importance_notes(tmp_path, portability_gpu_runs):
    runs = portability_gpu_runs
    page, markdown = _report(tmp_path, runs["h100"], runs["h200"], runs["eval"])
    images = set(_images_of(markdown))
    assert images == {"speedup.png", "portability_matmul.png", "portability_saxpy.png",
                      "portability_transpose.png", "best_so_far.png", "time_energy.png"}
    assert "| tuned on NVIDIA H200 (sm_90) in suite-h200 | 80.0% (via baselines) | **100.0%** (own best) |" in markdown
    assert "No study with enough trials." in markdown  # written without Optuna journals
    assert page.count("<img ") == len(images)


def test_importance_of_a_study_and_too_few_trials_said_so(tmp_path, portability_gpu_runs):
    run = portability_gpu_runs["h100"]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(run / "optuna.journal")))
    rich = optuna.create_study(study_name="saxpy@NVIDIA H100 80GB HBM3 (sm_90)", storage=storage)
    for block in (64, 128, 256, 512, 1024):  # the time depends on BLOCK only
        for dlcm in ("", "-Xptxas -dlcm=cg"):
            rich.enqueue_trial({"param:BLOCK": block, "flag:dlcm": dlcm})
            trial = rich.ask()
            value = trial.suggest_categorical("param:BLOCK", [64, 128, 256, 512, 1024])
            trial.suggest_categorical("flag:dlcm", ["", "-Xptxas -dlcm=cg"])
            rich.tell(trial, 1.0 + abs(value - 256) / 256)
    poor = optuna.create_study(study_name="matmul@NVIDIA H100 80GB HBM3 (sm_90)", storage=storage)
    for _ in range(2):
        trial = poor.ask()
        poor.tell(trial, trial.suggest_categorical("param:TILE", [8, 16]) * 1.0)
    try:
        found, notes = importances([load_run_dir(run)])
    finally:
        (run / "optuna.journal").unlink()
    assert set(found) == {"saxpy on NVIDIA H100 80GB HBM3 (sm_90)"}
    saxpy = found["saxpy on NVIDIA H100 80GB HBM3 (sm_90)"]
    assert set(saxpy) == {"param:BLOCK", "flag:dlcm"} and saxpy["param:BLOCK"] > saxpy["flag:dlcm"]
    assert notes == ["matmul on NVIDIA H100 80GB HBM3 (sm_90): 2 completed trials, too few for parameter importance"]
    image = plots.importance(found, tmp_path / "importance.png")
    assert image is not None and image.read_bytes().startswith(PNG)


def test_plots_draw_nothing_without_data(tmp_path, portability_gpu_runs):
    assert plots.speedup_plot([], tmp_path / "a.png") is None
    assert plots.best_so_far({}, tmp_path / "b.png") is None
    assert plots.time_energy({}, tmp_path / "c.png") is None
    assert plots.importance({"s": {}}, tmp_path / "d.png") is None
    assert not list(tmp_path.glob("*.png"))
    [matmul, *_] = build_matrices([load_run_dir(portability_gpu_runs["h100"])])
    image = plots.heatmap(matmul, tmp_path / "one.png")  # one device type: a single column, still drawn
    assert image is not None and image.read_bytes().startswith(PNG)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 (sm_90)", "AMD EPYC 7B13 64-Core Processor (host)"])
def test_device_labels_are_short_enough_to_read(name):
    label = plots.short_device(name)
    assert not label.startswith("NVIDIA") and all(len(line) <= 22 for line in label.splitlines())


def test_report_refuses_a_file_as_its_folder(tmp_path, portability_gpu_runs):
    target = tmp_path / "file"
    target.write_text("mine")
    result = CliRunner().invoke(main, ["report", str(portability_gpu_runs["h100"]), "--output", str(target)])
    assert result.exit_code == 2 and "--output" in result.output and "is a file" in result.output
    assert len(result.output.strip().splitlines()) == 1 and target.read_text() == "mine"


def test_the_plots_show_the_tables_speedup(tmp_path, monkeypatch):
    """Issue 26: the report's plot said 5.3x beside a table saying 1.00x. A candidate 5x faster in its
    one search run and no faster in its re-measurements: the table, the speedup plot and the
    progress plot's selected line all carry the selection's number, and the search's 5x stays a
    search row."""
    from cluster.config import load_target
    from cluster.core.types import Phase
    from cluster.outputs import report
    from tests.cluster.outputs.fake_runs import Row, gpu, write_run
    from tests.conftest import REPO

    target = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")
    base, lucky = {"BLOCK": 256, "ITEMS": 1}, {"BLOCK": 128, "ITEMS": 1}
    steady = (1.00, 1.02, 0.98, 1.01, 0.99)
    run = write_run(tmp_path, "run", target, gpu("NVIDIA H100", "9.0"),
                    [Row(base, steady, phase=Phase.BASELINE), Row(lucky, (0.19, 0.19, 0.19)),
                     Row(base, steady, phase=Phase.FINAL),
                     Row(lucky, (1.0, 0.97, 1.03, 0.99, 1.01), phase=Phase.FINAL)])
    drawn: dict = {}
    monkeypatch.setattr(plots, "speedup_plot", lambda best, path: drawn.update(bars=[b.speedup for b in best]))
    monkeypatch.setattr(plots, "best_so_far", lambda studies, path, selected=None: drawn.update(selected=selected))
    blocks = report.build([load_run_dir(run)], tmp_path / "out")
    [table] = [b for b in blocks if b.kind == "table" and "speedup" in b.header]
    [row] = table.rows
    shown = float(row[table.header.index("speedup")].rstrip("x"))
    assert shown == pytest.approx(1.0, abs=0.005)  # not the search run's 5.3x
    assert [round(v, 2) for v in drawn["bars"]] == [shown]
    [[selected]] = [list(v.values()) for v in drawn["selected"].values()]
    assert round(selected, 2) == shown
