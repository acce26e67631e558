"""The portability matrices as markdown (for people, BENCHMARKS.md and the report) and JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import combinations
from typing import Any

from cluster.outputs.compare import Cell, Matrix, Resources, differences
from cluster.store.select import NOT_REMEASURED_MARK, NOT_REMEASURED_NOTE, noisy_advice

NOISY_MARK = "*"


def share_text(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    if cell.share is None:
        return cell.how
    text = f"{100 * cell.share:.1f}%"
    if cell.how == "own best":
        return f"**{text}** (own best)"
    return f"{text} (same run: {cell.run_id})" if cell.how == "same run" else f"{text} ({cell.how})"


def resources_text(resources: Resources | None) -> str:
    if resources is None:
        return "-"
    if resources.error:
        return resources.error
    text = f"{resources.registers} regs, {resources.spill_bytes} B spills, {resources.shared_bytes} B smem"
    return f"{text} (compile only)" if resources.compile_only else text


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|---|" + "---:|" * (len(header) - 1), *(line(r) for r in rows)]


def matrix_markdown(matrix: Matrix) -> str:
    better = "lower" if matrix.goal == "minimize" else "higher"
    lines = [f"### {matrix.target} ({matrix.unit}, {better} is better)", "",
             "Each cell: the configuration's performance on the column's device type as a share of that "
             "device type's own best (100% = as good as the configuration tuned there).", ""]
    lines += _table(["configuration", *matrix.devices],
                    [[c.label + (f" {NOISY_MARK}" if c.noisy else "")
                      + (f" {NOT_REMEASURED_MARK}" if c.unconfirmed else ""),
                      *(share_text(matrix.cells.get((c.config_id, d))) for d in matrix.devices)]
                     for c in matrix.configs])
    lines.append("")
    if any(c.noisy for c in matrix.configs):
        archs = [device.rsplit("(", 1)[-1].rstrip(")") for c in matrix.configs if c.noisy for device in c.tuned_on]
        lines += [f"{NOISY_MARK} noisy: {noisy_advice(archs)}", ""]
    if any(c.unconfirmed for c in matrix.configs):
        lines += [f"{NOT_REMEASURED_MARK}: {NOT_REMEASURED_NOTE}", ""]
    if matrix.best_worst_case:
        cid, worst, where = matrix.best_worst_case
        config = matrix.config(cid)
        lines.append(f"Best across all device types (best worst case): **{config.label}**, "
                     f"{100 * worst:.1f}% of the best at worst (on {where}): `{config.arguments}`")
    lines += [f"Note: {note}" for note in matrix.notes]
    lines += ["", "Configurations:", ""] + [f"- {c.label}: `{c.arguments}`" for c in matrix.configs]
    tuned = [c for c in matrix.configs if c.tuned_on]
    pairs = [(a, b, differences(a, b)) for a, b in combinations(tuned, 2)]
    if pairs:
        lines += ["", "What differs:", ""]
        lines += [f"- {a.label} vs {b.label}: {'; '.join(d) or 'nothing'}" for a, b, d in pairs]
    if matrix.resources:
        lines += ["", "Registers, spills and shared memory per arch (ptxas; max over kernels, spills summed):", ""]
        lines += _table(["configuration", *matrix.archs],
                        [[c.label, *(resources_text(matrix.resources.get((c.config_id, a))) for a in matrix.archs)]
                         for c in matrix.configs])
    return "\n".join(lines) + "\n"


def to_markdown(matrices: Sequence[Matrix]) -> str:
    if not matrices:
        return "No results to compare.\n"
    return "\n".join(matrix_markdown(m) for m in matrices)


def _matrix_record(matrix: Matrix) -> dict[str, Any]:
    best = matrix.best_worst_case
    return {
        "target": matrix.target, "unit": matrix.unit, "goal": matrix.goal, "devices": list(matrix.devices),
        "configs": [{"config_id": c.config_id, "label": c.label, "tuned_on": list(c.tuned_on),
                     "tuned_in": list(c.tuned_in), "noisy": c.noisy,
                     "unconfirmed": c.unconfirmed,
                     "baseline": c.is_baseline, "arguments": c.arguments, "params": dict(c.params),
                     "flags": dict(c.flag_options)} for c in matrix.configs],
        "cells": [{"config_id": cid, "device": device, "share": cell.share, "how": cell.how, "run_id": cell.run_id}
                  for (cid, device), cell in matrix.cells.items()],
        "references": matrix.references,
        "best_worst_case": {"config_id": best[0], "share": best[1], "device": best[2]} if best else None,
        "notes": list(matrix.notes),
        "resources": [{"config_id": cid, "arch": arch, "registers": r.registers, "spill_bytes": r.spill_bytes,
                       "shared_bytes": r.shared_bytes, "compile_only": r.compile_only, "error": r.error}
                      for (cid, arch), r in matrix.resources.items()],
    }


def to_json(matrices: Sequence[Matrix]) -> str:
    return json.dumps([_matrix_record(m) for m in matrices], indent=1, default=str) + "\n"
