"""The run's Optuna journal: damage at its end is found by check and before a resume, and a last line
cut short by a killed driver is dropped before a resume appends."""

from __future__ import annotations

import optuna
import pytest
from click.testing import CliRunner

from cluster.cli import main
from cluster.core.errors import ConfigError
from cluster.store.check import check_tables
from cluster.store.journal import BatchedJournalStorage, journal_problem
from tests.cluster.store.test_results import _fake_run


def _journal_of_one_trial(run):
    journal = run / "optuna.journal"
    storage = BatchedJournalStorage(journal, flush_interval_s=0)
    optuna.create_study(storage=storage, study_name="saxpy@H100").ask()
    storage.flush()
    assert journal_problem(journal) == ""
    return journal


def test_a_garbage_last_line_is_named_by_check_and_before_a_resume(tmp_path):
    """Seen: check said every part file read whole (exit 0), and a resume appended after the line;
    the next resume and report then refused the journal."""
    run, _ = _fake_run(tmp_path)
    journal = _journal_of_one_trial(run)
    journal.write_bytes(journal.read_bytes() + b"garbage\n")
    with pytest.raises(ConfigError) as info:  # what sweep and optimize check before Ray starts
        check_tables(run)
    assert info.value.file == str(journal) and "not a readable Optuna journal (JSONDecodeError" in info.value.message
    dry = CliRunner().invoke(main, ["check", str(run), "--dry-run"])
    assert dry.exit_code == 1 and f"{journal}: unreadable (JSONDecodeError" in dry.output, dry.output
    assert "reads whole" not in dry.output
    checked = CliRunner().invoke(main, ["check", str(run)])
    assert checked.exit_code == 0 and (run / "quarantine" / "optuna.journal").is_file(), checked.output
    again = CliRunner().invoke(main, ["check", str(run)])
    assert again.output.splitlines() == [f"{run}: every part file reads whole; no Optuna journal to replay"]


def test_a_last_line_cut_short_is_dropped_before_the_journal_grows(tmp_path):
    run, _ = _fake_run(tmp_path)
    journal = _journal_of_one_trial(run)
    journal.write_bytes(journal.read_bytes() + b'{"op_code": 4, "stu')  # a driver killed mid-write
    assert journal_problem(journal) == ""  # Optuna leaves it out: nothing to move aside
    storage = BatchedJournalStorage(journal, flush_interval_s=0)
    optuna.load_study(storage=storage, study_name="saxpy@H100").ask()
    storage.flush()
    assert journal_problem(journal) == ""
    trials = optuna.load_study(storage=BatchedJournalStorage(journal), study_name="saxpy@H100").trials
    assert len(trials) == 2


def test_check_says_the_journal_replays(tmp_path):
    run, _ = _fake_run(tmp_path)
    _journal_of_one_trial(run)
    checked = CliRunner().invoke(main, ["check", str(run)])
    assert checked.exit_code == 0
    assert checked.output.splitlines() == [f"{run}: every part file reads whole and the Optuna journal replays"]
