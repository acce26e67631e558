"""Provenance of agents' variants: the ``variants/`` table (one row per workflow outcome: agent,
finding, plan, diff, verification verdicts) and the accepted variants' files under
``<run_dir>/variants/files/<source_hash>.json``, so that a resumed sweep searches the same
variants without asking the agents again, and an export can carry a winner's patch.

Results rows join this table on ``source_hash`` (the variant's bundle hash).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from agents._base import Proposal
from agents.llm.accounting import usage_record
from agents.patch import variant_target
from agents.workflow.engine import Outcome
from cluster.config import Target

VARIANTS_DIR = "variants"

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
])


@dataclass(frozen=True)
class AcceptedVariant:
    """A verified variant as the search sees it: the target with its files and searched params."""

    target: Target
    label: str  # optimization and location, for humans
    search: dict[str, tuple[int | float | str, ...]]
    files_changed: bool

    @property
    def source_hash(self) -> str:
        return self.target.bundle.hash


def outcome_record(run_id: str, study: str, target: Target, outcome: Outcome) -> dict[str, object]:
    proposal = outcome.proposal
    source_hash = ""
    if proposal is not None and proposal.files:
        try:
            source_hash = variant_target(target, proposal).bundle.hash
        except ValueError:
            source_hash = ""  # a file outside the target's sources: the guards rejected it
    diff = _diff(target, proposal.files) if proposal is not None and proposal.files else ""
    return {
        "run_id": run_id, "target": target.name, "study": study, "source_hash": source_hash,
        "optimization": outcome.finding.optimization, "level": outcome.finding.level.value,
        "location": outcome.finding.location, "stage": outcome.stage,
        "analyst": outcome.analyst, "planner": outcome.planner, "transformer": outcome.transformer,
        "attempt": outcome.attempt, "evidence": "\n".join(outcome.finding.evidence), "reason": outcome.reason,
        "plan": outcome.plan.to_json() if outcome.plan else "",
        "description": proposal.description if proposal else "", "diff": diff,
        "search": json.dumps({k: list(v) for k, v in (proposal.search_params if proposal else {}).items()}),
        "verdicts": outcome.verification.to_json() if outcome.verification else "", "created_at": time.time(),
        **usage_record(proposal if proposal is not None else Proposal("", "", ())),
    }


def _diff(target: Target, files: tuple[tuple[str, str], ...]) -> str:
    from agents.patch import source_files, unified_diff

    original = source_files(target)
    return "".join(unified_diff(path, original.get(path, ""), text) for path, text in files)


def _files_dir(run_dir: Path) -> Path:
    return run_dir / VARIANTS_DIR / "files"


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


def load_accepted(run_dir: Path, study: str, target: Target) -> list[AcceptedVariant] | None:
    """The accepted variants of a study whose workflow finished before; None when it did not."""
    folder = _files_dir(run_dir)
    if not (folder / f"{_safe(study)}.done").exists():
        return None
    variants = []
    for path in sorted(folder.glob(f"{_safe(study)}-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        data = json.loads(path.read_text())
        files = tuple(data["files"].items()) if data["files_changed"] else ()
        search = {k: tuple(v) for k, v in data["search"].items()}
        proposal = Proposal("restored", data["label"], files, search)
        variants.append(AcceptedVariant(variant_target(target, proposal), data["label"], search,
                                        data["files_changed"]))
    return variants


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in name)


def winner_patches(run_dir: Path, best: list) -> str:
    """The unified diff of each winner built from an agent's variant (``git apply``-able), or a
    comment saying that the winner uses the target's own sources."""
    from cluster.store.results import read_table

    variants = read_table(run_dir, VARIANTS_DIR, VARIANT_SCHEMA)
    out = []
    for b in sorted(best, key=lambda b: (b.target, b.device_type)):
        if not b.is_variant:
            out.append(f"# {b.target} on {b.device_type}: the target's own sources (flags only)\n")
            continue
        match = variants[(variants["source_hash"] == b.source_hash) & (variants["stage"] == "accepted")]
        if match.empty:
            out.append(f"# {b.target} on {b.device_type}: variant {b.source_hash} has no recorded diff\n")
            continue
        row = match.iloc[0]
        settings = " ".join(b.flag_argv + b.defines) or "no flags"
        out.append(f"# {b.target} on {b.device_type}: {row['optimization']} at {row['location']} "
                   f"(variant {b.source_hash}, {b.speedup:.2f}x with {settings})\n" + row["diff"])
    return "".join(out)
