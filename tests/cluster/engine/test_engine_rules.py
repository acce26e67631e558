"""Engine rules that a user can see in the rows (issue 17): a measurement is reused only for the
same binary run the same way; a candidate that takes its worker down in the fresh-seed review is
kept out of the selection and the sweep goes on; the reviews are summed up in one line per study."""

from __future__ import annotations

import textwrap

import yaml

from cluster.config import load_run
from cluster.engine.driver import REVIEW_SCHEMA, Sweep
from cluster.store.results import read_results, read_table
from cluster.store.rundir import RunDir
from cluster.store.select import select_best
from tests.conftest import logged_lines

# N reaches the program only through the run command: both values build the same binary.
BY_ARGUMENT = textwrap.dedent(r"""
    #include <stdio.h>
    #include <stdlib.h>
    int main(int argc, char** argv) {
        int n = argc > 1 ? atoi(argv[1]) : 1;
        FILE* f = fopen("out.bin", "wb");
        float v[2] = {1.0f, 2.0f};
        fwrite(v, sizeof v, 1, f);
        fclose(f);
        for (int i = 0; i < 3; i++) printf("@warpfleet time_ms=%d.0\n", 10 * n);
        return 0;
    }
""")

# FAST=1 is 20x faster (it takes the time it prints: warpfleet's clock checks), right on every seed the
# sweep gives, and kills its worker on the review's. Its saving, 285 ms a run, is one the clock judges
# on a loaded 2-core machine: at 3 x 10 ms against 3 x 0.5 ms (28.5 ms), under two spinning processes
# and a second test worker, process starts varied by more than that, and its honest search row was
# once a clock_mismatch.
KILLER = textwrap.dedent(r"""
    #include <signal.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <unistd.h>
    #ifndef FAST
    #define FAST 0
    #endif
    int main(int argc, char** argv) {
        long seed = argc > 2 && !strcmp(argv[1], "--seed") ? atol(argv[2]) : 0;
        if (FAST && seed >= 1000000) kill(getppid(), SIGKILL);  /* the fresh seeds of the review */
        FILE* f = fopen("out.bin", "wb");
        float v[2] = {(float)seed, 2.0f};
        fwrite(v, sizeof v, 1, f);
        fclose(f);
        for (int i = 0; i < 3; i++) {
            usleep(FAST ? 5000 : 100000);
            printf("@warpfleet time_ms=%s\n", FAST ? "5.0" : "100.0");
        }
        return 0;
    }
""")


def sweep(tmp_path, source: str, target: dict, **config):
    folder = tmp_path / target["name"]
    folder.mkdir()
    (folder / "prog.c").write_text(source)
    # One flag option: the candidates differ by their params alone.
    (folder / "space.yaml").write_text(yaml.safe_dump({"name": "fixed", "toolchain": "cc",
                                                       "flags": {"opt_level": ["-O1"]}}))
    (folder / "target.yaml").write_text(yaml.safe_dump({"toolchain": "cc", "sources": ["prog.c"], "space": "space.yaml",
                                                        "verify": {"outputs": ["out.bin"]}, **target}))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "rules", "output_dir": str(tmp_path / "runs"),
                                    "targets": [f"{target['name']}/target.yaml"], **config}))
    plan = load_run(path)
    run_dir = RunDir.create(plan)
    lines = logged_lines()
    Sweep(plan, run_dir).run(show_progress=False)
    return run_dir, read_results(run_dir.path), lines


def test_the_same_binary_run_with_other_arguments_is_measured_again(tmp_path, ray_local):
    _, rows, _ = sweep(tmp_path, BY_ARGUMENT, {"name": "byarg", "run": ["{binary}", "{N}"],
                                                    "params": {"N": [1, 2, 3]}},
                             search={"sampler": "grid", "trials": 3})
    search = rows[rows["phase"] == "search"]
    assert search["binary_hash"].nunique() == 1  # one binary for every N ...
    by_n = dict(zip(rows["p_N"], rows["median"], strict=False))
    assert by_n == {1: 10.0, 2: 20.0, 3: 30.0}  # ... measured once per run command
    assert not rows["error_tail"].fillna("").str.contains("measured once").any()


