"""The results dataset: real Parquet files, read back the three ways users read them."""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import optuna
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from cluster.config import Target, TargetSpec
from cluster.core.types import (
    BuildArtifact,
    Candidate,
    DeviceInfo,
    KernelResources,
    Measurement,
    Phase,
    Scalar,
    SourceBundle,
    Status,
)
from cluster.store import parts as parts_module
from cluster.store import results as results_module
from cluster.store.results import (
    SCHEMA_VERSION,
    ResultWriter,
    make_row,
    read_keys,
    read_results,
    results_schema,
)
from search_spaces import load_space

GPU = DeviceInfo(kind="gpu", name="NVIDIA H100", arch="sm_90", uuid="GPU-1", compute_capability="9.0",
                 accelerator_type="H100", driver_version="550.54", cuda_version="12.4", node_id="n1",
                 hostname="host-a", worker_id="w0")


def _target(tmp_path: Path, name: str, params: dict[str, list[Scalar]], space: str = "cc") -> Target:
    spec = TargetSpec(name=name, toolchain="cc", space=space, sources=["k.c"], run=["{binary}"],
                      params=params)
    return Target(spec, str(tmp_path / f"{name}.yaml"), SourceBundle((("k.c", b"int main(){}"),)),
                  load_space(space, base=tmp_path))


@pytest.fixture
def targets(tmp_path: Path) -> tuple[Target, Target]:
    (tmp_path / "small.yaml").write_text('name: small\ntoolchain: cc\nflags:\n'
                                         '  opt_level: ["", "-O2"]\n  vectorize: ["", "-ftree-vectorize"]\n')
    saxpy = _target(tmp_path, "saxpy", {"BLOCK": [64, 128], "MODE": ["fast", "safe"]})
    stencil = _target(tmp_path, "stencil", {"BLOCK": [1.5, 2], "UNROLL": [1, 2, 4]}, space="small.yaml")
    return saxpy, stencil


def _candidate(target: Target, params: dict[str, Scalar], flags: dict[str, str] | None = None,
               phase: Phase = Phase.SEARCH, trial: int | None = 0) -> Candidate:
    chosen = {**target.space.baseline, **(flags or {})}
    return Candidate(target=target.name, toolchain="cc", device_type=GPU.device_type, arch=GPU.arch,
                     source_hash=target.bundle.hash, flags=tuple(chosen.items()),
                     params=tuple(params.items()), phase=phase, trial_number=trial)


def _ok(candidate: Candidate, samples: tuple[float, ...], kernels: tuple[KernelResources, ...] = (),
        status: Status = Status.OK) -> tuple[BuildArtifact, Measurement]:
    artifact = BuildArtifact(candidate.key, Status.OK, binary=b"\x7fELF" + candidate.key.encode(),
                             compile_s=1.5, kernels=kernels)
    measurement = Measurement(candidate.key, status, GPU, samples=samples, run_s=0.5, verify_s=0.1,
                              queue_s=0.2, started_at=1_700_000_000.25, finished_at=1_700_000_001.0,
                              error_tail="" if status is Status.OK else "mismatch at 3")
    return artifact, measurement


def _row(target: Target, params: dict[str, Scalar], samples: tuple[float, ...] = (1.0, 2.0, 3.0),
         **kwargs: object):
    candidate = _candidate(target, params, **kwargs)  # type: ignore[arg-type]
    return make_row("run1", candidate, *_ok(candidate, samples), baseline_median=4.0, goal="minimize",
                    unit="ms")


def test_schema_has_a_column_per_flag_and_param_typed_over_all_targets(targets):
    schema = results_schema(targets)
    assert schema.names[0] == "schema_version"
    flag_columns = [n for n in schema.names if n.startswith("f_")]
    assert flag_columns == ["f_opt_level", "f_march", "f_unroll", "f_fast_math", "f_vectorize"]
    assert schema.field("p_BLOCK").type == pa.float64()  # ints in one target, 1.5 in the other
    assert schema.field("p_UNROLL").type == pa.int64()
    assert schema.field("p_MODE").type == pa.string()
    assert schema.field("samples").type.value_type == pa.float64()
    assert schema.field("started_at").type == pa.timestamp("us", tz="UTC")


