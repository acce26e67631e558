"""The LLM agents' prompts are package data: a wheel of warpfleet carries them, and the LLM steps of
an install made from it (no checkout beside it) find them, as ``llm.prompts_dir`` still overrides."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO

# Run from the installed copy: the LLM steps of every optimization check their prompt files.
CHECK = """
import agents, sys
from agents.llm import LLMSpec, build_steps
from cluster.core.registry import EXPERTS
llm = {"analyst": "llm", "planner": "llm", "transformer": "llm"}
spec = LLMSpec(model="m", api_key_env=None, base_url="http://127.0.0.1:9/v1", prompts_dir=sys.argv[1] or None)
steps = build_steps(spec, {name: llm for name in EXPERTS})
print(agents.__file__)
print(steps[0].transformer.kit.prompts.root)
"""


def _wheel(tmp_path: Path) -> Path:
    """A wheel built from a copy of the checkout's packaged parts (no build files left in it)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("cluster", "agents", "search_spaces"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, timeout=240, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("warpfleet-*.whl")
    return wheel


def _check(site: Path, prompts_dir: str = "") -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", CHECK, prompts_dir], cwd=site.parent, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_an_install_from_the_wheel_finds_the_prompts_in_itself_and_prompts_dir_overrides(tmp_path):
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name.removeprefix("agents/prompts/") for name in archive.namelist()
                   if name.startswith("agents/prompts/")}
        assert shipped == {p.name for p in (REPO / "agents" / "prompts").glob("*.md")} and "_base.md" in shipped
        site = tmp_path / "site"  # what `pip install --target site` of the wheel lays down
        archive.extractall(site)
    installed, root = _check(site)
    assert Path(installed).is_relative_to(site) and Path(root) == site / "agents" / "prompts"

    own = tmp_path / "my-prompts"
    shutil.copytree(site / "agents" / "prompts", own)
    assert _check(site, str(own))[1] == str(own)
    (own / "unroll.md").unlink()
    done = subprocess.run([sys.executable, "-c", CHECK, str(own)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=120)
    assert done.returncode == 1 and f"no prompt file {own / 'unroll.md'}" in done.stderr
