"""The issue's sweep on a C target without ``{seed}`` (tests/fixtures/attacks/sweep_cheats.c), the
settings left at their defaults but for a grid of its four variants: a liar behind a first run's
warm-up, a cache kept across runs and the real 3x win. Before, the liar was selected (57,089,851x
with its 1e-6 ms; a third here) and the cache at 465x; now the real win is selected, the liar's
finals are ``clock_mismatch`` and the cache is never found."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from cluster.config import SandboxSpec
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.sandbox import SandboxError
from tests.conftest import REPO, repo_pythonpath

pytestmark = pytest.mark.own_ray


@pytest.mark.parametrize("seeded", [False, True])
def test_the_real_win_is_selected_and_neither_the_liar_nor_the_cache(tmp_path, seeded):
    """``seeded``: the run command takes ``{seed}`` (the program ignores it): the finals then extend
    the reference with the baseline's outputs on their seeds, and that reference once lost its clock."""
    try:
        start_bubblewrap(SandboxSpec())
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    folder = tmp_path / "targets" / "cheats"
    folder.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "fixtures" / "attacks" / "sweep_cheats.c", folder / "cheats.c")
    (folder / "space.yaml").write_text("name: one\ntoolchain: cc\nflags: {opt_level: ['-O1']}\n")
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "name": "cheats", "toolchain": "cc", "space": "space.yaml", "sources": ["cheats.c"],
        "run": ["{binary}", *(["{seed}"] if seeded else [])],
        "verify": {"outputs": ["out.bin"]}, "params": {"ATTACK": [0, 1, 2, 3]}, "timeouts": {"build": 60, "run": 30}}))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"name": "cheats", "targets": ["targets/cheats/target.yaml"],
                                      "output_dir": str(tmp_path / "runs"), "search": {"sampler": "grid", "trials": 4},
                                      "profile": {"candidates": "none"}}))
    env = {**os.environ, "PYTHONPATH": repo_pythonpath()}
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "sweep", str(config), "--no-progress"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    from cluster.store.results import read_results
    from cluster.store.select import select_best

    rows = read_results(next((tmp_path / "runs").iterdir()))
    mode = rows["p_ATTACK"]
    table = rows[["phase", "p_ATTACK", "status", "error_tail"]].to_string()
    best = select_best(rows)
    assert [b.params.get("ATTACK") for b in best] == [3], f"{best}\n{table}"
    liar = rows[(mode == 1) & (rows["phase"] == "final")]
    assert liar.empty or set(liar["status"]) == {"clock_mismatch"}, table
    cached = rows[mode == 2]
    assert all(min(s) > 1 for s in cached["samples"] if len(s)), table  # never 0.001 ms: no cache found