def test_rows_of_two_targets_read_back_with_pandas_pyarrow_and_duckdb(tmp_path, targets):
    saxpy, stencil = targets
    schema = results_schema(targets)
    with ResultWriter(tmp_path, schema) as writer:
        writer.append(_row(saxpy, {"BLOCK": 128, "MODE": "fast"}, flags={"opt_level": "-O3"}))
        writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "safe"}, trial=1))
        assert writer.flush() is not None
        writer.append(_row(stencil, {"BLOCK": 1.5, "UNROLL": 4}, flags={"vectorize": "-ftree-vectorize"}))
    parts = sorted((tmp_path / "results").glob("*.parquet"))
    assert len(parts) == 2
    assert all(pq.read_schema(p).equals(schema, check_metadata=True) for p in parts)

    frame = pd.read_parquet(tmp_path / "results")
    assert len(frame) == 3
    assert set(frame["schema_version"]) == {SCHEMA_VERSION}
    first = frame.iloc[0]
    assert (first["target"], first["f_opt_level"], first["p_BLOCK"], first["p_MODE"]) == \
        ("saxpy", "-O3", 128.0, "fast")
    assert first["flags"] == "-O3" and first["defines"] == "-DBLOCK=128 -DMODE=fast"
    assert first["f_march"] == "" and pd.isna(first["f_vectorize"]) and pd.isna(first["p_UNROLL"])
    assert (first["median"], first["speedup"], first["n_samples"]) == (2.0, 2.0, 3)
    assert list(first["samples"]) == [1.0, 2.0, 3.0]
    assert first["started_at"] == pd.Timestamp("2023-11-14 22:13:20.25", tz="UTC")
    assert first["gpu_name"] == "NVIDIA H100" and first["hostname"] == "host-a"

    table = ds.dataset(tmp_path / "results", format="parquet").to_table()
    assert table.num_rows == 3 and table.schema.field("p_UNROLL").type == pa.int64()

    rows = pytest.importorskip("duckdb").connect().execute(
        f"SELECT target, f_vectorize, p_UNROLL, p_BLOCK FROM read_parquet('{tmp_path}/results/*.parquet') "
        "WHERE target = 'stencil'").fetchall()
    assert rows == [("stencil", "-ftree-vectorize", 4, 1.5)]
    ours = read_results(tmp_path)
    assert ours["p_UNROLL"].dtype == "Int64" and ours["p_UNROLL"].tolist()[2] == 4  # nulls keep ints whole
    assert ours.astype(object).where(ours.notna(), None).equals(frame.astype(object).where(frame.notna(), None))


def test_flush_waits_for_the_interval(tmp_path, targets, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(results_module.time, "monotonic", lambda: now[0])
    writer = ResultWriter(tmp_path, results_schema(targets), flush_interval_s=2.0)
    assert writer.maybe_flush() is None  # nothing pending
    writer.append(_row(targets[0], {"BLOCK": 64, "MODE": "fast"}))
    now[0] += 1.9
    assert writer.maybe_flush() is None and writer.pending == 1
    now[0] += 0.2
    assert writer.maybe_flush() is not None and writer.pending == 0
    writer.append(_row(targets[0], {"BLOCK": 128, "MODE": "fast"}))
    assert writer.maybe_flush() is None  # the interval restarts at each flush
    writer.close()
    assert len(read_results(tmp_path)) == 2
    with pytest.raises(ValueError, match="closed"):
        writer.append(_row(targets[0], {"BLOCK": 64, "MODE": "safe"}))


def test_a_failed_flush_leaves_earlier_parts_readable_and_keeps_its_rows(tmp_path, targets, monkeypatch):
    saxpy = targets[0]
    writer = ResultWriter(tmp_path, results_schema(targets))
    writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "fast"}))
    writer.flush()

    def crash(src: object, dst: object) -> None:
        raise OSError("disk vanished")

    monkeypatch.setattr(parts_module.os, "replace", crash)
    writer.append(_row(saxpy, {"BLOCK": 128, "MODE": "fast"}))
    with pytest.raises(OSError, match="disk vanished"):
        writer.flush()
    assert writer.pending == 1
    assert os.listdir(tmp_path / "results") == [next((tmp_path / "results").glob("*.parquet")).name]
    assert list(read_results(tmp_path)["p_BLOCK"]) == [64]

    monkeypatch.undo()
    writer.close()  # the kept row is written by the next flush
    assert list(read_results(tmp_path)["p_BLOCK"]) == [64, 128]


