"""The run directory: made atomically, or not at all, with one line saying why; the layout in one
place; the Optuna journal's lock of a killed driver broken at once."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_run
from cluster.core.errors import ConfigError
from cluster.store import rundir as rundir_module
from cluster.store.rundir import RunDir, break_stale_lock, spec_hash
from tests.conftest import REPO, repo_pythonpath, write_config, write_target


def _plan(tmp_path: Path, **fields):
    write_target(tmp_path / "t")
    return load_run(write_config(tmp_path, ["t/target.yaml"], **fields))


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    plan = _plan(tmp_path)
    monkeypatch.setattr(rundir_module.time, "strftime", lambda fmt, t=None: "20261126-120000")
    made: list[RunDir] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        made.append(RunDir.create(plan))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    names = sorted(r.path.name for r in made)
    assert len(set(names)) == 8 and names[0] == "t-20261126-120000"
    for run in made:  # each one whole: its own id, its config copied
        assert RunDir.open(run.path).run_id == run.path.name
        assert run.config.read_bytes() == Path(plan.file).read_bytes()


@pytest.fixture
def cli_sweep(tmp_path, ray_local):
    """`warpfleet sweep` of a tiny target, with the config's output_dir given by the test."""
    write_target(tmp_path / "t")

    def run(output_dir: Path):
        config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 1}, output_dir=str(output_dir))
        return CliRunner().invoke(main, ["sweep", str(config), "--no-progress"])

    return tmp_path / "run.yaml", run


@pytest.fixture
def mount_tmpfs(tmp_path):
    """A tiny tmpfs (``size`` bytes, maybe read-only) at a new folder; skips where none can be mounted."""
    mounted = []

    def mount(size: str, *options: str) -> Path:
        folder = tmp_path / f"tmpfs{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs",
                               str(folder)], capture_output=True)
        if done.returncode:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=False)


def _one_error_line(result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def test_an_output_dir_that_is_a_file_or_under_one_is_one_line(tmp_path, cli_sweep):
    config, sweep = cli_sweep
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    _one_error_line(sweep(file), f"{config}: output_dir:", "cannot create a run directory")
    _one_error_line(sweep(file / "below"), "cannot create a run directory")
    assert file.read_text() == "not a folder"


def test_a_read_only_output_dir_is_one_line(cli_sweep, mount_tmpfs):
    _, sweep = cli_sweep
    folder = mount_tmpfs("64k", "ro")
    _one_error_line(sweep(folder / "runs"), "Read-only file system")
    assert list(folder.iterdir()) == []


def test_a_full_disk_is_one_line_and_leaves_nothing(cli_sweep, mount_tmpfs):
    _, sweep = cli_sweep
    disk = mount_tmpfs("16k")
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"x" * 512):  # fill it to the last byte
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    _one_error_line(sweep(disk / "runs"), "No space left on device")
    assert sorted(p.name for p in disk.rglob("*")) in (["filler"], ["filler", "runs"])  # no run directory


