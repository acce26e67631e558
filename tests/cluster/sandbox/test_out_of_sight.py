"""The runs' output directory is out of a candidate's sight: a candidate that read the baseline's
outputs from RUN/references/ (world-readable, and the sandbox showed the whole file system) and
wrote them as its own won at 221x (tests/fixtures/attacks/read_references.c)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import SandboxSpec, load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.runners._base import Invocation, ProcessRunner
from cluster.sandbox.isolation import Policy, start_bubblewrap
from cluster.sandbox.sandbox import SandboxError

ATTACKS = Path(__file__).parents[2] / "fixtures" / "attacks"


@pytest.fixture
def runs_dir():
    # Not under /tmp: the sandbox hides /tmp anyway, and the attack needs the run in sight to begin with.
    root = Path(tempfile.mkdtemp(prefix="warpfleet-runs-", dir="/var/tmp"))
    root.chmod(0o755)
    reference = root / "suite-1" / "references" / "0123abcd" / "seed0" / "out.bin"
    reference.parent.mkdir(parents=True)
    reference.write_bytes(b"\x00\x00\x80\x3f")
    for folder in reference.parents:
        if folder.is_relative_to(root):
            folder.chmod(0o755)
    reference.chmod(0o644)
    yield root, reference
    shutil.rmtree(root, ignore_errors=True)


def _copier(tmp_path: Path, reference: Path):
    folder = tmp_path / "t"
    folder.mkdir()
    for name in ("read_references.c", "attack.h"):
        shutil.copy(ATTACKS / name, folder / name)
    (folder / "ref_path.txt").write_text(f"{reference}\n")
    (folder / "target.yaml").write_text(yaml.safe_dump({
        "name": "copier", "toolchain": "cc", "sources": ["read_references.c"], "files": ["attack.h", "ref_path.txt"],
        "run": ["{binary}"], "verify": {"outputs": ["out.bin"]}, "params": {"ATTACK": [0, 1]}}))
    target = load_target(folder / "target.yaml")
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), (("ATTACK", 1),), Phase.SEARCH)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return target, candidate, artifact


def _run(sandbox, target, candidate, artifact) -> str:
    runner = ProcessRunner(sandbox)
    with runner.stage(target, dict(candidate.params), candidate.arch, artifact.binary) as staged:
        result = staged.run(Invocation())
    assert result.ok, result.tail()
    return result.stdout


def test_the_runs_output_directory_is_out_of_a_candidates_sight(tmp_path, runs_dir):
    root, reference = runs_dir
    try:
        seeing = start_bubblewrap(SandboxSpec(pids=64, memory_mb=1024))
        blind = start_bubblewrap(SandboxSpec(pids=64, memory_mb=1024), out_of_sight=[root])
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    built = _copier(tmp_path, reference)
    assert "READ:4" in _run(seeing, *built)  # the attack, where nothing hides the runs
    assert "HIDDEN" in _run(blind, *built)
    assert reference.read_bytes() == b"\x00\x00\x80\x3f"  # the worker's own view is unchanged


def test_the_policy_carries_the_folders_out_of_sight_to_every_worker():
    policy = Policy("bwrap", SandboxSpec(), ("/data/runs",))
    assert Policy.decode(policy.encode()) == policy
    assert Policy.decode(Policy("off").encode()).out_of_sight == ()