def test_a_temp_file_left_by_a_killed_flush_is_ignored_by_readers_and_removed_on_resume(tmp_path, targets):
    with ResultWriter(tmp_path, results_schema(targets)) as writer:
        writer.append(_row(targets[0], {"BLOCK": 64, "MODE": "fast"}))
    stale = tmp_path / "results" / ".part-000001-deadbeef.tmp"
    stale.write_bytes(b"PAR1 half a file")

    assert len(pd.read_parquet(tmp_path / "results")) == 1
    assert ds.dataset(tmp_path / "results", format="parquet").count_rows() == 1
    assert pytest.importorskip("duckdb").connect().execute(
        f"SELECT count(*) FROM read_parquet('{tmp_path}/results/*.parquet')").fetchall() == [(1,)]
    assert len(read_results(tmp_path)) == 1

    ResultWriter(tmp_path, results_schema(targets)).close()
    assert not stale.exists()


def test_resume_continues_the_part_numbering(tmp_path, targets):
    schema = results_schema(targets)
    saxpy = targets[0]
    with ResultWriter(tmp_path, schema) as writer:
        for block in (64, 128):
            writer.append(_row(saxpy, {"BLOCK": block, "MODE": "fast"}))
            writer.flush()
    with ResultWriter(tmp_path, schema) as writer:
        writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "safe"}))
    names = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert [n[:11] for n in names] == ["part-000000", "part-000001", "part-000002"]
    assert all(len(n) == len("part-000000-01234567.parquet") for n in names)
    assert len(read_results(tmp_path)) == 3


def _read_three_ways(results: Path) -> tuple[pd.DataFrame, pa.Table, list[tuple]]:
    """The run's rows as pandas, pyarrow.dataset and DuckDB read a folder by default: each takes
    the first part's schema for every part."""
    duckdb = pytest.importorskip("duckdb")
    query = f"SELECT p_BLOCK, p_WF_SPLIT FROM read_parquet('{results}/*.parquet')"
    return (pd.read_parquet(results), ds.dataset(results, format="parquet").to_table(),
            duckdb.connect().execute(query).fetchall())


def _variant(tmp_path: Path, saxpy: Target) -> Target:
    """An agent's variant of saxpy with a param of its own and a BLOCK that is no longer an int."""
    return _target(tmp_path, "saxpy", {"BLOCK": ["wide", 64], "MODE": ["fast"], "WF_SPLIT": [1, 2]})


def test_a_widened_schema_rewrites_the_earlier_parts_so_default_readers_see_every_column(tmp_path, targets):
    saxpy = targets[0]
    wide = results_schema([saxpy, _variant(tmp_path, saxpy)])
    with ResultWriter(tmp_path, results_schema([saxpy])) as writer:
        writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "fast"}))
        writer.flush()
        writer.append(_row(saxpy, {"BLOCK": 128, "MODE": "safe"}, trial=1))  # pending: written, then rewritten
        writer.widen(wide)
        writer.append(_row(saxpy, {"BLOCK": "wide", "MODE": "fast", "WF_SPLIT": 2}, trial=2))
    parts = sorted((tmp_path / "results").glob("*.parquet"))
    assert len(parts) == 3 and all(pq.read_schema(p).equals(wide, check_metadata=True) for p in parts)
    frame, table, duck = _read_three_ways(tmp_path / "results")
    assert frame["p_BLOCK"].tolist() == ["64", "128", "wide"] and frame["p_WF_SPLIT"].tolist()[2] == 2
    assert table.column("p_WF_SPLIT").to_pylist() == [None, None, 2]
    assert duck == [("64", None), ("128", None), ("wide", 2)]
    assert read_results(tmp_path)["p_MODE"].tolist() == ["fast", "safe", "fast"]


