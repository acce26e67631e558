"""Issue 26: a candidate that fills its scratch directory with empty files (no disk, all inodes)
is stopped at ``limits.files`` with its own status, not by the run's timeout."""

from __future__ import annotations

import sys
import textwrap

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.limits import Limits
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.measure import measure_candidate
from cluster.platform.devices import cpu_device
from cluster.runners._base import ProcessRunner
from cluster.runners.persistent import PersistentRunner
from cluster.sandbox.sandbox import run_command

BOMB = textwrap.dedent(r"""
    #include <stdio.h>
    #include <sys/stat.h>
    int main(void) {
        char name[32];
        mkdir("d", 0755);
        for (int i = 0; i < 200000; i++) {
            snprintf(name, sizeof name, "d/%d", i);
            FILE* f = fopen(name, "w");
            if (f) fclose(f);
        }
        printf("@warpfleet time_ms=1.0\n");
        return 0;
    }
""")
RUN_TIMEOUT = 300  # far longer than 200,000 files take: a timeout would mean the limit never acted


@pytest.mark.parametrize("runner", ["process", "persistent"])
def test_an_inode_bomb_stops_at_the_file_limit_with_its_own_status(tmp_path, sandbox, runner):
    (tmp_path / "bomb.c").write_text(BOMB)
    spec = {"name": "bomb", "toolchain": "cc", "sources": ["bomb.c"], "runner": runner, "run": ["{binary}"],
            "timeouts": {"build": 60, "run": RUN_TIMEOUT}}  # limits.files: the default, 20,000
    (tmp_path / "bomb.yaml").write_text(yaml.safe_dump(spec))
    target = load_target(tmp_path / "bomb.yaml")
    assert target.spec.limits.files == 20_000
    candidate = Candidate("bomb", "cc", "host", "host", target.bundle.hash, (), (), Phase.SEARCH, runner=runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    scratch = tmp_path / "scratch"
    runs = (ProcessRunner(sandbox, scratch) if runner == "process"
            else PersistentRunner(sandbox=sandbox, scratch_root=scratch, cuda=False))
    try:
        got = measure_candidate(target, candidate, artifact, cpu_device("w"), None, 1, runs)
    finally:
        runs.close()
    assert got.status is Status.TOO_MANY_FILES, (got.status, got.error_tail)
    assert "files limit of 20000 files exceeded" in got.error_tail, got.error_tail


def test_a_command_within_the_file_limit_is_left_alone_and_one_past_it_is_named(tmp_path):
    script = "for i in range({n}): open(f'f{{i}}', 'w').close()\nprint('done')"
    fine, past = tmp_path / "fine", tmp_path / "past"
    fine.mkdir()
    past.mkdir()
    within = run_command([sys.executable, "-c", script.format(n=40)], fine, 60, limits=Limits(files=50))
    assert within.ok and within.stdout.strip() == "done", within.tail()  # 40 and the two capture files
    over = run_command([sys.executable, "-c", script.format(n=80)], past, 60, limits=Limits(files=50))
    assert not over.ok and over.limit_exceeded == "files", over.tail()
    assert "files limit of 50 files exceeded" in over.tail()
