"""``warpfleet report``: one or more runs as a self-contained HTML page and markdown with PNG plots.

    <out>/report.html   the PNGs embedded as data: URIs; open it anywhere, mail it
    <out>/report.md     the same text, its images the PNG files beside it
    <out>/*.png         speedup per target and device type, a portability heatmap per target,
                        best-so-far per study, time against energy, parameter importance

The content is built once as a list of blocks (headings, paragraphs, tables, images, code) and
written in both formats.
"""

from __future__ import annotations

import base64
import html
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import pandas as pd
import yaml

from cluster.core.encodings import readable_configuration
from cluster.core.types import BestConfig, Phase
from cluster.outputs import plots
from cluster.outputs.compare import Matrix, Run, add_resources, build_matrices, differences, load_run_dir
from cluster.outputs.compare_text import resources_text, share_text
from cluster.outputs.exports.bundle import slug
from cluster.store.check import bad_journal
from cluster.store.journal import journal_problem
from cluster.store.rundir import RunDir, is_current_study, read_generations
from cluster.store.select import NOT_REMEASURED_MARK, NOT_REMEASURED_NOTE, load_verified, select_best

MIN_TRIALS = 5  # fewer completed trials than this: no parameter importance for the study


@dataclass(frozen=True)
class Block:
    kind: str  # h1, h2, h3, p, table, img, code
    text: str = ""
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> Block:
    return Block("table", header=tuple(header), rows=tuple(tuple(r) for r in rows))


# -- content -----------------------------------------------------------------------------------
def _winners(runs: Sequence[Run]) -> list[tuple[Run, BestConfig]]:
    """Each sweep study's winner; an evaluation run's best only where no sweep is given."""
    sweeps = [run for run in runs if not run.is_evaluation] or list(runs)
    return [(run, best) for run in sweeps for best in select_best(run.rows, load_verified(run.path))]


def _summary(runs: Sequence[Run], out: Path) -> list[Block]:
    blocks = [Block("h1", "warpfleet report"),
              _table(["run", "kind", "device types", "rows"],
                     [[r.run_id, "evaluation" if r.is_evaluation else "sweep",
                       ", ".join(sorted(set(r.rows["device_type"]))) if len(r.rows) else "-", str(len(r.rows))]
                      for r in runs])]
    winners = _winners(runs)
    blocks.append(Block("h2", "Speedup per target and device type"))
    if not winners:
        return [*blocks, Block("p", "No correct candidate in these runs.")]
    blocks.append(_table(["target", "device type", "run", "baseline", "best", "speedup", "configuration"], [
        [b.target, b.device_type, r.run_id, f"{b.baseline_median:.4g} {b.unit}",
         f"{b.median:.4g} {b.unit}" + ("" if b.remeasured else f" {NOT_REMEASURED_MARK}"),
         f"{b.speedup:.2f}x", readable_configuration(b.flag_argv, b.params, b.is_variant) or "(baseline)"]
        for r, b in winners]))
    blocks.append(Block("p", "Each speedup is the selected configuration's median over its re-measurements on "
                             "fresh seeds against the baseline's (the same number in the plot below and, dotted, "
                             "in the search progress, whose lines are the search's single runs)."))
    if not all(b.remeasured for _, b in winners):
        blocks.append(Block("p", f"{NOT_REMEASURED_MARK}: {NOT_REMEASURED_NOTE}."))
    blocks += [Block("p", f"{b.target} on {b.device_type}: {b.reason}") for _, b in winners if b.fastest]
    image = plots.speedup_plot([b for _, b in winners], out / "speedup.png")
    return [*blocks, *([Block("img", image.name)] if image else [])]