def test_a_rewrite_cut_short_loses_no_row_and_the_next_writer_finishes_it(tmp_path, targets, monkeypatch):
    saxpy = targets[0]
    narrow = results_schema([saxpy])
    writer = ResultWriter(tmp_path, narrow)
    for block in (64, 128, 256):
        writer.append(_row(saxpy, {"BLOCK": block, "MODE": "fast"}, trial=block))
        writer.flush()
    real, replaced = os.replace, []

    def crash_on_the_second(src: object, dst: object) -> None:
        if replaced:
            raise OSError("killed")
        replaced.append(dst)
        real(src, dst)

    monkeypatch.setattr(parts_module.os, "replace", crash_on_the_second)
    with pytest.raises(OSError, match="killed"):
        writer.widen(results_schema([saxpy, _variant(tmp_path, saxpy)]))
    monkeypatch.undo()
    parts = sorted((tmp_path / "results").iterdir())
    assert replaced == [parts[0]] and all(p.name.startswith("part-") for p in parts)  # no temporary file left
    assert pd.read_parquet(tmp_path / "results")["p_BLOCK"].tolist() == ["64", "128", "256"]  # the first part's
    assert read_results(tmp_path)["trial_number"].tolist() == [64, 128, 256]

    ResultWriter(tmp_path, narrow).close()  # a resume: the parts' own columns and types kept
    assert len({pq.read_schema(p) for p in parts}) == 1
    frame, table, duck = _read_three_ways(tmp_path / "results")
    assert frame["p_BLOCK"].tolist() == ["64", "128", "256"] and table.num_rows == 3
    assert duck == [("64", None), ("128", None), ("256", None)]


def test_read_keys_lists_search_and_baseline_rows_only(tmp_path, targets):
    saxpy = targets[0]
    baseline = _row(saxpy, {"BLOCK": 64, "MODE": "fast"}, phase=Phase.BASELINE, trial=None)
    search = _row(saxpy, {"BLOCK": 128, "MODE": "fast"}, trial=3)
    final = _row(saxpy, {"BLOCK": 128, "MODE": "safe"}, phase=Phase.FINAL, trial=None)
    assert read_keys(tmp_path) == set()
    with ResultWriter(tmp_path, results_schema(targets)) as writer:
        for row in (baseline, search, final):
            writer.append(row)
    assert read_keys(tmp_path) == {baseline.candidate_key, search.candidate_key}
    frame = read_results(tmp_path)
    assert list(frame["phase"]) == ["baseline", "search", "final"]
    assert pd.isna(frame["trial_number"][0]) and frame["trial_number"][1] == 3


def test_a_failed_build_has_null_metrics_and_its_status_and_error_tail(tmp_path, targets):
    candidate = _candidate(targets[0], {"BLOCK": 64, "MODE": "fast"})
    artifact = BuildArtifact(candidate.key, Status.COMPILE_ERROR, compile_s=0.3,
                             error_tail="k.c:1: error: expected ';'")
    row = make_row("run1", candidate, artifact, None, baseline_median=4.0, goal="minimize")
    assert (row.status, row.error_tail, row.binary_hash) == \
        ("compile_error", "k.c:1: error: expected ';'", "")
    with ResultWriter(tmp_path, results_schema(targets)) as writer:
        writer.append(row)
    got = read_results(tmp_path).iloc[0]
    for column in ("samples", "median", "min", "iqr", "rel_noise", "speedup", "run_s", "queue_s",
                   "registers", "gpu_name", "started_at", "finished_at"):
        assert got[column] is None or pd.isna(got[column]), column
    assert got["n_samples"] == 0 and got["compile_s"] == 0.3 and got["status"] == "compile_error"


def test_a_measured_failure_keeps_samples_but_has_no_speedup(targets):
    candidate = _candidate(targets[0], {"BLOCK": 64, "MODE": "fast"})
    artifact, measurement = _ok(candidate, (1.0,), status=Status.VERIFY_FAILED)
    row = make_row("run1", candidate, artifact, measurement, baseline_median=4.0, goal="minimize")
    assert (row.status, row.error_tail, row.median, row.speedup) == \
        ("verify_failed", "mismatch at 3", 1.0, None)


@pytest.mark.parametrize(("goal", "median", "baseline", "expected"), [
    ("minimize", 2.0, 4.0, 2.0),   # half the time: twice as fast
    ("maximize", 8.0, 4.0, 2.0),   # twice the throughput
    ("maximize", 2.0, 4.0, 0.5),
    ("minimize", 2.0, None, None),
])
def test_speedup_follows_the_goal(targets, goal, median, baseline, expected):
    candidate = _candidate(targets[0], {"BLOCK": 64, "MODE": "fast"})
    row = make_row("r", candidate, *_ok(candidate, (median,)), baseline_median=baseline, goal=goal)
    assert row.speedup == expected


