"""The ``warpfleet`` command line as issue 17 found it: tiny C sweeps, and runs written from given
measurements (tests/cluster/outputs/fake_runs.py) for what a CPU cannot make."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cluster.cli import main
from cluster.config import load_run, load_target
from cluster.core.types import Phase, Status
from cluster.store.results import read_results
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from tests.cluster.outputs.fake_runs import Row, gpu, write_run
from tests.conftest import REPO, TINY_C, gpu_present, repo_pythonpath, write_config, write_target

SAXPY = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")
H100 = gpu("NVIDIA H100 80GB HBM3", "9.0", "H100")
BASE = {"BLOCK": 256, "ITEMS": 1}
TUNED = {"BLOCK": 128, "ITEMS": 4}

# MODE 0 is the baseline; MODE 1 prints a negative time, MODE 2 a time of 0.
SIGNED_C = r"""
#include <stdio.h>
#ifndef MODE
#define MODE 0
#endif
int main(int argc, char **argv) {
    FILE *f = fopen("out.bin", "wb");
    float v[2] = {1.0f, 2.0f};
    fwrite(v, sizeof v, 1, f);
    fclose(f);
    if (argc > 1) return 3;  /* a baseline that fails */
    for (int i = 0; i < 3; i++)
        printf("@warpfleet time_ms=%s\n", MODE == 1 ? "-1.5" : MODE == 2 ? "0" : "2.5");
    return 0;
}
"""


def _signed_target(folder: Path, **fields) -> Path:
    path = write_target(folder, params={"MODE": [0, 1, 2]}, space="space.yaml", **fields)
    (folder / "space.yaml").write_text("name: one\ntoolchain: cc\nflags: {opt_level: ['-O1']}\n")
    (folder / "tiny.c").write_text(SIGNED_C)
    return path


def _invoke(*args: str):
    # An earlier sweep's measuring actors live on until the cycle collector frees their handles, and
    # on the tests' 2-CPU Ray they leave this sweep no CPU to compile on: a resume waited ~15 s.
    gc.collect()
    return CliRunner().invoke(main, list(args))


def _run_of(out: Path) -> Path:
    [run] = [p for p in out.iterdir() if p.is_dir()]
    return run


@pytest.mark.usefixtures("ray_local")
def test_a_time_of_zero_or_below_is_never_selected_and_the_sweep_ends_with_the_next_commands(tmp_path):
    _signed_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"sampler": "grid", "trials": 3},
                          measure={"final_top_k": 2, "final_runs": 2})
    result = _invoke("sweep", str(config), "--no-progress")
    assert result.exit_code == 0, result.output
    run = _run_of(tmp_path / "runs")
    rows = read_results(run)
    by_mode = rows[rows["phase"] == "search"].set_index("p_MODE")["status"].to_dict()
    assert by_mode == {1: Status.METRIC_INVALID.value, 2: Status.METRIC_INVALID.value}
    shown = _invoke("show", str(run))
    assert shown.exit_code == 0 and "1.00x" in shown.output and "-DMODE=0" in shown.output
    assert "-1.5" not in shown.output and "nan" not in shown.output.lower()
    [record] = json.loads(_invoke("export", str(run), "--format", "json").stdout)
    assert record["params"] == {"MODE": 0} and record["speedup"] == 1.0
    tail = result.output[result.output.index("next:"):].splitlines()
    assert tail == ["next:", f"  warpfleet show {run}",
                    f"  warpfleet export {run} --format flags   # or json, yaml, header, cmake, t4; "
                    "bundle --output DIR for all of them"]


@pytest.mark.usefixtures("ray_local")
def test_a_study_without_a_valid_baseline_fails_the_sweep_and_is_named(tmp_path):
    _signed_target(tmp_path / "t", run=["{binary}", "fail"])
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 2})
    result = _invoke("sweep", str(config), "--no-progress")
    assert result.exit_code == 1, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert line.startswith("error: no valid baseline for tiny@") and "crashed" in line and "exit status 3" in line


@pytest.mark.usefixtures("ray_local")
def test_a_resume_keeps_the_budget_given_on_the_first_command_line(tmp_path):
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 4, "sampler": "random"},
                          measure={"final_top_k": 1, "final_runs": 1})
    assert _invoke("sweep", str(config), "--trials", "2", "--no-progress").exit_code == 0
    run = _run_of(tmp_path / "runs")
    assert RunDir.open(run).read_meta()["command_line"] == {"trials": 2}
    resumed = _invoke("sweep", str(config), "--resume", str(run), "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    rows = read_results(run)
    assert (rows["phase"] == "search").sum() == 2  # not the config's 4
    assert _invoke("sweep", str(config), "--resume", str(run), "--trials", "3", "--no-progress").exit_code == 0
    assert (read_results(run)["phase"] == "search").sum() == 3
    assert RunDir.open(run).read_meta()["command_line"] == {"trials": 3}


@pytest.mark.usefixtures("ray_local")
def test_a_resume_refuses_a_run_whose_sources_spec_or_config_changed(tmp_path):
    """Seen: after a target's source changed, --resume re-ran its whole study (a second baseline,
    24 rows for 12 planned) while meta.json kept the old hash."""
    target = write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 2, "sampler": "random"},
                          measure={"final_top_k": 0})
    assert _invoke("sweep", str(config), "--no-progress").exit_code == 0
    run = _run_of(tmp_path / "runs")
    rows = len(read_results(run))
    source = tmp_path / "t" / "tiny.c"
    original = source.read_text()

    def refused(field: str, file: Path, *says: str) -> None:
        result = _invoke("sweep", str(config), "--resume", str(run), "--no-progress")
        assert result.exit_code == 2, result.output
        [line] = [line for line in result.output.splitlines() if line.strip()]
        assert line.startswith(f"error: {file}: {field}: "), line
        assert all(s in line for s in says), line
        assert len(read_results(run)) == rows  # nothing ran

    source.write_text(original + "\n/* edited */\n")
    refused("targets.tiny", run / "meta.json", "the sources of target tiny changed since the run", str(target))
    source.write_text(original)
    spec = yaml.safe_load(target.read_text())
    target.write_text(yaml.safe_dump({**spec, "run": ["{binary}", "--other"]}))
    refused("target_specs.tiny", run / "meta.json", "the spec of target tiny changed")
    target.write_text(yaml.safe_dump(spec))
    settings = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**settings, "search": {"trials": 3, "sampler": "tpe"}}))
    refused("search.sampler", run / "config.yaml", "changed since the run ('random' -> 'tpe')")
    config.write_text(yaml.safe_dump({**settings, "search": {"trials": 3, "sampler": "random"}}))
    resumed = _invoke("sweep", str(config), "--resume", str(run), "--no-progress")  # a larger budget is fine
    assert resumed.exit_code == 0, resumed.output
    assert (read_results(run)["phase"] == "search").sum() == 3


@pytest.mark.usefixtures("ray_local")
def test_accept_changes_starts_a_new_study_for_the_changed_target_only(tmp_path):
    """Issue 16: `--resume --accept-changes` of a run whose target a changed since: a's study starts
    again (generation 2) beside its old rows, which stay on disk but count no more; b goes on as it was."""
    write_target(tmp_path / "a", name="a")
    write_target(tmp_path / "b", name="b")
    config = write_config(tmp_path, ["a/target.yaml", "b/target.yaml"], search={"trials": 2, "sampler": "random"},
                          measure={"final_top_k": 1, "final_runs": 1})
    assert _invoke("sweep", str(config), "--no-progress").exit_code == 0
    run = _run_of(tmp_path / "runs")
    before = read_results(run)
    old_hash = RunDir.open(run).read_meta()["targets"]["a"]
    source = tmp_path / "a" / "tiny.c"
    source.write_text(source.read_text() + "\n/* edited */\n")

    refused = _invoke("sweep", str(config), "--resume", str(run), "--no-progress")
    [line] = refused.output.strip().splitlines()
    assert refused.exit_code == 2 and line.startswith(f"error: {run / 'meta.json'}: targets.a: the sources of "
                                                      "target a changed since the run"), refused.output
    assert "--accept-changes to start a new study for it" in line
    resumed = _invoke("sweep", str(config), "--resume", str(run), "--accept-changes", "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    assert "target a changed since the run: a new study (generation 2)" in resumed.output

    everything = read_results(run, superseded=True)
    old, new = everything[everything["generation"].fillna(1) == 1], everything[everything["generation"] == 2]
    assert old.drop(columns="generation").equals(before.drop(columns="generation"))  # every old row, as it was
    assert set(new["target"]) == {"a"} and (new["phase"] == Phase.BASELINE.value).sum() == 1
    assert (new["phase"] == Phase.SEARCH.value).sum() == 2 and new["study"].str.endswith("#2").all()
    assert set(new["source_hash"]) == {load_target(tmp_path / "a" / "target.yaml").bundle.hash} != {old_hash}
    assert not set(new["candidate_key"]) & set(old["candidate_key"])
    current = read_results(run)  # what show, export and the selection read
    assert len(current) == len(everything) - (before["target"] == "a").sum()
    assert current[current["target"] == "b"].equals(before[before["target"] == "b"])  # b: nothing re-run
    best = {b.target: b.candidate_key for b in select_best(current)}
    assert best["a"] in set(new["candidate_key"])
    assert best["b"] == {b.target: b.candidate_key for b in select_best(before)}["b"]
    [record] = json.loads(_invoke("export", str(run), "--format", "json", "--target", "a").stdout)
    assert record["source_hash"] == new["source_hash"].iloc[0]

    meta = RunDir.open(run).read_meta()
    assert meta["generations"] == {"a": 2} and meta["targets"]["a"] == new["source_hash"].iloc[0]
    assert [(s["target"], s["generation"], s["sources"]) for s in meta["superseded"]] == [("a", 1, old_hash)]
    assert RunDir.open(run).check_resumable(load_run(config)) == []  # the next resume needs no flag
    settings = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**settings, "measure": {**settings["measure"], "runs": 2}}))
    refused = _invoke("sweep", str(config), "--resume", str(run), "--accept-changes", "--no-progress")
    [line] = refused.output.strip().splitlines()
    assert refused.exit_code == 2 and line.startswith(f"error: {run / 'config.yaml'}: measure.runs: changed since")
    assert "--accept-changes covers changed targets only" in line
    assert len(read_results(run, superseded=True)) == len(everything)


@pytest.mark.parametrize("command", ["sweep", "optimize"])
def test_accept_changes_without_resume_is_a_usage_error(tmp_path, command):
    target = write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    given = str(config) if command == "sweep" else str(target)
    result = _invoke(command, given, "--accept-changes", "--output-dir", str(tmp_path / "runs"), "--no-progress")
    [line] = result.output.strip().splitlines()
    assert result.exit_code == 2 and line.startswith("error: ") and line.endswith(
        f" {command}: --accept-changes is for --resume RUN only"), result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.usefixtures("ray_local")
def test_ctrl_c_says_how_to_resume(tmp_path, monkeypatch):
    from cluster.engine import driver

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver.Sweep, "run", interrupted)
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    result = _invoke("sweep", str(config), "--no-progress")
    run = _run_of(tmp_path / "runs")
    assert result.exit_code == 130
    assert result.output.strip().splitlines()[-1] == f"aborted; resume with: warpfleet sweep {config} --resume {run}"


def _cli_subprocess(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": repo_pythonpath(), "RAY_TMPDIR": str(tmp_path / "ray")}  # no "current cluster" of others'
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _other_ray_on_this_machine() -> bool:
    from ray._private.services import find_gcs_addresses

    return bool(find_gcs_addresses())


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:9"])
def test_an_address_with_no_cluster_is_one_line_and_writes_nothing(tmp_path, address):
    if address == "auto" and _other_ray_on_this_machine():
        pytest.skip("`auto` joins any Ray instance on this machine, and one is running")
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    done = _cli_subprocess(["sweep", str(config), "--address", address, "--no-progress"], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: {config}: --address: cannot join a Ray cluster at {address}")
    assert not (tmp_path / "runs").exists()


def test_trials_past_the_cap_are_refused_on_the_command_line(tmp_path):
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"])
    result = _invoke("sweep", str(config), "--trials", "1000000000")
    assert result.exit_code == 2 and "1000000000 is not in the range 1<=x<=10000000" in result.output
    assert not (tmp_path / "runs").exists()


# -- runs written from given measurements ----------------------------------------------------------
def _gpu_run(tmp_path: Path, final: tuple[float, ...] = (1.0,) * 5, baseline_status: Status = Status.OK) -> Path:
    base_samples = (2.0,) * 3 if baseline_status is Status.OK else ()
    return write_run(tmp_path, "run", SAXPY, H100, [
        Row(BASE, base_samples, phase=Phase.BASELINE, status=baseline_status),
        Row(TUNED, (1.0,) * 3, {"opt_level": "-Xptxas -O2"}),
        Row(TUNED, final, {"opt_level": "-Xptxas -O2"}, phase=Phase.FINAL)])


def test_a_noisy_winner_is_marked_with_what_to_do_in_show_export_and_compare(tmp_path):
    run = _gpu_run(tmp_path, final=(1.0, 1.4, 0.6, 1.0, 1.2))
    shown = _invoke("show", str(run))
    assert shown.exit_code == 0 and " *" in shown.output, shown.output
    footnote = [line for line in shown.output.splitlines() if line.startswith("* noisy:")]
    assert footnote and "measure.final_runs" in footnote[0] and "off the GPU" in footnote[0]
    assert "nvidia-smi" not in shown.output and "clock" not in footnote[0]  # nothing that changes the machine
    flags = _invoke("export", str(run), "--format", "flags")
    assert flags.exit_code == 0 and "# noisy: " in flags.output and "measure.final_runs" in flags.output
    [record] = json.loads(_invoke("export", str(run), "--format", "json").stdout)
    assert record["noisy"] is True and "measure.final_runs" in record["noisy_advice"]
    assert yaml.safe_load(_invoke("export", str(run), "--format", "yaml").stdout)[0]["noisy"] is True
    assert " * noisy: " in _invoke("export", str(run), "--format", "header").output
    assert "# noisy: " in _invoke("export", str(run), "--format", "cmake").output
    compared = _invoke("compare", str(run), "--no-compile")
    assert f"| tuned on {H100.device_type} in run * |" in compared.output
    assert "* noisy: " in compared.output
    [matrix] = json.loads(_invoke("compare", str(run), "--no-compile", "--format", "json").stdout)
    assert [c["noisy"] for c in matrix["configs"]] == [True, False]
    quiet = _gpu_run(tmp_path / "quiet")
    assert "noisy" not in _invoke("show", str(quiet)).stdout
    assert "noisy" not in _invoke("export", str(quiet), "--format", "flags").output


def test_show_prints_no_speedup_where_there_is_none(tmp_path):
    run = _gpu_run(tmp_path, baseline_status=Status.CRASHED)
    shown = _invoke("show", str(run))
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if "saxpy" in line)
    assert "nan" not in row.lower() and " - " in row


def test_a_patch_of_winners_that_change_no_source_says_so(tmp_path):
    run = _gpu_run(tmp_path)
    out = tmp_path / "winner.patch"
    result = CliRunner().invoke(main, ["export", str(run), "--format", "patch", "--output", str(out)])
    assert result.exit_code == 0 and "no source change" in result.output, result.output
    assert not out.exists()
    printed = CliRunner().invoke(main, ["export", str(run), "--format", "patch"])
    assert printed.exit_code == 0 and printed.output.strip().splitlines() == [
        f"{run}: no source change: the winners build the targets' own sources; their flags and defines are "
        "what to export (--format flags, header, cmake)"]


def test_two_runs_on_one_device_type_are_labelled_by_run(tmp_path):
    """Seen with two CPU sweeps: "tuned on AMD EPYC (host)" twice in one matrix."""
    first = _gpu_run(tmp_path / "a")
    second = write_run(tmp_path / "b", "other", SAXPY, H100, [
        Row(BASE, (2.0,) * 3, phase=Phase.BASELINE),
        Row({"BLOCK": 512, "ITEMS": 2}, (1.1,) * 5, phase=Phase.FINAL)])
    [matrix] = json.loads(_invoke("compare", str(first), str(second), "--format", "json", "--no-compile").stdout)
    labels = [c["label"] for c in matrix["configs"] if not c["baseline"]]
    assert labels == [f"tuned on {H100.device_type} in other", f"tuned on {H100.device_type} in run"]  # by run
    [again] = json.loads(_invoke("compare", str(second), str(first), "--format", "json", "--no-compile").stdout)
    assert again == matrix  # whatever the order the runs are given in


def test_validate_says_what_a_time_budget_asks_of_the_targets(tmp_path):
    write_target(tmp_path / "a")
    roomy = write_config(tmp_path, ["a/target.yaml"], search={"time_budget_s": 600},
                         measure={"final_top_k": 3, "final_runs": 5})
    result = CliRunner().invoke(main, ["validate", str(roomy)])
    assert result.exit_code == 0, result.output
    # 1 baseline run, then (3 finalists + the baseline) x (5 runs + 1 of the baseline's references): 25 runs
    assert "time budget 600 s: each target's baseline and finals take 25 runs" in result.output
    assert "under 24 s" in result.output
    tight = write_config(tmp_path, ["a/target.yaml"], search={"time_budget_s": 5})
    result = CliRunner().invoke(main, ["validate", str(tight)])
    assert result.exit_code == 0 and "warning:" in result.output and "may not hold" in result.output


def test_validate_notes_a_cuda_target_without_a_smaller_problem_for_the_sanitizer(tmp_path):
    write_target(tmp_path / "full", toolchain="nvcc")
    write_target(tmp_path / "small", toolchain="nvcc", name="small",
                 verify={"outputs": ["out.bin"], "sanitize_run": ["{binary}", "16"]})
    config = write_config(tmp_path, ["full/target.yaml", "small/target.yaml"],
                          agents={"enabled": True, "sanitizer": ["memcheck"], "sanitizer_timeout_s": 90})
    result = CliRunner().invoke(main, ["validate", str(config)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {tmp_path / 'full' / 'target.yaml'}: no verify.sanitize_run: on a GPU, compute-sanitizer "
                     f"(memcheck) runs each variant that measures faster than the baseline on the full problem, up "
                     f"to 90 s per tool; give it a smaller one (README: Bounded verification)"]
    quiet = write_config(tmp_path, ["full/target.yaml"], agents={"enabled": True, "sanitizer": []})
    assert "note:" not in CliRunner().invoke(main, ["validate", str(quiet)]).output


SLOW_C = TINY_C.replace("int main(void) {", "#include <unistd.h>\nint main(void) {\n    usleep(300000);")


def test_sigterm_stops_a_sweep_as_ctrl_c_does_and_no_banner_precedes_its_output(tmp_path):
    """Seen: SIGTERM (Slurm's time limit, kill, timeout) dumped Ray's C++ stack traces and aborted,
    and Ray's "Token authentication is enabled" banner came before every sweep's output."""
    write_target(tmp_path / "t")
    (tmp_path / "t" / "tiny.c").write_text(SLOW_C)
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 200, "sampler": "random"},
                          measure={"final_top_k": 1, "final_runs": 1})
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": repo_pythonpath()}
    proc = subprocess.Popen([sys.executable, "-m", "cluster.cli", "sweep", str(config), "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(180, proc.kill)
    watchdog.start()
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.rstrip().endswith(": search"):
                break
        proc.send_signal(signal.SIGTERM)
        lines += proc.stderr.read().splitlines()
        returncode = proc.wait()
    finally:
        watchdog.cancel()
    run = _run_of(tmp_path / "runs")
    assert returncode == 143, lines
    assert lines[0] == f"run directory: {run}", lines  # nothing before it
    assert lines[-1] == f"terminated; resume with: warpfleet sweep {config} --resume {run}"
    assert not [line for line in lines if "SIGTERM" in line or "***" in line or "Traceback" in line], lines
    assert "baseline" in set(read_results(run)["phase"])  # the rows measured are kept for the resume


def test_a_misspelt_expert_is_the_options_error_and_optimize_leaves_nothing(tmp_path):
    """Seen: `optimize --experts padd` reported against the config file optimize had generated,
    which it left behind."""
    target = write_target(tmp_path / "t")
    out = tmp_path / "out"
    result = _invoke("optimize", str(target), "--experts", "padd", "--output-dir", str(out), "--no-progress")
    [line] = result.output.strip().splitlines()
    assert result.exit_code == 2 and line.startswith("error: main optimize: Invalid value for '--experts': "
                                                     "unknown expert 'padd' (known: registers, "), result.output
    result = _invoke("optimize", str(target), "--sanitizer", "memchek", "--output-dir", str(out), "--no-progress")
    assert result.exit_code == 2 and "Invalid value for '--sanitizer'" in result.output, result.output
    assert not out.exists()


@pytest.mark.usefixtures("ray_local")
def test_a_sweep_that_no_target_can_run_here_is_one_line_and_leaves_no_run(tmp_path, monkeypatch):
    """Seen on a machine without a GPU: `optimize` of a CUDA target said "skipped transpose: no GPU
    worker", then a KeyError traceback, exit status 1 and a run directory; a sweep of GPU targets
    only ended "0 rows written" and suggested `show`."""
    config = write_config(tmp_path, [str(SAXPY.file)], cluster={"gpu_types": ["B999"]})
    result = _invoke("sweep", str(config), "--no-progress")
    [line] = result.output.strip().splitlines()
    assert result.exit_code == 2 and line.startswith(
        f"error: {config}: targets: no GPU of cluster.gpu_types (B999) in the cluster (present: "), result.output
    assert line.endswith("), and saxpy needs one: nothing to run") and not (tmp_path / "runs").exists()
    # where the check passed and the workers then were not there: exit status 1, not a run of nothing
    import cluster.cli

    monkeypatch.setattr(cluster.cli, "_check_runnable_here", lambda *args: None)
    monkeypatch.setattr(cluster.cli, "_check_runnable", lambda *args: None)
    result = _invoke("sweep", str(config), "--no-progress")
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: every target was skipped (") and last.endswith("): nothing was run"), last
    assert "saxpy: no GPU worker in the cluster" in last
    assert "rows written" not in result.output and "next:" not in result.output


@pytest.mark.usefixtures("ray_local")
@pytest.mark.skipif(gpu_present(), reason="a GPU is here: optimize would run")
def test_optimize_without_a_gpu_is_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    result = _invoke("optimize", str(SAXPY.file), "--output-dir", str(out), "--no-progress")
    [line] = result.output.strip().splitlines()
    assert result.exit_code == 2 and line == (f"error: {SAXPY.file}: toolchain: no GPU in the cluster, and saxpy "
                                              "needs one: nothing to run"), result.output
    assert not out.exists()


NO_RAY_PROBE = """
import sys
import ray
from click.testing import CliRunner
from cluster.cli import main
result = CliRunner().invoke(main, sys.argv[1:])
print(result.exit_code, ray.is_initialized())
print(result.output, end="")
"""


@pytest.mark.parametrize("command", ["sweep", "optimize"])
def test_gpu_targets_and_no_gpu_here_are_one_line_before_ray_starts(tmp_path, command):
    """Seen: optimize's "no GPU" answer took 15 s, Ray's start-up on a loaded machine."""
    given = str(write_config(tmp_path, [str(SAXPY.file)])) if command == "sweep" else str(SAXPY.file)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": repo_pythonpath()}  # no GPU, whatever this machine has
    done = subprocess.run([sys.executable, "-c", NO_RAY_PROBE, command, given, "--output-dir", str(tmp_path / "out"),
                           "--no-progress", "--unsandboxed"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    first, *output = done.stdout.splitlines()
    assert first == "2 False", done.stdout + done.stderr  # exit status 2, and Ray never started
    field = "targets" if command == "sweep" else "toolchain"
    assert output[-1] == f"error: {given}: {field}: no GPU in the cluster, and saxpy needs one: nothing to run"
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("ray_local")
def test_a_budgeted_sweep_says_what_ray_took_of_its_budget(tmp_path):
    _signed_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"sampler": "grid", "trials": 1},
                          measure={"final_top_k": 1, "final_runs": 1})
    result = _invoke("sweep", str(config), "--no-progress", "--time-budget", "300")
    assert result.exit_code == 0, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("Ray ")]
    assert re.fullmatch(r"Ray started in \d+ s; \d+ s of the 300 s budget left", line), line
    untimed = _invoke("sweep", str(config), "--no-progress")
    assert untimed.exit_code == 0 and "budget left" not in untimed.output


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("where", ["results", "journal"])
def test_a_full_disk_under_the_run_is_one_line_with_the_resume_command(tmp_path, monkeypatch, where):
    """Seen: a traceback (the rows were kept and a resume finished)."""
    import errno

    from optuna.storages.journal import JournalFileBackend

    from cluster.store.results import ResultWriter

    cls, name = (ResultWriter, "_write_part") if where == "results" else (JournalFileBackend, "append_logs")
    real, calls = getattr(cls, name), []

    def fills_up(self, *args):
        calls.append(1)
        if len(calls) > 2:  # the disk is full from the third write on
            raise OSError(errno.ENOSPC, "No space left on device", "/full/part")
        return real(self, *args)

    monkeypatch.setattr(cls, name, fills_up)
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 8, "sampler": "random"},
                          measure={"final_top_k": 1, "final_runs": 1}, flush_interval_s=0.01)
    result = _invoke("sweep", str(config), "--no-progress")
    run = _run_of(tmp_path / "runs")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {run}: cannot write the run (/full/part: No space left on device); the rows written "
                      f"are kept: make room, then resume with: warpfleet sweep {config} --resume {run}"]
    if where == "results":
        assert len(read_results(run)) >= 1  # the parts written before the disk filled


@pytest.mark.usefixtures("ray_local")
def test_a_damaged_journal_stops_a_resume_in_one_line_and_after_check_the_resume_rebuilds_it(tmp_path):
    write_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"trials": 2, "sampler": "random"},
                          measure={"final_top_k": 1, "final_runs": 1})
    assert _invoke("sweep", str(config), "--no-progress").exit_code == 0
    run = _run_of(tmp_path / "runs")
    journal = run / "optuna.journal"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([lines[0], b"{not json\n", *lines[1:]]))
    refused = _invoke("sweep", str(config), "--resume", str(run), "--trials", "4", "--no-progress")
    assert refused.exit_code == 2 and refused.output.splitlines() == [
        f"error: {journal}: not a readable Optuna journal (JSONDecodeError: Expecting property name enclosed in "
        f"double quotes: line 1 column 2 (char 1)); `warpfleet check {run}` moves it aside, and a resume rebuilds "
        "it from the rows"], refused.output
    assert _invoke("check", str(run)).exit_code == 0
    resumed = _invoke("sweep", str(config), "--resume", str(run), "--trials", "4", "--no-progress")
    assert resumed.exit_code == 0, resumed.output
    search = read_results(run).query("phase == 'search'")
    assert len(search) == 4 and search["candidate_key"].is_unique  # the first two were not measured again


def test_the_readme_names_modules_commands_and_columns_that_exist():
    """Seen: README's `python -m agents.llm.fake_server` (no such module: agents.llm.testing is), and
    its variants/ columns said `agent` where the files say analyst, planner, transformer."""
    import importlib.util
    import re

    from cluster.store.variants import VARIANT_SCHEMA

    readme = (REPO / "README.md").read_text()
    modules = set(re.findall(r"python -m ((?:agents|cluster|search_spaces)[\w.]*)", readme))  # ours
    assert "agents.llm.testing" in modules
    assert [m for m in modules if importlib.util.find_spec(m) is None] == []
    # in code: an indented block's line, or between backticks
    commands = set(re.findall(r"(?:^ {4,}(?:[A-Z_]+=\S+ )?|`)warpfleet ([a-z-]+)", readme, flags=re.MULTILINE))
    assert commands and commands <= set(main.commands), commands - set(main.commands)
    listed = readme[readme.index("        variants/ "):readme.index("        variant_sources/")]
    assert "`sweep --json`" in readme and "`show --json`" in readme
    assert 'pip install -e ".[test' in readme  # what running pytest directly needs
    from cluster.toolchains import get_toolchain

    cc = ", ".join(f'"{arg}"' if "{" in arg else arg for arg in get_toolchain("cc").default_build)
    assert f"`[{cc}]`" in readme, cc  # the cc toolchain's default build
    assert "`optimize-<target>.yaml` into `--output-dir`" in readme
    columns = set(re.findall(r"\b(optimization|location|stage|analyst|planner|transformer|agent)\b", listed))
    assert columns == {"optimization", "location", "stage", "analyst", "planner", "transformer"}
    assert columns <= set(VARIANT_SCHEMA.names)


def test_show_json_is_each_study_with_its_counts_and_winner(tmp_path):
    run = _gpu_run(tmp_path)
    shown = _invoke("show", str(run), "--json")
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.stdout)
    assert document["run_dir"] == str(run) and document["run_id"]
    [study] = document["studies"]
    assert (study["target"], study["device_type"], study["evaluated"], study["failed"]) == \
        ("saxpy", H100.device_type, 1, 0)
    assert study["selected"]["params"] == TUNED and study["selected"]["speedup"] == 2.0
    [exported] = json.loads(_invoke("export", str(run), "--format", "json").stdout)
    assert study["selected"] == exported  # the winner as the json export writes it
    assert _undocumented(document) == [] and _undocumented(study) == []


def test_validate_json_is_the_targets_spaces_notes_and_budget(tmp_path):
    write_target(tmp_path / "a")
    config = write_config(tmp_path, ["a/target.yaml"], search={"time_budget_s": 600})
    result = CliRunner().invoke(main, ["validate", str(config), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    [target] = document["targets"]
    assert target["name"] == "tiny" and target["toolchain"] == "cc" and target["configurations"] >= 1
    assert document["notes"] == [] and document["build"] is None
    assert document["time_budget"]["warning"] is False and "time budget 600 s" in document["time_budget"]["line"]


@pytest.mark.usefixtures("ray_local")
def test_sweep_json_is_the_summary_with_the_studies_and_what_to_run_next(tmp_path):
    _signed_target(tmp_path / "t")
    config = write_config(tmp_path, ["t/target.yaml"], search={"sampler": "grid", "trials": 3},
                          measure={"final_top_k": 1, "final_runs": 2})
    result = _invoke("sweep", str(config), "--no-progress", "--json")
    assert result.exit_code == 0, result.output
    run = _run_of(tmp_path / "runs")
    document = json.loads(result.stdout)
    assert document["run_dir"] == str(run) and document["rows_written"] == len(read_results(run))
    [study] = document["studies"]
    assert study["selected"]["params"] == {"MODE": 0} and study["failed"] == 2
    assert document["next"][0] == f"warpfleet show {run}" and document["unfinished"] == []
    assert "rows written to" in result.stderr  # the lines for humans stay where they were
    assert _undocumented(document) == [] and _undocumented(study) == []


def _undocumented(record: dict) -> list[str]:
    """The keys of a --json document that README does not name (between backticks)."""
    readme = (REPO / "README.md").read_text()
    return [key for key in record if f"`{key}`" not in readme]


@pytest.mark.parametrize("command", [["export", "--format", "json"], ["compare", "--no-compile"]])
def test_an_output_file_in_a_folder_that_does_not_exist_is_refused(tmp_path, command):
    """Seen: export --output /nonexistent/dir/x.h made the folders and exited 0, so a typo sent the
    result somewhere new."""
    run = _gpu_run(tmp_path)
    out = tmp_path / "typo" / "dir" / "x.json"
    result = _invoke(command[0], str(run), *command[1:], "--output", str(out))
    assert result.exit_code == 2 and result.output.splitlines() == [
        f"error: {out}: --output: no folder {out.parent} to write it in (make it first)"], result.output
    assert not (tmp_path / "typo").exists()
    written = _invoke(command[0], str(run), *command[1:], "--output", str(tmp_path / "x.json"))
    assert written.exit_code == 0 and (tmp_path / "x.json").is_file(), written.output


def _cpu_run(tmp_path: Path, final: tuple[float, ...] = (1.0,) * 5) -> Path:
    """A run of the C stencil on a CPU, written from given measurements."""
    from cluster.core.types import DeviceInfo

    stencil = load_target(REPO / "configs" / "targets" / "stencil_c" / "target.yaml")
    cpu = DeviceInfo(kind="cpu", name="AMD EPYC", arch="host", hostname="node")
    base, tuned = {"TILE": 64, "UNROLL": 1}, {"TILE": 16, "UNROLL": 1}
    return write_run(tmp_path, "run", stencil, cpu, [
        Row(base, (2.0,) * 3, phase=Phase.BASELINE), Row(tuned, (1.0,) * 3, {"opt_level": "-O3"}),
        Row(tuned, final, {"opt_level": "-O3"}, phase=Phase.FINAL)])


def test_a_noisy_cpu_winner_gets_advice_for_a_cpu(tmp_path):
    """Seen: every CPU run's footnote advised pinning the GPU clocks with nvidia-smi -lgc."""
    run = _cpu_run(tmp_path, (1.0, 1.4, 0.6, 1.0, 1.2))
    outputs = [_invoke("show", str(run)).output, _invoke("export", str(run), "--format", "flags").output,
               _invoke("export", str(run), "--format", "cmake").output,
               _invoke("compare", str(run), "--no-compile").output]
    for output in outputs:
        text = " ".join(output.split())
        assert "noisy: " in text and "off the machine's cores" in text, output
        assert "GPU" not in text and "nvidia-smi" not in text and "clock" not in text, output


def test_compare_says_that_an_arch_means_nothing_for_a_cpu_target(tmp_path):
    """Seen: `compare --arch sm_80` on a cc run printed the matrix as if the option were not given."""
    run = _cpu_run(tmp_path / "cpu")
    result = _invoke("compare", str(run), "--arch", "sm_80", "--no-compile")
    assert result.exit_code == 0 and result.stderr.splitlines() == [
        "note: --arch sm_80: ignored for stencil_c (cc): built for the host's CPU, not for a GPU arch"], result.stderr
    gpu_run = _gpu_run(tmp_path / "gpu")
    assert _invoke("compare", str(gpu_run), "--arch", "sm_80", "--no-compile").stderr == ""