def test_a_candidate_that_kills_its_worker_in_the_review_is_not_selected(tmp_path, ray_unsandboxed):
    run_dir, rows, lines = sweep(
        tmp_path, KILLER, {"name": "killer", "run": ["{binary}", "--seed", "{seed}"], "params": {"FAST": [0, 1]}},
        search={"sampler": "grid", "trials": 2}, measure={"final_top_k": 1, "final_runs": 1},
        cluster={"max_attempts": 2})
    reviews = read_table(run_dir.path, RunDir.REVIEWS, REVIEW_SCHEMA)
    fast = rows[(rows["p_FAST"] == 1) & (rows["phase"] == "search")]
    assert fast["status"].tolist() == ["ok"] and fast["speedup"].iloc[0] > 10
    assert reviews["status"].tolist() == ["failed"] and "did not complete" in reviews["detail"].iloc[0]
    assert reviews["candidate_key"].tolist() == fast["candidate_key"].tolist()
    [best] = select_best(rows)
    assert best.params["FAST"] == 0  # the sweep went on, and the candidate never won
    summary = [line for line in lines if "over 10x the baseline" in line]  # one line, not one per candidate
    assert len(summary) == 1 and summary[0].endswith(": 1 candidates over 10x the baseline, re-verified on fresh "
                                                     "seeds: 1 failed")


def test_the_searching_studies_share_the_workers_evenly(tmp_path, ray_local):
    """The look-ahead's free slots go to the study served least so far, not to the first in the
    config: on four H200s a time-boxed suite sweep gave the first target 33 candidates and the
    last ones none, because each freed slot went to the first study again."""
    names = ["first", "second", "third"]
    for name in names:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "prog.c").write_text(BY_ARGUMENT)
        (folder / "space.yaml").write_text(yaml.safe_dump({"name": "fixed", "toolchain": "cc",
                                                           "flags": {"opt_level": ["-O1"]}}))
        (folder / "target.yaml").write_text(yaml.safe_dump({
            "name": name, "toolchain": "cc", "sources": ["prog.c"], "space": "space.yaml",
            "run": ["{binary}", "{N}"], "params": {"N": list(range(1, 9))}, "verify": {"outputs": ["out.bin"]}}))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"name": "fair", "output_dir": str(tmp_path / "runs"),
                                    "targets": [f"{n}/target.yaml" for n in names],
                                    "search": {"sampler": "grid", "trials": 8}, "measure": {"final_top_k": 0}}))
    plan = load_run(path)
    run_dir = RunDir.create(plan)
    Sweep(plan, run_dir).run(show_progress=False)
    rows = read_results(run_dir.path)
    search = rows[rows["phase"] == "search"].sort_values("started_at")
    assert len(search) == 3 * 7  # N=1 is the baseline's point: answered without a run
    order = search["target"].tolist()
    first = {name: order.index(name) for name in names}
    last = {name: max(i for i, t in enumerate(order) if t == name) for name in names}
    # Served in turn, every study has begun its search within the first third and is still searching
    # in the second half (the first study starts a little ahead: its baseline is measured first).
    # Served first-in-config, the studies searched one after another.
    assert max(first.values()) <= len(order) // 3 and min(last.values()) >= len(order) // 2, order


def test_profile_candidates_choose_what_ncu_profiles_after_the_finals():
    from cluster.engine.flow import profiled_keys

    ok = ["base", "a", "b"]
    assert profiled_keys("none", "base", ["a"], ok, analysts=False) == []
    assert profiled_keys("best", "base", ["a"], ok, analysts=True) == ["base", "a"]
    assert profiled_keys("all", "base", ["a"], ok, analysts=False) == ok
    # baseline: the baseline alone, and not twice where the analysts profiled it ahead of the search.
    assert profiled_keys("baseline", "base", ["a"], ok, analysts=False) == ["base"]
    assert profiled_keys("baseline", "base", ["a"], ok, analysts=True) == []

