"""The markdown report: the setting (cards, date, versions, command, budgets) and three tables (the
spaces and their optimum; one GPU; two GPUs), from ``analysis.summary`` and the run's meta.json."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

TOOL_NAMES = {"warpfleet": "warpfleet", "kernel_tuner": "Kernel Tuner"}


VARIANTS = {"shipped": "parallel mode as shipped", "repaired": "parallel mode repaired"}


def tool_label(tool: str, variant: str) -> str:
    name = TOOL_NAMES.get(tool, tool)
    return f"{name} ({VARIANTS.get(variant, variant)})" if variant else name


def target(r: dict[str, Any], strategy: str) -> str:
    if not r.get("reference", True):
        return "no reference"
    prefix = f"target_{strategy}"
    return seconds(r.get(f"{prefix}_s"), r.get(f"{prefix}_reached"), r.get(f"{prefix}_runs"))


def seconds(value: Any, reached: Any = None, runs: Any = None) -> str:
    """``12.3 s (4/5)``: a censored median, with how many runs reached the target."""
    count = f" ({int(reached)}/{int(runs)})" if runs is not None and not _missing(runs) else ""
    if runs is not None and not _missing(runs) and int(runs) == 0:
        return "not run"
    if _missing(value):
        return "–" + count
    if math.isinf(value):
        return "not reached" + count
    return f"{value:.1f} s{count}"


def failed(r: dict[str, Any]) -> str:
    return f"every run ({int(r.get('errors', 0))}) ended in an error: `{r.get('error', '')}`"


def number(value: Any, fmt: str = "{:.1f}", suffix: str = "") -> str:
    return "–" if _missing(value) else fmt.format(value) + suffix


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def header(meta: dict[str, Any]) -> list[str]:
    cards = "; ".join(f"{c.get('name')} (GPU {c.get('index')})" for c in meta.get("gpus", [])) or "unknown"
    v = meta.get("versions", {})
    s = meta.get("settings", {})
    return [
        f"- Card(s): {cards}; driver {meta.get('driver', '?')}; {meta.get('cpus', '?')} CPU cores on the host.",
        f"- Date: {meta.get('date', '?')}.",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        f"- Command: `{meta.get('command', '?')}`",
        f"- Each tuning run: at most {s.get('max_evals')} configurations and {s.get('run_limit_s')} s "
        f"(Kernel Tuner's max_fevals and time_limit; warpfleet's trials, baseline included, and time budget); "
        f"seeds {meta.get('seeds')}, {meta.get('repeats')} runs of seed 0 for the winner's stability; "
        f"1-GPU lanes {meta.get('lanes', '?')}.",
    ]


def spaces_table(best: pd.DataFrame) -> list[str]:
    lines = ["| kernel | configurations | correct | optimum (ms) | optimum | within 1% |", "|---|---|---|---|---|---|"]
    for r in best.to_dict("records"):
        lines.append(f"| {r['kernel']} | {r['configs']} | {r['ok']} | {number(r.get('optimum_ms'), '{:.4f}')} | "
                     f"`{r.get('optimum_key', '–')}` | {number(r.get('within_1pct'), '{:.0f}')} |")
    return lines


def one_gpu_table(summary: pd.DataFrame) -> list[str]:
    lines = ["| kernel | tool | configs / min | to within 1%, best strategy | to within 1%, random | "
             "winner (best, seed 0), re-measured | vs optimum | distinct winners, repeated runs |",
             "|---|---|---|---|---|---|---|---|"]
    for r in summary[summary["gpus"] == 1].to_dict("records"):
        if not r.get("runs"):
            lines.append(f"| {r['kernel']} | {tool_label(r['tool'], r['variant'])} | {failed(r)} | | | | | |")
            continue
        stable = f"{r.get('repeat_distinct_winners', '–')} in {r.get('repeat_runs', '–')} runs"
        if r.get("repeat_distinct_winners", 0) > 1:
            stable += ", all within 1%" if r.get("repeat_winners_within_1pct") else ", not within 1%"
        lines.append(
            f"| {r['kernel']} | {tool_label(r['tool'], r['variant'])} ({r.get('strategy_best', '')}) | "
            f"{number(r.get('evals_per_min'))} | {target(r, 'best')} | {target(r, 'random')} | "
            f"`{r.get('winner_key', '–')}` {number(r.get('winner_ms'), '{:.4f}', ' ms')} | "
            f"{number(r.get('winner_vs_optimum'), '{:.3f}', 'x')} | {stable} |")
    return lines


def two_gpu_table(summary: pd.DataFrame, gpus: int = 2) -> list[str]:
    lines = ["| kernel | tool | workers used / GPUs | configs / min | vs 1 GPU | efficiency | "
             "to within 1%, best (seed 0) | to within 1%, random (seed 0) |", "|---|---|---|---|---|---|---|---|"]
    for r in summary[summary["gpus"] == gpus].to_dict("records"):
        if not r.get("runs"):
            lines.append(f"| {r['kernel']} | {tool_label(r['tool'], r['variant'])} | {failed(r)} | | | | | |")
            continue
        efficiency = r.get("efficiency")
        lines.append(
            f"| {r['kernel']} | {tool_label(r['tool'], r['variant'])} | {r['workers_used']} / {r['gpus']} | "
            f"{number(r.get('evals_per_min'))} | {number(r.get('scaling'), '{:.2f}', 'x')} | "
            f"{number(100 * efficiency if efficiency is not None else None, '{:.0f}', '%')} | "
            f"{target(r, 'best')} | {target(r, 'random')} |")
    return lines


def markdown(meta: dict[str, Any], best: pd.DataFrame, summary: pd.DataFrame, blocks: pd.DataFrame,
             runs: pd.DataFrame) -> str:
    parts = ["## warpfleet and Kernel Tuner, measured", "", *header(meta), ""]
    parts += ["### The spaces and their exhaustive optimum (independent timer)", "", *spaces_table(best), ""]
    if len(summary):
        parts += ["### One GPU", "", *one_gpu_table(summary), ""]
        for gpus, title in ((2, "Two GPUs"), (4, "Four GPUs")):
            if (summary["gpus"] == gpus).any():
                parts += [f"### {title}", "", *two_gpu_table(summary, gpus), ""]
    if len(blocks):
        counts = blocks.groupby("status").size().to_dict()
        parts += ["Blocks: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + "."]
        failed = blocks[blocks["status"] == "failed"]
        for r in failed.to_dict("records"):
            parts.append(f"- failed: {r['block_id']}: {str(r['detail'])[:200]}")
    errors = runs[runs["error"].fillna("") != ""] if len(runs) else runs
    for r in errors.to_dict("records"):
        parts.append(f"- run ended in an error (left out of the figures): {r['run_id']}: {str(r['error'])[:200]}")
    return "\n".join(parts) + "\n"
