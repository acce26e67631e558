"""Issue 26: a candidate that replaces the files the worker keeps in its scratch directory (its
stdout and stderr, an output, a reference) with links to a file outside must not get the worker,
root and outside the sandbox, to write or read through them; its row fails instead of winning.
Through the process runner and the persistent runner with a C target, in bubblewrap and bare (the
kernel runner's: tests/cluster/runners/test_kernel_gpu.py, on a GPU)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml

from cluster.compile.build import compile_candidate
from cluster.config import load_target
from cluster.core.types import Candidate, Phase, Status
from cluster.measure.measure import measure_candidate
from cluster.platform.devices import cpu_device
from cluster.runners._base import Invocation, ProcessRunner
from cluster.runners.persistent import PersistentRunner
from cluster.sandbox.untrusted_dir import Refused, UntrustedDir

# Run 1 writes its output and its metric, and leaves links to the victim where the worker keeps its
# files: whoever opens them by name next (the worker, for run 2) writes or reads the victim.
ATTACK = textwrap.dedent(r"""
    #include <stdio.h>
    #include <unistd.h>
    int main(int argc, char** argv) {
        const char* names[] = {".warpfleet.stdout", ".warpfleet.stderr", ".warpfleet.reference.out.bin"};
        for (int i = 0; i < 3; i++) { unlink(names[i]); symlink(argv[1], names[i]); }
        FILE* f = fopen("out.bin", "wb");
        float v = 1.0f;
        fwrite(&v, sizeof v, 1, f);
        fclose(f);
        printf("@warpfleet time_ms=0.5\n");
        fprintf(stderr, "pwned\n");
        return 0;
    }
""")
SECRET = b"the worker's file: the venv's .pth, the target's source\n"


def _target(tmp_path: Path, runner: str, victim: Path):
    (tmp_path / "attack.c").write_text(ATTACK)
    spec = {"name": "attack", "toolchain": "cc", "sources": ["attack.c"], "runner": runner,
            "run": ["{binary}", str(victim)], "verify": {"outputs": ["out.bin"]}, "timeouts": {"build": 60, "run": 10}}
    path = tmp_path / f"{runner}.yaml"
    path.write_text(yaml.safe_dump(spec))
    target = load_target(path)
    candidate = Candidate(target.name, "cc", "host", "host", target.bundle.hash, (), (), Phase.SEARCH,
                          runner=target.runner)
    artifact = compile_candidate(target, candidate)
    assert artifact.status is Status.OK, artifact.error_tail
    return target, candidate, artifact


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(SECRET)
    return victim


@pytest.mark.parametrize("runner", ["process", "persistent"])
def test_links_left_for_the_capture_files_fail_the_row_and_nothing_outside_is_touched(tmp_path, sandbox, runner):
    victim = _victim(tmp_path)
    target, candidate, artifact = _target(tmp_path, runner, victim)
    scratch = tmp_path / "scratch"
    runs = (ProcessRunner(sandbox, scratch) if runner == "process"
            else PersistentRunner(sandbox=sandbox, scratch_root=scratch, cuda=False))
    try:
        got = measure_candidate(target, candidate, artifact, cpu_device("w"), None, 2, runs)
    finally:
        runs.close()
    assert victim.read_bytes() == SECRET  # neither truncated nor written
    assert got.status is Status.CRASHED, (got.status, got.error_tail)  # a failure: never a win
    assert "refused" in got.error_tail and "symbolic link" in got.error_tail, got.error_tail
    assert SECRET.decode().strip() not in got.error_tail  # and never read into the row


def test_the_worker_writes_its_own_files_afresh_and_reads_none_through_a_link(tmp_path):
    victim = _victim(tmp_path)
    place = tmp_path / "scratch"
    place.mkdir()
    for name in ("ref.bin", "request.json", "out.bin"):
        os.symlink(victim, place / name)
    (place / "sub").symlink_to(tmp_path)  # a folder on the way that is a link
    os.mkfifo(place / "fifo.bin")
    with UntrustedDir(place) as files:
        files.write("ref.bin", b"reference")  # replaces the link, not what it points to
        files.write("request.json", b"{}")
        assert (place / "ref.bin").read_bytes() == b"reference" and not (place / "ref.bin").is_symlink()
        for rel in ("out.bin", "sub/victim.txt", "fifo.bin", "../victim.txt"):
            with pytest.raises(OSError):
                files.read(rel)
        with pytest.raises(Refused):
            files.write("sub/new.bin", b"x")
        with pytest.raises(Refused, match="symbolic link"):
            files.capture("out.bin")
        with pytest.raises(Refused, match="FIFO"):
            files.capture("fifo.bin")
        assert files.capture("fresh.txt").write(b"ok") == 2
    assert victim.read_bytes() == SECRET and not (tmp_path / "new.bin").exists()


def test_a_staged_directory_swapped_for_a_link_is_not_handed_over_nor_run_in(tmp_path, sandbox):
    """A persistent host's candidate can leave a process behind that renames its staged directory
    and puts a link to the worker's files in its place: the worker must not chown, bind or run there."""
    victim_dir = tmp_path / "venv"
    victim_dir.mkdir()
    (victim_dir / "site.pth").write_bytes(SECRET)
    target, _, artifact = _target(tmp_path, "process", victim_dir / "site.pth")
    runner = ProcessRunner(sandbox, tmp_path / "scratch")
    with runner.stage(target, {}, "host", artifact.binary) as staged:
        moved = staged.workdir.with_name(staged.workdir.name + ".moved")
        staged.workdir.rename(moved)
        staged.workdir.symlink_to(victim_dir)
        try:
            result = staged.run(Invocation())
            if getattr(sandbox, "uid", None) is not None:  # root: the host's new directories are chowned
                with pytest.raises(OSError, match="link"):
                    sandbox.hand_over(staged.workdir)
        finally:
            staged.workdir.unlink()
            moved.rename(staged.workdir)
    assert not result.ok and "refused" in result.tail(), result.tail()
    owner = os.stat(victim_dir / "site.pth")
    assert (owner.st_uid, owner.st_gid) == (os.getuid(), os.getgid())  # never handed to the sandbox's uid
    assert sorted(os.listdir(victim_dir)) == ["site.pth"] and (victim_dir / "site.pth").read_bytes() == SECRET



def test_clearing_a_directory_removes_links_never_what_they_point_to(tmp_path):
    victim = _victim(tmp_path)
    place = tmp_path / "scratch"
    (place / "deep" / "er").mkdir(parents=True)
    (place / "deep" / "er" / "cache.bin").write_bytes(b"kept by a run")
    (place / "kept").mkdir()
    os.symlink(victim, place / "out.bin")
    os.symlink(tmp_path, place / "deep" / "up")  # a folder's link: removed as a link, not walked
    (place / ".warmed").write_text("")
    with UntrustedDir(place) as files:
        files.clear(keep={"kept"})
    assert sorted(p.name for p in place.iterdir()) == ["kept"]
    assert victim.read_bytes() == SECRET and (tmp_path / "scratch").is_dir()
