"""The report's figures, drawn with matplotlib's Agg backend into PNG files.

Each function takes plain data, writes one PNG and returns its path, or None when there is nothing
to draw (the report then says so in words instead of showing an empty figure).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display; before pyplot is imported

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm

from cluster.core.types import BestConfig
from cluster.outputs.compare import Matrix
from cluster.store.select import pareto_front

DPI = 110
plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3})


def short_device(device_type: str, width: int = 22) -> str:
    """``NVIDIA H100 80GB HBM3 (sm_90)`` -> ``H100 80GB HBM3\\n(sm_90)``, wrapped to ``width``."""
    name = device_type.removeprefix("NVIDIA ")
    return "\n".join(textwrap.wrap(name, width)) or device_type


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def _grid(count: int, ncols: int, width: float, height: float) -> tuple[plt.Figure, list[plt.Axes]]:
    ncols = min(ncols, count)
    nrows = math.ceil(count / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                             constrained_layout=True)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def speedup_plot(best: Sequence[BestConfig], path: Path) -> Path | None:
    """Grouped bars: each target's winner per device type, as times the baseline."""
    if not best:
        return None
    targets = sorted({b.target for b in best})
    devices = sorted({b.device_type for b in best})
    width = 0.8 / len(devices)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(targets) * max(1, len(devices)) ** 0.5 + 2), 4.2))
    x = np.arange(len(targets))
    for i, device in enumerate(devices):
        values = [next((b.speedup for b in best if b.target == t and b.device_type == device), np.nan)
                  for t in targets]
        bars = ax.bar(x + (i - (len(devices) - 1) / 2) * width, values, width, label=short_device(device, 40))
        ax.bar_label(bars, labels=[f"{v:.2f}x" if np.isfinite(v) else "" for v in values], fontsize=8, padding=2)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(x, targets, rotation=20 if len(targets) > 4 else 0, ha="right" if len(targets) > 4 else "center")
    ax.set_ylabel("speedup over the baseline (x, higher is better)")
    ax.set_title("Best configuration per target and device type")
    ax.margins(y=0.15)
    ax.legend(title="device type", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def heatmap(matrix: Matrix, path: Path) -> Path | None:
    """The portability matrix: share of each device type's own best, configurations by row."""
    if not matrix.devices or not matrix.configs:
        return None
    shares = np.array([[c.share if (c := matrix.cells.get((cfg.config_id, d))) and c.share is not None else np.nan
                        for d in matrix.devices] for cfg in matrix.configs], dtype=float)
    finite = shares[np.isfinite(shares)]
    low = min(0.5, float(finite.min())) if finite.size else 0.5
    high = max(1.1, float(finite.max())) if finite.size else 1.1
    fig, ax = plt.subplots(figsize=(2.2 + 1.9 * len(matrix.devices), 1.4 + 0.6 * len(matrix.configs)))
    image = ax.imshow(np.ma.masked_invalid(shares), cmap="RdYlGn", norm=TwoSlopeNorm(1.0, low, high), aspect="auto")
    ax.set_facecolor("#dddddd")
    for (i, j), value in np.ndenumerate(shares):
        cell = matrix.cells.get((matrix.configs[i].config_id, matrix.devices[j]))
        text = f"{100 * value:.1f}%" if np.isfinite(value) else ("n/a" if cell is None else
                                                                 "\n".join(textwrap.wrap(cell.how, 14)))
        dark = np.isfinite(value) and abs(image.norm(value) - 0.5) > 0.35  # the ends of the colour map
        ax.text(j, i, text, ha="center", va="center", fontsize=9, color="white" if dark else "black")
    ax.set_xticks(range(len(matrix.devices)), [short_device(d, 18) for d in matrix.devices])
    ax.set_yticks(range(len(matrix.configs)), ["\n".join(textwrap.wrap(c.label, 34)) for c in matrix.configs])
    ax.set_xlabel("measured on")
    ax.grid(False)
    ax.set_title(f"{matrix.target}: share of each device type's own best")
    fig.colorbar(image, ax=ax, label="share of the own best (1.0 = 100%)", shrink=0.9)
    return _save(fig, path)


def best_so_far(studies: dict[str, dict[str, pd.DataFrame]], path: Path,
                selected: dict[str, dict[str, float]] | None = None) -> Path | None:
    """Per target, one line per study (device type, run): the best speedup among the search's
    correct rows by each moment of the search (one run each, on seed 0), against seconds since the
    study's first measurement; and, dotted in the line's colour, the speedup of the configuration
    the selection chose (``selected[target][label]``: the report's table's number), which the
    finals' re-measurements decide and the search's best may overstate."""
    targets = {t: lines for t, lines in studies.items() if any(len(rows) for rows in lines.values())}
    if not targets:
        return None
    fig, axes = _grid(len(targets), 2, 5.6, 3.4)
    for ax, (target, lines) in zip(axes, sorted(targets.items()), strict=True):
        for label, rows in sorted(lines.items()):
            name = short_device(label, 40).replace("\n", " ")
            ok = rows[(rows["status"] == "ok") & rows["speedup"].notna() & rows["finished_at"].notna()]
            ok = ok.sort_values("finished_at")
            if ok.empty:
                continue
            seconds = (ok["finished_at"] - rows["started_at"].min()).dt.total_seconds()
            [line] = ax.step(seconds, ok["speedup"].cummax(), where="post", marker=".", markersize=4,
                             label=f"{name}: search")
            chosen = (selected or {}).get(target, {}).get(label)
            if chosen is not None and np.isfinite(chosen):
                ax.axhline(chosen, color=line.get_color(), linestyle=":", linewidth=1.2,
                           label=f"{name}: selected, {chosen:.2f}x")
        ax.set_title(target)
        ax.set_xlabel("time since the study's first measurement (s)")
        ax.set_ylabel("best speedup so far (x)")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Search progress: best search row so far; dotted: the selected configuration")
    return _save(fig, path)


def time_energy(studies: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Per study with NVML energy: every correct candidate's time against its energy per sample,
    the Pareto front joined, the baseline marked."""
    measured = {label: rows for label, rows in studies.items()
                if rows["energy_j"].notna().any() and (rows["status"] == "ok").any()}
    if not measured:
        return None
    fig, axes = _grid(len(measured), 2, 5.2, 3.6)
    for ax, (label, rows) in zip(axes, sorted(measured.items()), strict=True):
        ok = rows[(rows["status"] == "ok") & rows["energy_j"].notna() & (rows["phase"] != "final")]
        unit = str(rows["unit"].iloc[0])
        ax.scatter(ok["median"], 1000 * ok["energy_j"], s=14, alpha=0.5, color="tab:blue", label="candidates")
        front = pareto_front(rows)
        ax.plot(front["median"], 1000 * front["energy_j"], "o-", color="tab:red", markersize=5, label="Pareto front")
        base = ok[ok["phase"] == "baseline"]
        if len(base):
            ax.scatter(base["median"], 1000 * base["energy_j"], marker="*", s=140, color="black", label="baseline",
                       zorder=3)
        ax.set_title(short_device(label, 60).replace("\n", " "), fontsize=10)
        ax.set_xlabel(f"time per sample ({unit})")
        ax.set_ylabel("energy per sample (mJ)")
        ax.legend(fontsize=7)
    fig.suptitle("Time against energy (lower left is better)")
    return _save(fig, path)


def importance(importances: dict[str, dict[str, float]], path: Path) -> Path | None:
    """Per study, Optuna's parameter importances as horizontal bars (largest on top)."""
    shown = {label: values for label, values in importances.items() if values}
    if not shown:
        return None
    tallest = max(len(v) for v in shown.values())
    fig, axes = _grid(len(shown), 2, 5.4, 1.4 + 0.32 * tallest)
    for ax, (label, values) in zip(axes, sorted(shown.items()), strict=True):
        names = sorted(values, key=values.get)
        ax.barh([_param_label(n) for n in names], [values[n] for n in names], color="tab:purple")
        ax.set_xlim(0, 1)
        ax.set_xlabel("importance (Optuna's evaluator, normalized to sum to 1)")
        ax.set_title(short_device(label, 60).replace("\n", " "), fontsize=10)
        ax.grid(axis="y", visible=False)
    fig.suptitle("Parameter importance (Optuna)")
    return _save(fig, path)


def _param_label(name: str) -> str:
    """``flag:opt_level`` -> ``opt_level (flag)``; ``param:TILE`` -> ``TILE``."""
    kind, _, rest = name.partition(":")
    return f"{rest} (flag)" if kind == "flag" else (rest or name)
