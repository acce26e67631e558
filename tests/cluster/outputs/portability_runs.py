"""The runs the portability tests (evaluate, compare, report) read.

- ``cpu_runs``: two real sweeps of the C stencil with different flags spaces, run A relabelled as
  another machine's, and a real evaluation here of A's winner (from its JSON export) and B's
  (from its run directory);
- ``gpu_runs``: GPU sweeps on an H100 and an H200 and an evaluation of the H200's winners on the
  H100, written from given measurements (``fake_runs``), with NVML energy, for what no CPU can make.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_target
from cluster.core.types import Phase
from cluster.store.results import read_results
from tests.cluster.outputs.fake_runs import Row, gpu, relabel_device, write_run
from tests.conftest import REPO

STENCIL = REPO / "configs" / "targets" / "stencil_c"
SPACES = {"a": {"opt_level": ["", "-O3"]},  # run A: -O3 or nothing
          "b": {"opt": ["", "-O2 -fno-inline"]}}  # run B: an option run A cannot produce
OTHER = "Other CPU"


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def stencil_config(tmp_path: Path, name: str) -> Path:
    """The stencil (same source, so the same source hash) with a small grid of its own space."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(STENCIL / "stencil.c", folder / "stencil.c")
    (folder / "space.yaml").write_text(yaml.safe_dump({"name": f"space_{name}", "toolchain": "cc",
                                                       "flags": SPACES[name]}))
    target = yaml.safe_load((STENCIL / "target.yaml").read_text())
    target |= {"space": "space.yaml", "params": {"TILE": [64, 16], "UNROLL": [1]}, "defaults": {"TILE": 64},
               "constraints": []}
    (folder / "target.yaml").write_text(yaml.safe_dump(target))
    config = folder / "run.yaml"
    config.write_text(yaml.safe_dump({"name": f"run_{name}", "targets": ["target.yaml"],
                                      "search": {"sampler": "grid", "trials": 4},
                                      "measure": {"final_top_k": 1, "final_runs": 2}}))
    return config


def _sweep(tmp_path: Path, name: str) -> Path:
    out = tmp_path / f"runs_{name}"
    cli("sweep", str(stencil_config(tmp_path, name)), "--output-dir", str(out), "--no-progress")
    [run] = list(out.iterdir())
    return run


def cpu_runs(tmp: Path) -> dict:
    run_a = _sweep(tmp, "a")
    other = relabel_device(run_a, OTHER)
    run_b = _sweep(tmp, "b")
    export = tmp / "a.json"
    cli("export", str(run_a), "--format", "json", "--output", str(export))
    evaluated = cli("evaluate", str(export), str(run_b), "--output-dir", str(tmp / "eval"), "--progress")
    [run_e] = list((tmp / "eval").iterdir())
    here = str(read_results(run_b)["device_type"].iloc[0])
    return {"a": run_a, "b": run_b, "e": run_e, "other": other, "here": here, "tmp": tmp,
            "evaluate_output": evaluated}


H100 = gpu("NVIDIA H100 80GB HBM3", "9.0", "H100")
H200 = gpu("NVIDIA H200", "9.0", "H200")
TARGETS = {name: load_target(REPO / "configs" / "targets" / name / "target.yaml")
           for name in ("saxpy", "transpose", "matmul")}
# (target, baseline time, winner on H100 and on H200: params, flags, time)
WINNERS = {
    "saxpy": ({"BLOCK": 256, "ITEMS": 1}, 2.0, ({"BLOCK": 128, "ITEMS": 4}, {"opt_level": "-Xptxas -O2"}, 1.0),
              ({"BLOCK": 512, "ITEMS": 2}, {}, 0.8)),
    "transpose": ({"TILE": 32, "BLOCK_ROWS": 8}, 1.0, ({"TILE": 32, "BLOCK_ROWS": 4}, {}, 0.5),
                  ({"TILE": 16, "BLOCK_ROWS": 8}, {"fast_math": "--use_fast_math"}, 0.4)),
    "matmul": ({"TILE": 16, "WPT": 1, "UNROLL": 1}, 4.0, ({"TILE": 32, "WPT": 4, "UNROLL": 2}, {}, 1.0),
               ({"TILE": 32, "WPT": 8, "UNROLL": 4}, {"maxrregcount": "-maxrregcount=64"}, 0.9)),
}
# the H200's winners measured on the H100 (matmul's is not: a missing cell)
ON_H100 = {"saxpy": 1.25, "transpose": 0.625}


def _sweep_rows(target: str, device: int) -> list[Row]:
    base, base_time, *winners = WINNERS[target]
    params, flags, best = winners[device]
    scale = 0.9 if device else 1.0  # the H200 a little faster
    rows = [Row(base, (base_time * scale,) * 3, phase=Phase.BASELINE, energy_j=0.5 * base_time * scale)]
    first, values = next(iter(TARGETS[target].spec.params.items()))
    for i, step in enumerate((0.9, 0.7, 0.6, 0.55)):  # the search finds better and better, four distinct points
        rows.append(Row(base | {first: values[i % 2]}, (base_time * step * scale,),
                        {"dlcm": ["-Xptxas -dlcm=ca", "-Xptxas -dlcm=cg"][i // 2]},
                        energy_j=0.4 * base_time * step * (1.2 if i % 2 else 1.0)))
    rows.append(Row(params, (best,), flags, energy_j=0.3 * best))
    rows += [Row(params, (best,) * 5, flags, phase=Phase.FINAL, energy_j=0.3 * best),
             Row(base, (base_time * scale,) * 5, phase=Phase.FINAL)]
    return rows


def gpu_runs(tmp: Path) -> dict:
    runs = {}
    for name, device, index in (("h100", H100, 0), ("h200", H200, 1)):
        for target in TARGETS:
            runs[name] = write_run(tmp, f"suite-{name}", TARGETS[target], device, _sweep_rows(target, index),
                                   t0=1_700_000_000.0 + index * 1000)
    origins = []
    for target, seconds in ON_H100.items():
        base, base_time, _, (params, flags, _) = WINNERS[target]
        target_obj = TARGETS[target]
        runs["eval"] = write_run(tmp, "suite-eval-h100", target_obj, H100, [
            Row(base, (base_time,) * 5, phase=Phase.BASELINE),
            Row(params, (seconds,) * 5, flags, phase=Phase.EVALUATE)],
            meta={"kind": "evaluate"})
        full = {name: flags.get(name, "") for name in target_obj.space.flags}
        origins.append({"target": target, "flags": list(full.items()), "params": list(params.items()),
                        "tuned_on": H200.device_type, "run_id": "suite-h200", "source_hash": target_obj.bundle.hash})
    meta_path = runs["eval"] / "meta.json"
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"evaluated": origins}))
    return runs
