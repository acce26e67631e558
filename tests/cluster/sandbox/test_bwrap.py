"""The bubblewrap sandbox, command by command (no Ray): what a command inside can see and do."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.config import SandboxSpec
from cluster.core.limits import Limits
from cluster.sandbox.bwrap import Bubblewrap
from cluster.sandbox.cgroups import Cgroups
from cluster.sandbox.isolation import start_bubblewrap
from cluster.sandbox.sandbox import SandboxError, Unsandboxed, run_command, scratch_dir
from tests.conftest import REPO

ATTACKS = REPO / "tests" / "fixtures" / "attacks"


@pytest.fixture(scope="module")
def bwrap() -> Bubblewrap:
    try:
        return start_bubblewrap(SandboxSpec(pids=32, memory_mb=128))
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")


@pytest.fixture
def workdir(tmp_path) -> Iterator[Path]:
    with scratch_dir(tmp_path, "run-") as path:  # under pytest's folders, which only root may pass
        yield path


def _attack(name: str, into: Path) -> str:
    binary = into / name
    subprocess.run(["cc", "-O1", "-DATTACK=1", f"-I{ATTACKS}", "-o", str(binary), str(ATTACKS / f"{name}.c")],
                   check=True)
    return str(binary)


def _sh(script: str, workdir: Path, sandbox, **kwargs):
    return run_command(["sh", "-c", script], workdir, kwargs.pop("timeout", 20), sandbox=sandbox, **kwargs)


def _running(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(pid)
        except OSError:
            pass
    return found


def test_only_the_commands_own_processes_are_in_sight_and_no_secret(bwrap, workdir):
    holder = subprocess.Popen(["sleep", "30"], env={"OPENAI_API_KEY": "sk-bwrap-test-secret"})
    try:
        result = _sh(f"ls /proc | grep -c '^[0-9]'; cat /proc/{holder.pid}/environ /proc/*/environ 2>/dev/null | "
                     "tr '\\0' '\\n'", workdir, bwrap, env={"PATH": os.environ["PATH"], "LEAKED_NAME": "x"})
    finally:
        holder.kill()
        holder.wait()
    assert result.ok, result.tail()
    count = result.stdout.split("\n")[0]
    assert int(count) <= 5  # bubblewrap's init, sh, ls, grep
    assert "sk-bwrap-test-secret" not in result.stdout
    assert "LEAKED_NAME" not in result.stdout  # not among the variables a candidate needs


def test_a_scratch_root_the_commands_uid_cannot_pass_is_fine(bwrap):
    private = Path(tempfile.mkdtemp(dir="/var/tmp"))  # 0700, outside the sandbox's private /tmp
    try:
        with scratch_dir(private / "scratch", "run-") as workdir:
            shutil.copy("/bin/true", workdir / "candidate.bin")
            result = run_command([str(workdir / "candidate.bin")], workdir, 20, sandbox=bwrap)
            assert result.ok, result.tail()
            seen = _sh(f"ls {private}; ls {private}/scratch", workdir, bwrap)
            assert seen.stdout.split() == ["scratch", workdir.name]  # the rest of the host's folder is hidden
    finally:
        shutil.rmtree(private)


def test_the_environment_holds_what_a_candidate_needs(bwrap, workdir):
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": "/x", "HOME": "/root",
           "WARPFLEET_DSN": "postgres://u:PASSWORD@host/db", "CUDA_SOMETHING_ELSE": "x", "LC_PRIVATE": "y"}
    result = _sh("env", workdir, bwrap, env=env, own_env={"WARPFLEET_POISON": "1"})
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert seen["CUDA_VISIBLE_DEVICES"] == "0" and seen["WARPFLEET_POISON"] == "1"  # the harness's own: given
    assert seen["HOME"] == str(workdir) and seen["TMPDIR"] == "/tmp" and "PYTHONPATH" not in seen
    # An allow-list, not a prefix: a name nobody listed stays out, whatever it starts with.
    assert not {"WARPFLEET_DSN", "CUDA_SOMETHING_ELSE", "LC_PRIVATE"} & set(seen), seen
    assert "PASSWORD" not in result.stdout


def test_the_run_config_passes_more_variables_by_name(bwrap, workdir):
    passing = Bubblewrap(bwrap.program, SandboxSpec(env=["MY_LICENSE_SERVER"]), uid=bwrap.uid)
    result = _sh("env", workdir, passing, env={"PATH": os.environ["PATH"], "MY_LICENSE_SERVER": "lic:27000",
                                               "MY_OTHER": "no"})
    assert "MY_LICENSE_SERVER=lic:27000" in result.stdout and "MY_OTHER" not in result.stdout


def _marker(tag: int) -> str:
    """A `sleep` argument no other process has: at least 10 s whatever this process's pid (a pid
    ending in 000 once made it 0.3 s, and the sleep ended before the 1 s timeout it was to outlast)."""
    return f"{10 + os.getpid() % 1000}.{tag}{int(time.time()) % 100000}"


@pytest.mark.parametrize("sandboxed", [True, False])
def test_setsid_and_a_double_fork_end_with_the_command(bwrap, workdir, sandboxed):
    marker = _marker(int(sandboxed) + 7)
    result = _sh(f"setsid sleep {marker} & (sleep {marker} &) ; sleep 0.2; exit 0", workdir,
                 bwrap if sandboxed else Unsandboxed())
    assert result.ok
    time.sleep(0.3)
    left = _running(f"sleep {marker}")
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    # Without the sandbox the setsid one survives the process-group kill: the test sees an escape.
    assert (left == []) == sandboxed


def test_writes_land_only_in_the_scratch_directory(bwrap, workdir):
    outside = Path("/var/tmp") / f"warpfleet-bwrap-test-{os.getpid()}"
    outside.mkdir(mode=0o777, exist_ok=True)
    outside.chmod(0o777)  # only the read-only root can stop the write
    try:
        result = _sh(f"echo x > {outside}/abs; echo x > ../../dotdot; echo x > $HOME/home; echo x > inside; "
                     f"echo x > {Path.home()}/warpfleet-bwrap-test; true", workdir, bwrap)
        assert result.ok
        assert not (outside / "abs").exists() and not (workdir.parent.parent / "dotdot").exists()
        assert not (Path.home() / "warpfleet-bwrap-test").exists()
        assert (workdir / "inside").read_text() == "x\n" and (workdir / "home").exists()  # HOME is the scratch
    finally:
        (Path.home() / "warpfleet-bwrap-test").unlink(missing_ok=True)
        for path in outside.iterdir():
            path.unlink()
        outside.rmdir()


def test_tmp_and_dev_shm_are_private_and_writable(bwrap, workdir):
    marker = f"warpfleet-bwrap-test-{os.getpid()}"
    result = _sh(f"echo x > /tmp/{marker} && echo x > /dev/shm/{marker} && ls /tmp /dev/shm", workdir, bwrap)
    assert result.ok, result.tail()
    assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()


def test_a_fork_bomb_stops_at_the_process_limit(bwrap, workdir):
    result = run_command([_attack("forkbomb", workdir)], workdir, 30, sandbox=bwrap)
    assert result.returncode == 1 and result.limit_exceeded == "processes", result.tail()
    assert result.tail().startswith("exit status 1: processes limit of 32 exceeded")


def test_a_limit_hit_is_the_commands_own_not_a_later_ones(bwrap, workdir):
    """Cgroups serve command after command: a hit is counted for the command that made it."""
    bomb = run_command([_attack("forkbomb", workdir)], workdir, 30, sandbox=bwrap)
    assert bomb.limit_exceeded == "processes"
    after = _sh("exit 1", workdir, bwrap)
    assert after.returncode == 1 and after.limit_exceeded == "" and after.tail() == "exit status 1"


def test_a_large_allocation_stops_at_the_memory_limit(bwrap, workdir):
    result = run_command([_attack("memory", workdir)], workdir, 60, sandbox=bwrap)
    assert not result.ok and result.limit_exceeded == "memory", result.tail()
    assert "memory limit of 128 MB exceeded" in result.tail()


def test_no_connection_leaves_the_sandbox(bwrap, workdir):
    with socket.create_server(("0.0.0.0", 0)) as server:
        server.setblocking(False)
        port = str(server.getsockname()[1])
        result = run_command([_attack("network", workdir), port, "127.0.0.1"], workdir, 20, sandbox=bwrap)
        assert result.ok, result.tail()
        with pytest.raises(BlockingIOError):
            server.accept()
        unsandboxed = run_command([str(workdir / "network"), port, "127.0.0.1"], workdir, 20)
        assert unsandboxed.returncode == 3  # the same program gets through without it


def test_a_timeout_ends_every_process_of_the_command(bwrap, workdir):
    marker = _marker(3)
    result = _sh(f"setsid sleep {marker} & sleep {marker}", workdir, bwrap, timeout=1)
    assert result.timed_out
    time.sleep(0.3)
    assert _running(f"sleep {marker}") == []


def test_no_process_of_the_uid_is_left_not_even_a_zombie(bwrap, workdir):
    """A zombie of the sandbox's uid would count against its RLIMIT_NPROC for good where pid 1
    does not reap (a container's)."""
    if bwrap.uid is None:
        pytest.skip("not root: commands run as this user")
    from cluster.compile.kernel import COMPILE_HOSTS

    COMPILE_HOSTS.close()  # this process's NVRTC compile hosts, left running by design, run as the uid too
    for _ in range(3):
        _sh("(setsid sleep 30 &); sleep 30 & exit 0", workdir, bwrap)
    time.sleep(0.3)
    mine = [pid for pid in filter(str.isdigit, os.listdir("/proc")) if _uid_of(pid) == bwrap.uid]
    assert mine == [], [Path(f"/proc/{pid}/status").read_text().splitlines()[:7] for pid in mine]


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_the_sandbox_ends_when_bubblewrap_is_killed_as_with_a_dead_worker(bwrap, workdir):
    marker = _marker(4)
    launch = bwrap.prepare(["sh", "-c", f"setsid sleep {marker} & sleep {marker}"], workdir,
                           {"PATH": os.environ["PATH"]}, None)
    proc = subprocess.Popen(launch.argv, cwd=workdir, env=launch.env, preexec_fn=launch.preexec,
                            pass_fds=launch.fds, start_new_session=True)
    time.sleep(0.5)
    proc.kill()  # bubblewrap alone, as when its worker dies (--die-with-parent) or is killed
    proc.wait()
    time.sleep(0.3)
    left = _running(f"sleep {marker}")
    launch.finish(proc.returncode)
    assert left == []


def test_a_signal_reads_as_the_commands_own(bwrap, workdir):
    result = _sh("kill -SEGV $$", workdir, bwrap)
    assert result.returncode == -signal.SIGSEGV and result.describe() == "killed by SIGSEGV"


def test_the_commands_files_are_its_own_and_the_worker_files_are_not(bwrap, workdir):
    (workdir / "given.txt").write_text("from the worker\n")
    result = _sh("echo more >> given.txt && cat /etc/shadow", workdir, bwrap)
    assert "Permission denied" in result.stderr and "root:" not in result.stdout
    assert (workdir / "given.txt").read_text() == "from the worker\nmore\n"


def test_descriptors_passed_to_a_prepared_command_reach_it(bwrap, workdir):
    """The persistent runner starts its process with Sandbox.prepare and Popen(pass_fds=...)."""
    reader, writer = os.pipe()
    launch = bwrap.prepare(["bash", "-c", f"echo hello >&{writer}"], workdir,
                           {"PATH": os.environ["PATH"]}, None)
    proc = subprocess.Popen(launch.argv, cwd=workdir, env=launch.env, preexec_fn=launch.preexec,
                            pass_fds=(writer, *launch.fds))
    proc.wait()
    os.close(writer)
    assert os.read(reader, 100) == b"hello\n"
    assert launch.finish(proc.returncode).returncode == 0
    os.close(reader)


def test_gpu_nodes_are_bound_only_for_gpu_commands(bwrap, workdir):
    bwrap_gpu = Bubblewrap(bwrap.program, bwrap.spec, gpu=False, uid=bwrap.uid)
    bwrap_gpu.gpu_nodes = ("/dev/nvidia0", "/dev/nvidiactl")
    for gpu, expected in ((False, []), (True, ["/dev/nvidia0", "/dev/nvidiactl"])):
        launch = bwrap_gpu.prepare(["true"], workdir, {}, None, gpu=gpu)
        bound = [launch.argv[i + 1] for i, arg in enumerate(launch.argv) if arg == "--dev-bind"]
        launch.finish(None)
        assert bound == expected


def test_without_a_cgroup_rlimits_hold_the_limits(bwrap, workdir):
    plain = Bubblewrap(bwrap.program, SandboxSpec(pids=32, memory_mb=128), cgroups=None, uid=bwrap.uid)
    result = run_command([_attack("memory", workdir)], workdir, 60, sandbox=plain, limits=Limits())
    assert result.limit_exceeded == "memory" and "memory limit of 128 MB exceeded" in result.tail(), result.tail()
    bomb = run_command([_attack("forkbomb", workdir)], workdir, 30, sandbox=plain)
    assert bomb.returncode == 1 and "processes limit of 32 exceeded" in bomb.tail(), bomb.tail()  # its own words


def test_leaves_of_dead_workers_are_removed():
    cgroups = Cgroups.detect()
    if cgroups is None:
        pytest.skip("no writable cgroup here")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [parent / f"{dead.pid}-0" for parent in {cgroups.pids_parent, cgroups.memory_parent} if parent]
    for path in stale:
        path.mkdir()
    Cgroups.detect()
    assert not any(path.exists() for path in stale)


def test_a_package_folder_on_the_search_path_is_bound_in_and_a_working_folder_is_not(monkeypatch, tmp_path):
    """Packages unpacked under /tmp (`pip install --target /tmp/site`, then PYTHONPATH) were hidden
    by the sandbox's private /tmp, and the runner's host, which imports them, crashed at the
    baseline ("exit status 1"). A search-path folder that holds installed distributions is bound;
    a working folder (no `*.dist-info`) and warpfleet's checkout are not."""
    from cluster.sandbox import bwrap as module

    site, work = tmp_path / "site", tmp_path / "work"
    (site / "ray-2.60.dist-info").mkdir(parents=True)
    (site / "ray").mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("a user's file")
    monkeypatch.setattr(module.sys, "path", [*module.sys.path, str(site), str(work), str(REPO)])
    homes = module._python_homes()
    assert site.resolve() in homes
    assert not any(work.resolve().is_relative_to(h) for h in homes)
    assert REPO.resolve() not in homes  # the checkout: its packages only
    home = tmp_path / "home"
    (home / "foo-1.0.dist-info").mkdir(parents=True)  # packages installed into the home folder itself
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(module.sys, "path", [*module.sys.path, str(home)])
    assert home.resolve() not in module._python_homes()  # its secrets stay hidden
    (site / "ray" / "__init__.py").write_text("VERSION = '2.60'\n")
    try:
        sandbox = start_bubblewrap(SandboxSpec(pids=32, memory_mb=128))
    except SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    with scratch_dir(None, "wf-test-") as place:
        seen = _sh(f"cat {site / 'ray' / '__init__.py'}; ls {work} 2>&1 || true", place, sandbox)
    assert "VERSION = '2.60'" in seen.stdout and "notes.txt" not in seen.stdout


def test_the_bubblewrap_unpacked_into_the_environment_is_found_without_path(monkeypatch, tmp_path):
    """After scripts/demo.sh, `warpfleet doctor` from a plain shell said "bwrap not found on PATH":
    the scripts put the bubblewrap they unpack into .venv on PATH for themselves only."""
    from cluster.sandbox import bwrap as module

    unpacked = tmp_path / "bubblewrap" / "usr" / "bin" / "bwrap"
    unpacked.parent.mkdir(parents=True)
    unpacked.write_text("#!/bin/sh\necho 'bubblewrap 0.8.0'\n")
    unpacked.chmod(0o755)
    monkeypatch.setattr(module, "UNPACKED", unpacked)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert module.Program.find(None) == module.Program(str(unpacked), (0, 8, 0))
    with pytest.raises(SandboxError, match="'nowhere' not found"):
        module.Program.find("nowhere")  # a configured one is not replaced
    unpacked.unlink()
    with pytest.raises(SandboxError, match=f"bwrap not found on PATH nor at {unpacked}"):
        module.Program.find(None)
