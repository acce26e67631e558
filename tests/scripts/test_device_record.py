"""scripts/device_record.py on the CPU: a C target and a patched copy of it, run in turn; each run's
samples (how many, their sum) as the program printed them, the device's columns empty (no GPU)."""

from __future__ import annotations

import difflib
import json

import pytest

from tests.conftest import TINY_C, needs, write_target


@needs("cc")
@needs("patch")
def test_the_baseline_and_a_patched_copy_are_run_in_turn(tmp_path):
    from scripts.device_record import main

    target = write_target(tmp_path / "targets" / "tiny", params={})
    five = TINY_C.replace("i < 3", "i < 5")
    (tmp_path / "five.diff").write_text("".join(difflib.unified_diff(
        TINY_C.splitlines(keepends=True), five.splitlines(keepends=True), "a/tiny.c", "b/tiny.c")))
    out = tmp_path / "rows.json"
    assert main([str(target), "--patch", str(tmp_path / "five.diff"), "--define", "N=7", "--runs", "2",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["name"], r["run"]) for r in rows] == [(n, i) for i in range(2) for n in ("baseline", "flags", "five")]
    by_name = {r["name"]: r for r in rows}
    assert by_name["baseline"]["n"] == 3 and by_name["baseline"]["sum_ms"] == pytest.approx(1.5 + 2.5 + 3.5)
    assert by_name["five"]["n"] == 5 and by_name["five"]["median"] == pytest.approx(3.5)
    assert all(r["ok"] and r["wall_ms"] > 0 and r["busy_ms"] is None for r in rows)
    assert sorted(p.name for p in (tmp_path / "targets").iterdir()) == ["tiny"]  # its copies are gone


def test_a_bad_target_is_one_line_naming_the_file_and_field(tmp_path, capsys):
    from scripts.device_record import main

    (tmp_path / "target.yaml").write_text("name: x\n")
    assert main([str(tmp_path / "target.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "target.yaml" in err and "sources" in err
