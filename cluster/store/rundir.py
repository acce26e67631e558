"""A run directory: everything a sweep writes, and all that ``--resume``, ``show`` and ``export`` read.

    runs/<name>-<UTC time>/
        meta.json          run id, when, which config, the targets' source hashes
        config.yaml        a copy of the run config as it was given
        optuna.journal     the Optuna studies (unless search.storage names an RDB)
        results/           the Parquet dataset, one part file per flush
        references/<key>/  the baseline's output files that candidates are compared with
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.config import RunPlan
from cluster.core.errors import ConfigError


@dataclass(frozen=True)
class RunDir:
    path: Path
    run_id: str

    @classmethod
    def create(cls, plan: RunPlan, output_dir: Path | None = None) -> RunDir:
        root = output_dir or Path(plan.config.output_dir)  # relative to the working directory
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = root / f"{plan.config.name}-{stamp}"
        suffix = 1
        while path.exists():
            suffix += 1
            path = root / f"{plan.config.name}-{stamp}-{suffix}"
        path.mkdir(parents=True)
        shutil.copyfile(plan.file, path / "config.yaml")
        meta = {
            "run_id": path.name,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config_file": str(Path(plan.file).resolve()),
            "targets": {t.name: t.bundle.hash for t in plan.targets},
        }
        (path / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return cls(path, path.name)

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory; a one-line error if it is not one."""
        path = Path(path)
        meta = path / "meta.json"
        if not meta.is_file():
            raise ConfigError(path, "", "not a warpfleet run directory (no meta.json)")
        try:
            run_id = json.loads(meta.read_text())["run_id"]
        except (ValueError, KeyError):
            raise ConfigError(meta, "run_id", "missing or unreadable") from None
        return cls(path, str(run_id))
