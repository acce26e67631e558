"""Provenance of agents' variants: the ``variants/`` table (one row per workflow outcome: agent,
finding, plan, diff, verification verdicts) and the accepted variants' sources under
``<run_dir>/variant_sources/<study>-<source_hash>-<n>.json``, so that a resumed sweep searches the
same variants without asking the agents again, an export can carry a winner's patch, and a winner
can be rebuilt elsewhere (``stored_variant``: compare --arch, evaluate). The sources stay out of
the ``variants/`` dataset folder, so that any Parquet reader reads that folder as it is; runs
written before kept them in ``variants/files/``, which is still read.

Results rows join this table on ``source_hash`` (the variant's bundle hash).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from cluster.config import Target
from cluster.config.target import variant_target
from cluster.core.types import Proposal
from cluster.store.rundir import RunDir

VARIANTS_DIR = RunDir.VARIANTS
_OLD_SOURCES = (RunDir.VARIANTS, "files")  # where runs before issue 17 kept the sources

VARIANT_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("target", pa.string()), ("study", pa.string()), ("source_hash", pa.string()),
    ("optimization", pa.string()), ("level", pa.string()), ("location", pa.string()), ("stage", pa.string()),
    ("analyst", pa.string()), ("planner", pa.string()), ("transformer", pa.string()), ("attempt", pa.int64()),
    ("evidence", pa.string()), ("reason", pa.string()), ("plan", pa.string()), ("description", pa.string()),
    ("diff", pa.string()), ("search", pa.string()), ("verdicts", pa.string()), ("created_at", pa.float64()),
    # an LLM agent's accounting for the proposal (agents.llm.usage_record): zeros for experts
    ("llm_model", pa.string()), ("llm_tokens_in", pa.int64()), ("llm_tokens_out", pa.int64()),
    ("llm_calls", pa.int64()), ("llm_latency_s", pa.float64()), ("llm_cost", pa.float64()),
    ("llm_exchanges", pa.string()),
    # The expensive tier's result for an admitted variant (issue 25): "" (not run: never faster than
    # the baseline, or not yet), "passed" or "failed"; each such result is a later record of the same
    # outcome, its verdicts both tiers'. ``latest_outcomes`` keeps the last record of each.
    ("checks", pa.string()),
])


@dataclass(frozen=True)
class AcceptedVariant:
    """A verified variant as the search sees it: the target with its files and searched params."""

    target: Target
    label: str  # optimization and location, for humans
    search: dict[str, tuple[int | float | str, ...]]
    files_changed: bool
    record: dict | None = field(default=None, compare=False)  # its variants-table record (admission)

    @property
    def source_hash(self) -> str:
        return self.target.bundle.hash


OUTCOME_KEY = ["study", "source_hash", "optimization", "location", "attempt"]


def latest_outcomes(variants: pd.DataFrame) -> pd.DataFrame:
    """One record per outcome: the last written (an admitted variant's checks add a later record)."""
    if variants.empty:
        return variants
    return variants.sort_values("created_at", kind="stable").drop_duplicates(OUTCOME_KEY, keep="last")


def check_states(variants: pd.DataFrame, study: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per admitted variant of ``study`` (its source hash): its checks' state ("", passed, failed)
    and its latest record, from the variants table."""
    if variants.empty:
        return {}
    mine = latest_outcomes(variants[(variants["study"] == study) & (variants["source_hash"] != "")])
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for record in mine.to_dict("records"):
        checks = str(record.get("checks") or "")
        previous = out.get(record["source_hash"])
        if previous is None or checks:  # a checked record tells more than an admission of the same sources
            out[record["source_hash"]] = (checks, record)
    return out


def _files_dir(run_dir: Path) -> Path:
    return run_dir / RunDir.VARIANT_SOURCES


def _source_dirs(run_dir: Path) -> list[Path]:
    """Where a run's variant sources may be: today's folder, then the old one."""
    return [_files_dir(run_dir), run_dir.joinpath(*_OLD_SOURCES)]


def save_accepted(run_dir: Path, study: str, variant: AcceptedVariant) -> None:
    """Atomically, like the result parts: a resume finds the whole file or none."""
    changed = dict(variant.target.bundle.files)
    payload = {"study": study, "label": variant.label, "files_changed": variant.files_changed,
               "search": {k: list(v) for k, v in variant.search.items()},
               "files": {p: changed[p].decode("utf-8", "surrogateescape") for p in variant.target.spec.sources}}
    folder = _files_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{_safe(study)}-{variant.source_hash}-{len(list(folder.iterdir()))}.json"
    tmp = folder / f".{name}.tmp"
    tmp.write_text(json.dumps(payload, sort_keys=True))
    os.replace(tmp, folder / name)


def mark_done(run_dir: Path, study: str) -> None:
    folder = _files_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{_safe(study)}.done").write_text("")


def _restore(target: Target, path: Path) -> AcceptedVariant:
    data = json.loads(path.read_text())
    files = tuple(data["files"].items()) if data["files_changed"] else ()
    search = {k: tuple(v) for k, v in data["search"].items()}
    proposal = Proposal("restored", data["label"], files, search)
    return AcceptedVariant(variant_target(target, proposal), data["label"], search, data["files_changed"])


def _number(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


def load_accepted(run_dir: Path, study: str, target: Target) -> list[AcceptedVariant] | None:
    """The accepted variants of a study whose workflow finished before; None when it did not."""
    for folder in _source_dirs(run_dir):
        if (folder / f"{_safe(study)}.done").exists():
            return [_restore(target, path) for path in sorted(folder.glob(f"{_safe(study)}-*.json"), key=_number)]
    return None


def load_admitted(run_dir: Path, study: str, target: Target) -> tuple[bool, list[AcceptedVariant]]:
    """Whether a study's workflow finished before, and the variants it had admitted by then."""
    for folder in _source_dirs(run_dir):
        paths = sorted(folder.glob(f"{_safe(study)}-*.json"), key=_number)
        done = (folder / f"{_safe(study)}.done").exists()
        if done or paths:
            return done, [_restore(target, path) for path in paths]
    return False, []


def stored_variant(run_dir: Path, target: Target, source_hash: str) -> Target | None:
    """The agent's variant of ``target`` that a run built as ``source_hash``, from the sources the run
    stored: what rebuilds a variant winner on another arch or cluster. None when the run stored no
    such variant, or when its sources no longer rebuild ``source_hash`` (the target's other files,
    its inputs, changed since the run)."""
    for folder in _source_dirs(Path(run_dir)):
        for path in sorted(folder.glob(f"*-{source_hash}-*.json"), key=_number):
            try:
                variant = _restore(target, path).target
            except (OSError, ValueError, KeyError):
                continue
            if variant.bundle.hash == source_hash:
                return variant
    return None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)


NO_SOURCE_CHANGE = "no source change"


def winner_patches(run_dir: Path, best: list) -> str:
    """The unified diff of each winner built from an agent's variant (``git apply``-able), after a
    comment naming it; a winner that changes no source gets a comment saying so. Empty when no
    winner changes a source (the caller says so rather than write an empty patch)."""
    from cluster.store.results import read_table

    variants = read_table(run_dir, VARIANTS_DIR, VARIANT_SCHEMA)
    out, diffs = [], 0
    for b in sorted(best, key=lambda b: (b.target, b.device_type)):
        noisy = " (noisy: its lead may be noise)" if getattr(b, "noisy", False) else ""
        match = variants[(variants["source_hash"] == b.source_hash) & (variants["stage"] == "accepted")] \
            if b.is_variant else variants.iloc[0:0]
        diff = str(match.iloc[0]["diff"]) if len(match) else ""
        if not b.is_variant or (len(match) and not diff.strip()):
            out.append(f"# {b.target} on {b.device_type}: {NO_SOURCE_CHANGE} (flags and defines only: "
                       f"warpfleet export --format flags){noisy}\n")
            continue
        if match.empty:
            out.append(f"# {b.target} on {b.device_type}: variant {b.source_hash} has no recorded diff\n")
            continue
        row = match.iloc[0]
        settings = " ".join(b.flag_argv + b.defines) or "no flags"
        out.append(f"# {b.target} on {b.device_type}: {row['optimization']} at {row['location']} "
                   f"(variant {b.source_hash}, {b.speedup:.2f}x with {settings}){noisy}\n" + diff)
        diffs += 1
    return "".join(out) if diffs else ""