def _portability(matrices: Sequence[Matrix], out: Path) -> list[Block]:
    blocks = [Block("h2", "Portability"),
              Block("p", "Each cell: the configuration's performance on the column's device type as a share of "
                         "that device type's own best (100% = as good as the configuration tuned there; "
                         "published cross-architecture reuse kept 58.5-99.9%, BAT 2.0).")]
    for matrix in matrices:
        better = "lower" if matrix.goal == "minimize" else "higher"
        blocks += [Block("h3", f"{matrix.target} ({matrix.unit}, {better} is better)"),
                   _table(["configuration", *matrix.devices],
                          [[c.label, *(share_text(matrix.cells.get((c.config_id, d))) for d in matrix.devices)]
                           for c in matrix.configs])]
        if matrix.best_worst_case:
            cid, worst, where = matrix.best_worst_case
            config = matrix.config(cid)
            blocks.append(Block("p", f"Best worst case: **{config.label}**, {100 * worst:.1f}% of the best at "
                                     f"worst (on {where}): `{config.arguments}`"))
        blocks += [Block("p", f"Note: {note}") for note in matrix.notes]
        tuned = [c for c in matrix.configs if c.tuned_on]
        pairs = [f"{a.label} vs {b.label}: {'; '.join(differences(a, b)) or 'nothing'}"
                 for i, a in enumerate(tuned) for b in tuned[i + 1:]]
        blocks += [Block("p", f"What differs: {pair}") for pair in pairs]
        if matrix.resources:
            blocks.append(_table(["ptxas: configuration", *matrix.archs],
                                 [[c.label, *(resources_text(matrix.resources.get((c.config_id, a)))
                                              for a in matrix.archs)] for c in matrix.configs]))
        image = plots.heatmap(matrix, out / f"portability_{slug(matrix.target)}.png") if len(matrix.devices) > 1 \
            else None
        blocks += [Block("img", image.name)] if image else []
    return blocks


def _studies(runs: Sequence[Run]) -> dict[str, pd.DataFrame]:
    """Search rows (and the baseline) of each sweep study, labelled ``target on device`` and,
    where several runs hold one study, the run."""
    studies: dict[str, pd.DataFrame] = {}
    sweeps = [r for r in runs if not r.is_evaluation and len(r.rows)]
    for run in sweeps:
        rows = run.rows[run.rows["phase"].isin([Phase.BASELINE.value, Phase.SEARCH.value])]
        for (target, device), group in rows.groupby(["target", "device_type"], sort=True):
            label = f"{target} on {device}" + (f" [{run.run_id}]" if len(sweeps) > 1 else "")
            studies[label] = group
    return studies


def _progress(runs: Sequence[Run], out: Path) -> list[Block]:
    by_target: dict[str, dict[str, pd.DataFrame]] = {}
    for label, rows in _studies(runs).items():
        by_target.setdefault(str(rows["target"].iloc[0]), {})[label.split(" on ", 1)[1]] = rows
    sweeps = [r for r in runs if not r.is_evaluation and len(r.rows)]
    selected: dict[str, dict[str, float]] = {}
    for run, best in _winners(runs):  # the table's numbers, keyed as _studies labels the lines
        label = best.device_type + (f" [{run.run_id}]" if len(sweeps) > 1 else "")
        selected.setdefault(best.target, {})[label] = best.speedup
    image = plots.best_so_far(by_target, out / "best_so_far.png", selected)
    return [Block("h2", "Search progress"),
            Block("img", image.name) if image else Block("p", "No search rows in these runs.")]


def _energy(runs: Sequence[Run], out: Path) -> list[Block]:
    image = plots.time_energy(_studies(runs), out / "time_energy.png")
    return [Block("h2", "Time and energy"),
            Block("img", image.name) if image else
            Block("p", "No energy measured: NVML energy comes from GPU workers only.")]


def _storage(run: Run) -> optuna.storages.BaseStorage | str | None:
    journal = run.path / RunDir.JOURNAL
    if journal.is_file():
        return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    config = run.path / RunDir.CONFIG
    data = yaml.safe_load(config.read_text()) if config.is_file() else {}
    return ((data or {}).get("search") or {}).get("storage")