def test_an_unknown_goal_raises(targets):
    candidate = _candidate(targets[0], {"BLOCK": 64, "MODE": "fast"})
    with pytest.raises(ValueError, match="goal"):
        make_row("r", candidate, *_ok(candidate, (1.0,)), baseline_median=1.0, goal="fastest")


def test_kernel_resources_are_aggregated_and_kept_per_kernel(targets):
    kernels = (KernelResources("k1", "sm_90", registers=40, spill_stores=8, spill_loads=4, shared_bytes=1024),
               KernelResources("k2", "sm_90", registers=72, spill_stores=16, stack_bytes=32))
    candidate = _candidate(targets[0], {"BLOCK": 64, "MODE": "fast"})
    artifact, measurement = _ok(candidate, (1.0,), kernels=kernels)
    row = make_row("r", candidate, artifact, measurement, baseline_median=1.0, goal="minimize")
    assert (row.registers, row.spill_stores, row.spill_loads, row.shared_bytes, row.stack_bytes) == \
        (72, 24, 4, 1024, 32)
    assert [k["kernel"] for k in json.loads(row.kernels_json)] == ["k1", "k2"]
    assert row.started_at == datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)


def test_a_row_outside_the_schema_is_refused_at_append(tmp_path, targets):
    writer = ResultWriter(tmp_path, results_schema(targets[:1]))
    with pytest.raises(ValueError, match="p_UNROLL"):
        writer.append(_row(targets[1], {"BLOCK": 2, "UNROLL": 4}))
    with pytest.raises(ValueError, match="p_BLOCK"):
        writer.append(_row(targets[0], {"BLOCK": "wide", "MODE": "fast"}))
    assert writer.pending == 0


def test_read_results_without_parts_is_empty_with_columns(tmp_path, targets):
    schema = results_schema(targets)
    assert list(read_results(tmp_path, schema).columns) == schema.names
    empty = read_results(tmp_path)
    assert len(empty) == 0 and {"candidate_key", "status", "median"} <= set(empty.columns)