def test_a_failed_write_leaves_no_run_directory_behind(tmp_path, cli_sweep, monkeypatch):
    """Seen on a full disk: a run directory holding an empty config.yaml. Now the copy and meta.json
    are written whole or not at all, and a failed one takes the new directory with it."""
    _, sweep = cli_sweep
    real_fsync = os.fsync
    calls = []

    def full(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:  # config.yaml is written; meta.json hits the full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(rundir_module.os, "fsync", full)
    out = tmp_path / "out"
    _one_error_line(sweep(out), "No space left on device")
    assert list(out.iterdir()) == []


def test_meta_and_config_are_replaced_whole(tmp_path, monkeypatch):
    run = RunDir.create(_plan(tmp_path))
    before = run.meta.read_text()
    monkeypatch.setattr(rundir_module.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError):
        run.update_meta(command_line={"trials": 3})
    assert run.meta.read_text() == before and [p.name for p in run.path.iterdir() if p.name.startswith(".")] == []


def _refused(run: RunDir, plan, field: str, *says: str, accept: bool = False) -> str:
    with pytest.raises(ConfigError) as raised:
        run.check_resumable(plan, accept_changes=accept)
    line = str(raised.value)
    assert "\n" not in line and f": {field}: " in line and all(s in line for s in says), line
    return line


def test_accepted_changes_start_a_target_s_next_study_and_the_next_resume_needs_no_flag(tmp_path):
    """Issue 16: a changed target's sources or spec, refused by a resume, are accepted with
    --accept-changes: each acceptance is one more generation of its study, the hashes it replaced
    kept in meta.json, and a later change is found against the new ones."""
    plan = _plan(tmp_path)
    run = RunDir.create(plan)
    first = run.read_meta()
    assert run.generations() == {} and run.check_resumable(plan) == []
    (tmp_path / "t" / "tiny.c").write_text("int main(void) { return 0; }\n")
    plan = load_run(plan.file)
    _refused(run, plan, "targets.tiny", "the sources of target tiny changed", "resume with --accept-changes")
    assert run.check_resumable(plan, accept_changes=True) == ["tiny"]
    assert run.read_meta() == first  # checking writes nothing
    assert run.start_new_studies(plan, ["tiny"]) == {"tiny": 2}
    assert run.generations() == {"tiny": 2} and run.check_resumable(plan) == []
    spec = yaml.safe_load((tmp_path / "t" / "target.yaml").read_text())
    (tmp_path / "t" / "target.yaml").write_text(yaml.safe_dump({**spec, "run": ["{binary}", "-v"]}))
    plan = load_run(plan.file)
    _refused(run, plan, "target_specs.tiny", "the spec of target tiny changed")
    run.start_new_studies(plan, run.check_resumable(plan, accept_changes=True))
    meta = run.read_meta()
    assert meta["generations"] == {"tiny": 3} and meta["target_specs"]["tiny"] == spec_hash(plan.targets[0])
    assert [(s["generation"], s["sources"], s["spec"]) for s in meta["superseded"]] == [
        (1, first["targets"]["tiny"], first["target_specs"]["tiny"]),
        (2, meta["targets"]["tiny"], first["target_specs"]["tiny"])]


def test_accept_changes_takes_a_changed_list_of_targets_but_no_other_config_change(tmp_path):
    plan = _plan(tmp_path, measure={"runs": 1})
    run = RunDir.create(plan)
    write_target(tmp_path / "u", name="other")
    plan = load_run(write_config(tmp_path, ["t/target.yaml", "u/target.yaml"], measure={"runs": 1}))
    _refused(run, plan, "targets", "resume with --accept-changes to sweep the targets listed now")
    assert run.check_resumable(plan, accept_changes=True) == []  # a new target: its first study
    run.start_new_studies(plan, [])
    assert set(run.read_meta()["targets"]) == {"tiny", "other"} and run.generations() == {}
    plan = load_run(write_config(tmp_path, ["u/target.yaml"], measure={"runs": 2}))  # tiny removed, runs
    _refused(run, plan, "measure.runs", "changed since the run (1 -> 2)",
             "--accept-changes covers changed targets only", accept=True)


def test_open_names_what_is_not_a_run_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"no meta\.json"):
        RunDir.open(tmp_path)
    (tmp_path / RunDir.META).write_text("{")
    with pytest.raises(ConfigError, match="run_id: missing or unreadable"):
        RunDir.open(tmp_path)


# -- the Optuna journal's lock ---------------------------------------------------------------------
HOLD = """
import sys, time
from cluster.store.rundir import break_stale_lock
break_stale_lock(sys.argv[1])
print("holding", flush=True)
time.sleep(60)
"""


def test_a_dead_drivers_journal_lock_is_broken_and_a_live_ones_is_not(tmp_path):
    lock = tmp_path / f"{RunDir.JOURNAL}.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": repo_pythonpath()})
    try:
        assert holder.stdout.readline().strip() == b"holding"
        os.symlink(tmp_path / RunDir.JOURNAL, lock)  # as JournalFileSymlinkLock takes it
        assert not break_stale_lock(tmp_path) and lock.is_symlink()  # its driver is alive
    finally:
        holder.kill()
        holder.wait()
    assert break_stale_lock(tmp_path) and not lock.is_symlink()  # its driver is gone: removed at once
    assert not break_stale_lock(tmp_path)  # nothing left to break