def importances(runs: Sequence[Run]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Optuna's parameter importances per study of each sweep, and why some have none."""
    found: dict[str, dict[str, float]] = {}
    notes = []
    sweeps = [r for r in runs if not r.is_evaluation]
    for run in sweeps:
        storage = _storage(run)
        if storage is None:
            continue
        generations = read_generations(run.path)
        for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
            if not is_current_study(summary.study_name, generations):
                continue  # superseded by a resume with --accept-changes
            label = summary.study_name.replace("@", " on ", 1) + (f" [{run.run_id}]" if len(sweeps) > 1 else "")
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            complete = [t for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
            if len({t.number for t in complete}) < MIN_TRIALS:
                notes.append(f"{label}: {len(complete)} completed trials, too few for parameter importance")
                continue
            sign = -1.0 if study.directions[0] is optuna.study.StudyDirection.MAXIMIZE else 1.0
            try:
                with warnings.catch_warnings():  # PED-ANOVA's reminder that low is good: made true by sign
                    warnings.simplefilter("ignore", UserWarning)
                    found[label] = optuna.importance.get_param_importances(
                        study, target=lambda t, sign=sign: sign * t.values[0])
            except Exception as exc:  # whatever the evaluator cannot do is a note, never a lost report
                notes.append(f"{label}: no parameter importance ({type(exc).__name__}: {exc})")
    return found, notes


def _importance(runs: Sequence[Run], out: Path) -> list[Block]:
    found, notes = importances(runs)
    image = plots.importance(found, out / "importance.png")
    blocks = [Block("h2", "Parameter importance")]
    blocks.append(Block("img", image.name) if image else Block("p", "No study with enough trials."))
    blocks += [Block("p", note) for note in notes]
    return blocks


def _dashboard(runs: Sequence[Run]) -> list[Block]:
    commands = [f"optuna-dashboard {(r.path / RunDir.JOURNAL).resolve()}" for r in runs
                if (r.path / RunDir.JOURNAL).is_file()]
    if not commands:
        return []
    return [Block("h2", "The Optuna studies"),
            Block("p", "Open them in optuna-dashboard (pip install optuna-dashboard; it serves on "
                       "http://127.0.0.1:8080):"), Block("code", "\n".join(commands))]


def build(runs: Sequence[Run], out: Path) -> list[Block]:
    matrices = [add_resources(m, runs) for m in build_matrices(runs)]
    return [*_summary(runs, out), *_portability(matrices, out), *_progress(runs, out), *_energy(runs, out),
            *_importance(runs, out), *_dashboard(runs)]


# -- rendering ---------------------------------------------------------------------------------
def to_markdown(blocks: Sequence[Block]) -> str:
    parts = []
    for block in blocks:
        if block.kind in ("h1", "h2", "h3"):
            parts.append("#" * int(block.kind[1]) + " " + block.text)
        elif block.kind == "p":
            parts.append(block.text)
        elif block.kind == "code":
            parts.append(f"```\n{block.text}\n```")
        elif block.kind == "img":
            parts.append(f"![{block.text}]({block.text})")
        else:
            cells = [list(block.header), *map(list, block.rows)]
            lines = ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
            lines.insert(1, "|" + "---|" * len(block.header))
            parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _inline(text: str) -> str:
    """Escaped text with the two markdown marks this report uses: **bold** and `code`."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


_STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px}
th{background:#f0f0f0;text-align:left}td{vertical-align:top}img{max-width:100%;height:auto;margin:1em 0}
code,pre{background:#f6f6f6;font-family:ui-monospace,monospace}pre{padding:0.8em;overflow-x:auto}"""


def to_html(blocks: Sequence[Block], folder: Path) -> str:
    body = []
    for block in blocks:
        if block.kind in ("h1", "h2", "h3"):
            body.append(f"<{block.kind}>{html.escape(block.text)}</{block.kind}>")
        elif block.kind == "p":
            body.append(f"<p>{_inline(block.text)}</p>")
        elif block.kind == "code":
            body.append(f"<pre><code>{html.escape(block.text)}</code></pre>")
        elif block.kind == "img":
            data = base64.b64encode((folder / block.text).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(block.text)}" src="data:image/png;base64,{data}">')
        else:
            head = "".join(f"<th>{html.escape(c)}</th>" for c in block.header)
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in block.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>warpfleet report</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(run_paths: Sequence[str | Path], out: Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` (and the PNGs) for the runs into ``out``."""
    runs = [load_run_dir(p) for p in run_paths]
    for run in runs:  # a damaged journal is one line before anything is written, as a damaged part is
        if problem := journal_problem(journal := run.path / RunDir.JOURNAL):
            raise bad_journal(journal, problem)
    out.mkdir(parents=True, exist_ok=True)
    blocks = build(runs, out)
    markdown, page = out / "report.md", out / "report.html"
    markdown.write_text(to_markdown(blocks))
    page.write_text(to_html(blocks, out))
    return page, markdown