# -- damaged part files: one line naming the file; warpfleet check moves them aside ------------------
def _damage(part: Path, how: str) -> None:
    data = part.read_bytes()
    part.write_bytes({"truncated": data[: len(data) // 2], "zeroed": bytes(len(data)), "empty": b"",
                      "zeroed pages": data[:4] + bytes(len(data) // 2 - 4) + data[len(data) // 2:]}[how])


def _fake_run(tmp_path: Path) -> tuple[Path, Path]:
    """A run of two part files (the baseline's, then the rest); returns it and its second part."""
    from cluster.config import load_target
    from tests.cluster.outputs.fake_runs import Row, gpu, write_run
    from tests.conftest import REPO

    saxpy = load_target(REPO / "configs" / "targets" / "saxpy" / "target.yaml")
    device = gpu("NVIDIA H100 80GB HBM3", "9.0")
    run = write_run(tmp_path, "run", saxpy, device, [Row({"BLOCK": 256, "ITEMS": 1}, (2.0,) * 3, phase=Phase.BASELINE)])
    write_run(tmp_path, "run", saxpy, device, [Row({"BLOCK": 128, "ITEMS": 4}, (1.0,) * 3),
                                               Row({"BLOCK": 128, "ITEMS": 4}, (1.0,) * 5, phase=Phase.FINAL)])
    return run, sorted((run / "results").glob("part-*.parquet"))[1]


@pytest.mark.parametrize("how", ["truncated", "zeroed", "empty", "zeroed pages"])
def test_a_damaged_part_is_named_in_one_line_by_show_and_export_and_check_moves_it(tmp_path, how):
    from click.testing import CliRunner

    from cluster.cli import main

    run, part = _fake_run(tmp_path)
    _damage(part, how)
    for command in (["show", str(run)], ["export", str(run)], ["check", str(run), "--dry-run"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
        assert str(part) in result.output and len(result.output.strip().splitlines()) <= 2, result.output
    checked = CliRunner().invoke(main, ["check", str(run)])
    assert checked.exit_code == 0 and f"moved to {run / 'quarantine' / 'results' / part.name}" in checked.output
    assert (run / "quarantine" / "results" / part.name).is_file() and not part.exists()
    rows = read_results(run)
    assert list(rows["phase"]) == ["baseline"]  # the rest runs again on resume
    again = CliRunner().invoke(main, ["check", str(run)])
    assert again.exit_code == 0 and "every part file reads whole" in again.output
    assert pd.read_parquet(run / "results").shape[0] == 1


def test_a_part_is_encoded_in_pyarrows_memory_and_written_in_one_call(tmp_path, targets, monkeypatch):
    """Given a Python file, pyarrow takes the GIL for each of its hundreds of small writes, and in a
    sweep's driver, beside the agents' computing threads, a part took seconds while the loop stood
    still (BENCHMARKS.md, H100 host). Every part, a flush's and a widening's rewrites, is encoded
    into a pyarrow buffer and reaches its file in one write."""
    saxpy = targets[0]
    real_write_table, sinks = pq.write_table, []

    def recording(table, where, *args, **kwargs):
        sinks.append(where)
        return real_write_table(table, where, *args, **kwargs)

    writes: list[int] = []  # per file opened, its writes

    class Counted:
        def __init__(self, file):
            self.file = file
            writes.append(0)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            writes[-1] += 1
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    monkeypatch.setattr(parts_module.pq, "write_table", recording)
    monkeypatch.setattr(parts_module, "open", lambda path, mode: Counted(open(path, mode)),  # noqa: SIM115
                        raising=False)
    with ResultWriter(tmp_path, results_schema([saxpy])) as writer:
        writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "fast"}))
        writer.flush()
        writer.widen(results_schema([saxpy, _variant(tmp_path, saxpy)]))  # the first part rewritten
        writer.append(_row(saxpy, {"BLOCK": "wide", "MODE": "fast", "WF_SPLIT": 2}, trial=1))
    assert len(sinks) == 3 and all(isinstance(sink, pa.NativeFile) for sink in sinks)
    assert writes == [1, 1, 1]
    assert read_results(tmp_path)["p_WF_SPLIT"].tolist()[1] == 2


def test_the_writer_waits_out_a_machine_that_cannot_start_threads(tmp_path, targets, monkeypatch):
    """Seen under a fork bomb: pyarrow's "Failed to launch worker thread" in the driver. The flush
    waits and tries again; no row is lost; another error still propagates with the rows kept."""
    saxpy, _ = targets
    real = results_module.pq.write_table
    failures = [pa.ArrowException("Failed to launch worker thread: Resource temporarily unavailable"),
                RuntimeError("can't start new thread")]

    def flaky(*args, **kwargs):
        if failures:
            raise failures.pop(0)
        return real(*args, **kwargs)

    monkeypatch.setattr(results_module.pq, "write_table", flaky)
    monkeypatch.setattr(results_module.time, "sleep", lambda s: None)
    with ResultWriter(tmp_path, results_schema([saxpy])) as writer:
        writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "fast"}))
        assert writer.flush() is not None and not failures
    assert len(read_results(tmp_path)) == 1
    monkeypatch.setattr(results_module.pq, "write_table", lambda *a, **k: (_ for _ in ()).throw(
        OSError(28, "No space left on device")))
    writer = ResultWriter(tmp_path, results_schema([saxpy]))
    writer.append(_row(saxpy, {"BLOCK": 128, "MODE": "fast"}))
    with pytest.raises(OSError, match="No space"):
        writer.flush()
    assert writer.pending == 1 and not list(tmp_path.glob("results/.*"))


def test_rows_of_a_superseded_study_are_left_out_but_kept_and_old_parts_read_as_generation_one(tmp_path, targets):
    """--accept-changes (issue 16): a target's new study generation replaces the old one's rows in
    what read_results gives (show, export, a resume), while every row stays in the dataset."""
    saxpy, stencil = targets
    schema = results_schema(targets)
    with ResultWriter(tmp_path, schema) as writer:
        writer.append(_row(saxpy, {"BLOCK": 64, "MODE": "fast"}))
    [part] = (tmp_path / "results").glob("*.parquet")  # made a part of schema 1, without the column
    pq.write_table(pq.read_table(part).drop_columns(["generation"]), part)
    with ResultWriter(tmp_path, schema) as writer:
        writer.append(_row(stencil, {"BLOCK": 2, "UNROLL": 1}))
        second = dataclasses.replace(_candidate(saxpy, {"BLOCK": 128, "MODE": "safe"}), generation=2)
        writer.append(make_row("run1", second, *_ok(second, (1.0,)), baseline_median=4.0, goal="minimize"))
    assert sorted(read_results(tmp_path)["p_BLOCK"]) == [2.0, 64.0, 128.0]  # no meta.json: all of them
    assert pq.read_schema(part).equals(schema, check_metadata=True)  # rewritten with the column, null
    assert pd.read_parquet(tmp_path / "results").shape == (3, len(schema))

    (tmp_path / "meta.json").write_text(json.dumps({"run_id": "run1", "generations": {"saxpy": 2}}))
    current = read_results(tmp_path)
    assert sorted(zip(current["target"], current["p_BLOCK"], strict=True)) == [("saxpy", 128.0), ("stencil", 2.0)]
    assert current.loc[current["target"] == "saxpy", "study"].tolist() == [f"saxpy@{GPU.device_type}#2"]
    everything = read_results(tmp_path, superseded=True)
    assert len(everything) == 3 and everything["generation"].isna().sum() == 1
    assert second.key != _candidate(saxpy, {"BLOCK": 128, "MODE": "safe"}).key  # nor its references, reviews...