def test_a_resume_after_a_kill_does_not_wait_for_the_journal_lock(tmp_path):
    """After a SIGKILL mid-write, Optuna's lock stays and every writer waited 30 s for it."""
    import optuna

    from cluster.engine.study.state import open_storage

    plan = _plan(tmp_path)
    run = RunDir.create(plan)
    run.journal.touch()
    lock = run.path / f"{RunDir.JOURNAL}.lock"
    os.symlink(run.journal, lock)  # left by a driver killed holding it
    storage = open_storage(plan.config.search, run.path)
    assert not lock.is_symlink()  # broken as the storage opens, before any write could wait for it
    optuna.create_study(storage=storage, study_name="s").optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == 2


# -- the layout --------------------------------------------------------------------------------------
def test_every_table_folder_reads_as_a_parquet_dataset_with_variant_sources_beside(tmp_path):
    """variants/files/*.json made pd.read_parquet(run/"variants") fail; the sources now live in
    variant_sources/, and runs written before are still read."""
    from agents._base import Proposal
    from agents.patch import variant_target
    from cluster.config import load_target
    from cluster.store.results import ResultWriter
    from cluster.store.variants import VARIANT_SCHEMA, AcceptedVariant, load_accepted, save_accepted, stored_variant

    target = load_target(write_target(tmp_path / "t"))
    variant = variant_target(target, Proposal("x", "faster", (("tiny.c", "int main(void){return 0;}\n"),)))
    run = tmp_path / "run"
    save_accepted(run, "tiny@cpu", AcceptedVariant(variant, "unroll at main", {}, True))
    with ResultWriter(run, VARIANT_SCHEMA, subdir=RunDir.VARIANTS) as writer:
        writer.append_record({"run_id": "r", "target": "tiny", "source_hash": variant.bundle.hash})
    assert len(pd.read_parquet(run / RunDir.VARIANTS)) == 1
    assert [p.parent.name for p in run.rglob("*.json")] == [RunDir.VARIANT_SOURCES]
    restored = stored_variant(run, target, variant.bundle.hash)
    assert restored is not None and restored.bundle == variant.bundle
    assert stored_variant(run, target, "0" * 16) is None
    old = tmp_path / "old_run" / RunDir.VARIANTS / "files"  # where runs before kept them
    old.parent.mkdir(parents=True)
    (run / RunDir.VARIANT_SOURCES).rename(old)
    (old / "tiny_cpu.done").write_text("")
    assert stored_variant(old.parent.parent, target, variant.bundle.hash).bundle == variant.bundle
    [accepted] = load_accepted(old.parent.parent, "tiny@cpu", target)
    assert accepted.source_hash == variant.bundle.hash


def test_no_other_module_spells_the_layout():
    """RunDir owns the layout: the names of a run directory appear nowhere else as literals."""
    names = [RunDir.META, RunDir.CONFIG, RunDir.JOURNAL, RunDir.PROFILES, RunDir.VARIANTS, RunDir.REVIEWS,
             RunDir.REFERENCES, RunDir.VARIANT_SOURCES, RunDir.QUARANTINE]
    offenders = []
    for path in [*REPO.joinpath("cluster").rglob("*.py"), *REPO.joinpath("agents").rglob("*.py")]:
        if path.name == "rundir.py":
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(REPO)}: {name}" for name in names
                      if re.search(rf"""(/\s*|subdir\s*=\s*|read_table\([^)]*)["']{re.escape(name)}["']""", text)]
    assert offenders == []


def test_the_agents_llm_folder_is_the_run_directorys():
    from agents.llm.store import LLM_DIR

    assert LLM_DIR == RunDir.LLM  # the agents sit below the store and name it themselves


def test_a_run_directory_that_cannot_be_written_under_output_dir_given_on_the_command_line_blames_the_option(
        tmp_path, cli_sweep, monkeypatch):
    """Seen: `--output-dir` reported against the config file's output_dir."""
    config, _ = cli_sweep
    write_config(tmp_path, ["t/target.yaml"], search={"trials": 1})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir_module.os, "fsync", full)
    out = tmp_path / "out"
    line = _one_error_line(CliRunner().invoke(main, ["sweep", str(config), "--output-dir", str(out), "--no-progress"]))
    assert line.startswith(f"error: {out}: --output-dir: {out / 't-'}") and "No space left on device" in line, line
    assert list(out.iterdir()) == []
