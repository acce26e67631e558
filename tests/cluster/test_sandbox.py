import sys
import time

from cluster.sandbox import run_command, scratch_dir

PY = sys.executable


def test_success_captures_output(tmp_path):
    result = run_command([PY, "-c", "print('hi'); import sys; print('err', file=sys.stderr)"], tmp_path, 10)
    assert result.ok and result.stdout.strip() == "hi" and "err" in result.stderr


def test_timeout_kills_the_whole_process_group(tmp_path):
    # A child that outlives its parent must die with it: hung kernels are often in helpers.
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "open('child.pid', 'w').write(str(p.pid)); time.sleep(60)")
    start = time.monotonic()
    result = run_command([PY, "-c", code], tmp_path, timeout=1.5)
    assert result.timed_out and result.returncode is None
    assert time.monotonic() - start < 10
    pid = int((tmp_path / "child.pid").read_text())
    time.sleep(0.2)
    assert not _alive(pid)
    assert "timed out" in result.tail()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_signal_death_is_described(tmp_path):
    result = run_command([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], tmp_path, 10)
    assert not result.ok and result.returncode == -11
    assert result.describe() == "killed by SIGSEGV"


def test_missing_program_is_a_value_not_an_exception(tmp_path):
    result = run_command([str(tmp_path / "nope")], tmp_path, 10)
    assert not result.ok and "could not start" in result.tail()


def test_huge_output_is_read_only_up_to_the_limit(tmp_path):
    result = run_command([PY, "-c", "import sys; sys.stdout.write('x' * 5_000_000 + 'END')"], tmp_path, 30,
                         stdout_limit=1000)
    assert result.ok and len(result.stdout) == 1000 and result.stdout.endswith("END")


def test_scratch_dir_is_removed_even_on_error(tmp_path):
    try:
        with scratch_dir(tmp_path, "x-") as d:
            (d / "f").write_text("1")
            raise RuntimeError
    except RuntimeError:
        pass
    assert not d.exists()