def test_a_parquet_file_of_another_schema_among_the_parts_is_named_by_every_reader_and_moved_by_check(tmp_path):
    """Seen: show and export dropped its rows silently, report raised AttributeError and check said
    every part read whole."""
    from click.testing import CliRunner

    from cluster.cli import main

    run, _ = _fake_run(tmp_path)
    foreign = run / "results" / "part-000009-0badc0de.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0], "target": ["saxpy", "saxpy"]}), foreign)
    for command in (["show", str(run)], ["export", str(run)], ["report", str(run), "--output", str(tmp_path / "r")],
                    ["check", str(run), "--dry-run"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code in (1, 2) and "Traceback" not in result.output, (command, result.output)
        assert f"{foreign}: unreadable (another table's schema: no column run_id)" in result.output or \
            f"{foreign}: not a readable Parquet part (another table's schema: no column run_id)" in result.output, \
            (command, result.output)
    checked = CliRunner().invoke(main, ["check", str(run)])
    assert checked.exit_code == 0 and f"moved to {run / 'quarantine' / 'results' / foreign.name}" in checked.output
    assert len(read_results(run)) == 3 and CliRunner().invoke(main, ["show", str(run)]).exit_code == 0


def test_a_damaged_journal_is_named_by_report_and_before_a_resume_and_check_moves_it_aside(tmp_path):
    """Seen: report and --resume ended in JSON tracebacks, and check did not look at the journal."""
    from click.testing import CliRunner

    from cluster.cli import main
    from cluster.core.errors import ConfigError
    from cluster.store.check import check_tables
    from cluster.store.journal import BatchedJournalStorage, journal_problem

    run, _ = _fake_run(tmp_path)
    journal = run / "optuna.journal"
    storage = BatchedJournalStorage(journal, flush_interval_s=0)
    optuna.create_study(storage=storage, study_name="saxpy@H100").ask()
    storage.flush()
    assert journal_problem(journal) == ""
    journal.write_bytes(journal.read_bytes() + b"garbage\n" + b'{"op_code": 4, "study_id": 0}\n')
    with pytest.raises(ConfigError) as info:  # what a resume checks before Ray starts
        check_tables(run)
    assert info.value.file == str(journal) and "not a readable Optuna journal" in info.value.message
    result = CliRunner().invoke(main, ["report", str(run), "--output", str(tmp_path / "r")])
    assert result.exit_code == 2 and result.output.splitlines() == [
        f"error: {journal}: not a readable Optuna journal (JSONDecodeError: Expecting value: line 1 column 1 "
        f"(char 0)); `warpfleet check {run}` moves it aside, and a resume rebuilds it from the rows"], result.output
    dry = CliRunner().invoke(main, ["check", str(run), "--dry-run"])
    assert dry.exit_code == 1 and f"{journal}: unreadable (JSONDecodeError" in dry.output and journal.is_file()
    checked = CliRunner().invoke(main, ["check", str(run)])
    assert checked.exit_code == 0 and "the Optuna journal moved aside; on resume the studies are rebuilt from the " \
        "rows" in checked.output, checked.output
    assert (run / "quarantine" / "optuna.journal").is_file() and not journal.exists()
    assert CliRunner().invoke(main, ["report", str(run), "--output", str(tmp_path / "r")]).exit_code == 0
