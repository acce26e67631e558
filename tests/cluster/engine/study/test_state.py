"""Ask/tell bookkeeping of one study, with a real (in-memory) Optuna study."""

from __future__ import annotations

import optuna
import pytest

from cluster.config import SearchSpec, load_target
from cluster.core.types import DeviceInfo, Status
from cluster.engine.study.state import Evaluated, StudyState, make_sampler
from tests.conftest import write_target


def _study(tmp_path, objective: str) -> StudyState:
    target = load_target(write_target(tmp_path))
    search = SearchSpec(objective=objective, seed=3)
    directions = ["minimize", "minimize"] if objective == "time_energy" else ["minimize"]
    study = optuna.create_study(directions=directions, sampler=make_sampler(search))
    device = DeviceInfo("gpu", "fake gpu", "sm_90")
    return StudyState(target, None, device, [0], study, "sm_90", objective, space_size=target.space_size())


@pytest.mark.parametrize(("objective", "expected"), [
    ("time", [2.0]), ("energy", [0.5]), ("edp", [1.0]), ("time_energy", [2.0, 0.5])])
def test_objective_values_told_to_optuna(tmp_path, objective, expected):
    state = _study(tmp_path, objective)
    _, candidate = state.ask()
    state.pending.add(candidate.key)
    state.record(candidate, Evaluated(Status.OK, 2.0, 0.5))
    frozen = state.study.trials[0]
    assert frozen.state is optuna.trial.TrialState.COMPLETE and frozen.values == expected
    assert state.top(1) == [candidate] and state.n_search == 1


def test_missing_energy_or_failure_is_a_failed_trial(tmp_path):
    state = _study(tmp_path, "energy")
    _, first = state.ask()
    state.record(first, Evaluated(Status.OK, 2.0, None))  # no NVML reading: nothing to tell
    _, second = state.ask()
    state.record(second, Evaluated(Status.CRASHED, None))
    assert [t.state for t in state.study.trials] == [optuna.trial.TrialState.FAIL] * 2
    assert state.n_failed == 1 and state.top(3) == []


def test_a_known_key_is_told_without_evaluating_again(tmp_path):
    state = _study(tmp_path, "time")
    evaluated: dict[str, float] = {}
    for i in range(120):  # 64 points: later asks keep proposing known keys
        asked = state.ask()
        if asked is None:
            continue
        _, candidate = asked
        assert candidate.key not in evaluated  # never handed out twice
        evaluated[candidate.key] = 1.0 + i
        state.record(candidate, Evaluated(Status.OK, evaluated[candidate.key]))
    assert set(state.results) == set(evaluated) and state.n_search == len(evaluated)
    complete = [t for t in state.study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(complete) > len(evaluated)  # the repeats were told too, from the known results
    assert all(t.values == [evaluated[t.user_attrs["key"]]] for t in complete)


def test_storage_retry_waits_out_a_locked_database():
    from cluster.engine.study.state import storage_retry

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise optuna.exceptions.StorageInternalError("database is locked")
        return "told"

    assert storage_retry(flaky, first_wait_s=0.01) == "told" and len(calls) == 3
    with pytest.raises(optuna.exceptions.StorageInternalError):
        storage_retry(lambda: (_ for _ in ()).throw(optuna.exceptions.StorageInternalError("down")),
                      attempts=2, first_wait_s=0.01)


def test_a_param_of_many_values_keeps_the_journal_small(tmp_path):
    """A categorical's distribution, every value in it, went to the journal with each trial: a
    param of 10^4 values made every trial's record over 50 KB. Searched by index, it is an int."""
    from cluster.core.encodings import OPTUNA_PARAM_INDEX
    from cluster.store.journal import BatchedJournalStorage

    values = list(range(10_000))
    target = load_target(write_target(tmp_path, params={"N": values}))
    storage = BatchedJournalStorage(tmp_path / "journal.log", flush_interval_s=0)
    study = optuna.create_study(storage=storage, sampler=make_sampler(SearchSpec(sampler="tpe", seed=1)))
    state = StudyState(target, None, DeviceInfo("cpu", "host", "host"), [0], study, "host", "time",
                       space_size=target.space_size())
    seen = []
    for _ in range(30):
        asked = state.ask()
        if asked is None:
            continue
        trial, candidate = asked
        n = dict(candidate.params)["N"]
        assert n in values and trial.params[OPTUNA_PARAM_INDEX + "N"] == values.index(n)
        seen.append(n)
        state.record(candidate, Evaluated(Status.OK, 1.0 + abs(n - 5000) / 1000))
    storage.flush()
    assert len(set(seen)) >= 25  # the values are reached, not one index over and over
    assert (tmp_path / "journal.log").stat().st_size < 30 * 2_000  # under 2 KB a trial; was over 50 KB
    distributions = {type(d).__name__ for t in study.trials for d in t.distributions.values()}
    assert "CategoricalDistribution" in distributions and "IntDistribution" in distributions  # flags, N


def test_a_grid_over_a_param_of_many_values_reaches_every_value(tmp_path):
    from cluster.engine.study.state import enqueue_grid

    values = [f"v{i}" for i in range(100)]
    path = write_target(tmp_path, params={"N": values}, space="space.yaml")
    (tmp_path / "space.yaml").write_text("name: one\ntoolchain: cc\nflags: {opt_level: ['-O1', '-O2']}\n")
    target = load_target(path)
    study = optuna.create_study(sampler=make_sampler(SearchSpec(sampler="grid", seed=2)))
    enqueue_grid(study, target, seed=2)
    state = StudyState(target, None, DeviceInfo("cpu", "host", "host"), [0], study, "host", "time",
                       space_size=target.space_size())
    seen = set()
    for _ in range(200):
        _, candidate = state.ask()
        seen.add((dict(candidate.flags)["opt_level"], dict(candidate.params)["N"]))
        state.record(candidate, Evaluated(Status.OK, 1.0))
    assert seen == {(o, v) for o in ("-O1", "-O2") for v in values}


def _growing(tmp_path) -> StudyState:
    """A study whose space may grow (``widen``), on real Optuna storage, its first Optuna study open."""
    target = load_target(write_target(tmp_path))
    state = StudyState(target, None, DeviceInfo("gpu", "fake gpu", "sm_90"), [0], None, "sm_90",
                       space_size=target.space_size(), search=SearchSpec(seed=3),
                       storage=optuna.storages.InMemoryStorage(), run_id="run-1")
    state.open_study()
    return state


def _with_flag_option(state: StudyState, name: str, option: str | None) -> None:
    import dataclasses

    space = state.target.space
    initial = tuple(state._initial_flags[name])
    flags = {**space.flags, name: initial + ((option,) if option else ())}
    state.target = dataclasses.replace(state.target, space=dataclasses.replace(space, flags=flags))


def test_a_space_that_did_not_grow_keeps_its_study_and_the_trial_in_flight(tmp_path):
    """On an H100 the register expert proposed a -maxrregcount value the space had: the search
    'moved' to a study of the same name, which failed the trial being measured as one an
    interrupted driver left running; its result then raised 'Cannot tell a FAIL trial' and ended
    the sweep 39 s in."""
    state = _growing(tmp_path)
    first = state.study
    _, candidate = state.ask()
    state.pending.add(candidate.key)
    state.widen()
    assert state.study is first
    state.record(candidate, Evaluated(Status.OK, 2.0))
    [trial] = first.trials
    assert trial.state is optuna.trial.TrialState.COMPLETE and trial.values == [2.0]


def test_a_space_grown_back_to_an_earlier_study_leaves_its_trials_in_flight_running(tmp_path):
    state = _growing(tmp_path)
    _, in_flight = state.ask()
    state.pending.add(in_flight.key)
    name = state.study.study_name
    _with_flag_option(state, "opt_level", "-Os")  # grown: a study of its own
    state.widen()
    assert state.study.study_name != name
    _with_flag_option(state, "opt_level", None)  # and back (a variant retired, say): the first study again
    state.widen()
    assert state.study.study_name == name
    state.record(in_flight, Evaluated(Status.OK, 3.0))
    told = [t for t in state.study.trials if t.user_attrs.get("key") == in_flight.key]
    assert [t.state for t in told] == [optuna.trial.TrialState.COMPLETE] and told[0].values == [3.0]


def test_a_result_for_a_trial_already_finished_is_kept_in_the_rows_and_the_sweep_goes_on(tmp_path, caplog):
    state = _growing(tmp_path)
    trial, candidate = state.ask()
    state.pending.add(candidate.key)
    state.study.tell(trial.number, state=optuna.trial.TrialState.FAIL)  # however it came to be
    state.record(candidate, Evaluated(Status.OK, 2.0))
    assert state.results[candidate.key].median == 2.0 and state.top(1) == [candidate]
    assert "already FAIL" in caplog.text


def test_a_kept_reference_keeps_its_clock_the_devices_too(tmp_path):
    """A resume judges claims against the clock the baseline's reference was kept with: the wall's
    and the device's (``measure.clock``); one kept before the device clock has none of the latter."""
    from cluster.core.types import Clock, RunOutputs
    from cluster.engine.study.state import load_reference, save_reference
    from cluster.measure.measure import Reference

    kept = Reference((RunOutputs((("out.bin", b"\0\0\x80?"),), ()),),
                     Clock(0.24, 0.7, 0.01, 0.0098, 0.0001, samples=104, records=157928))
    save_reference(tmp_path, "k", kept)
    assert load_reference(tmp_path, "k") == kept
    (tmp_path / "references" / "k" / "clock.json").write_text("[0.24, 0.7, 0.01]")
    assert load_reference(tmp_path, "k").clock == Clock(0.24, 0.7, 0.01)


def _variant_of(tmp_path, state: StudyState):
    """A variant of ``state``'s target: the same target with its source changed."""
    folder = tmp_path / "variant"
    load_target(write_target(folder))
    (folder / "tiny.c").write_text((folder / "tiny.c").read_text() + "\n/* a variant */\n")
    return load_target(folder / "target.yaml")


def _value(candidate) -> float:
    """A deterministic measurement of a candidate (the same in every sweep)."""
    return 1.0 + sum(map(ord, candidate.key)) % 97


def _own_points(tmp_path, monkeypatch, join_at: int | None, wanted: int) -> list[tuple]:
    """The own sources' first ``wanted`` search points of a study, a variant joining after
    ``join_at`` asks (None: never), every variant candidate measured 100x better than any other."""
    monkeypatch.setattr("cluster.engine.study.state.ray.put", lambda value: value)
    state = _growing(tmp_path)
    own: list[tuple] = []
    for asks in range(200):
        if asks == join_at:
            state.add_variant(_variant_of(tmp_path, state))
            state.widen()
        asked = state.ask()
        if asked is None:
            continue
        _, candidate = asked
        mine = candidate.source_hash == state.target.bundle.hash
        state.record(candidate, Evaluated(Status.OK, _value(candidate) / (1 if mine else 100)))
        if mine:
            own.append((candidate.flags, candidate.params))
            if len(own) == wanted:
                break
    return own


def test_the_own_sources_search_is_the_one_a_sweep_without_agents_makes(tmp_path, monkeypatch):
    """A variant joins the search as a stream of its own: the target's own sources are searched at
    the same points, in the same order, as with the agents off (on an H200 the variants' points,
    entered ahead of the sampler, took most of a study's trials from the flags' search, and a 1.52x
    block size that the flags found with the agents off was never tried with them on)."""
    without = _own_points(tmp_path / "off", monkeypatch, None, 12)
    with_variant = _own_points(tmp_path / "on", monkeypatch, 3, 12)
    assert len(without) == 12 and with_variant == without


def test_the_variants_stream_takes_the_larger_share_while_a_variant_leads(tmp_path, monkeypatch):
    monkeypatch.setattr("cluster.engine.study.state.ray.put", lambda value: value)
    state = _growing(tmp_path)
    _, first = state.ask()
    state.record(first, Evaluated(Status.OK, 10.0))
    state.add_variant(_variant_of(tmp_path, state))
    state.widen()

    def streams(asks: int, variant_s: float) -> list[bool]:
        drawn = []
        for _ in range(asks):
            stream = state.next_stream()
            drawn.append(bool(stream))
            asked = state.ask()
            if asked is not None:
                mine = asked[1].source_hash == state.target.bundle.hash
                state.record(asked[1], Evaluated(Status.OK, 10.0 + _value(asked[1]) if mine else variant_s))
        return drawn

    trailing = streams(8, variant_s=50.0)  # the variant slower than the own sources' best
    assert not state.variants_lead() and sum(trailing) == 2 and trailing[0]  # its first point at once
    leading = streams(8, variant_s=1.0)
    assert state.variants_lead() and sum(leading) >= 3
    state.streamed = {False: 0, True: 0}
    assert sum(streams(8, variant_s=1.0)) == 4
    assert state.next_stream(own=False) is True and state.next_stream(variants=False) is False
    assert state.next_stream(own=False, variants=False) is None


def _joined(tmp_path, monkeypatch):
    """A study whose own sources measured one candidate at 10 (returned), then a variant joined."""
    monkeypatch.setattr("cluster.engine.study.state.ray.put", lambda value: value)
    state = _growing(tmp_path)
    _, own = state.ask()
    state.record(own, Evaluated(Status.OK, 10.0))
    variant = _variant_of(tmp_path, state)
    state.add_variant(variant)
    state.widen()
    return state, own, variant


def test_a_variants_stream_that_never_led_gives_its_share_back_after_its_first_points(tmp_path, monkeypatch):
    """On an H200 at 600 s, off's winners of three programs came at the own sources' 16th to 29th
    candidate; a quarter of the asks went to variants that never led, and those programs' own
    sources had 15 to 18. After a variant's first points, a trailing stream takes a tenth; a new
    variant has its first points at a quarter's share again."""
    from cluster.engine.study.state import VARIANT_FIRST_POINTS

    state, _, variant = _joined(tmp_path, monkeypatch)
    drawn = []
    for _ in range(40):
        drawn.append(bool(state.next_stream()))
        asked = state.ask()
        if asked is not None:  # a point asked before is no candidate
            mine = asked[1].source_hash == state.target.bundle.hash
            state.record(asked[1], Evaluated(Status.OK, 10.0 + _value(asked[1]) if mine else 50.0))
    assert state.space_size > 40 and not state.variants_lead()
    assert state.searched[variant.bundle.hash] >= VARIANT_FIRST_POINTS
    assert sum(drawn[:12]) == VARIANT_FIRST_POINTS  # its first points at a quarter's share
    assert sum(drawn) <= 4  # then a tenth: at a quarter the variant would have had 10 of the 40
    write_target(tmp_path / "late")
    (tmp_path / "late" / "tiny.c").write_text((tmp_path / "late" / "tiny.c").read_text() + "\n/* late */\n")
    state.add_variant(load_target(tmp_path / "late" / "target.yaml"))
    state.widen()
    assert state.next_stream() is True  # a new variant: a quarter's share, and the stream is behind it


def test_a_variant_that_joins_after_its_stream_spent_its_trials_has_one_more(tmp_path, monkeypatch):
    """Seen on a fake GPU: a second variant, 1 s behind the first, joined a variants' stream whose
    trials the first had spent, and was never searched. It has one more trial, for its first point;
    one only, whichever variant the trial goes to."""
    monkeypatch.setattr("cluster.engine.study.state.ray.put", lambda value: value)
    state = _growing(tmp_path)
    state.add_variant(_variant_of(tmp_path, state))
    state.widen()
    for _ in range(2):
        asked = state.ask(own=False)
        state.record(asked[1], Evaluated(Status.OK, 5.0))
    assert state.room(2) == (True, False) and state.room(None) == (True, True)
    write_target(tmp_path / "late")
    (tmp_path / "late" / "tiny.c").write_text((tmp_path / "late" / "tiny.c").read_text() + "\n/* late */\n")
    state.add_variant(load_target(tmp_path / "late" / "target.yaml"))
    state.widen()
    assert state.room(2) == (True, True)
    asked = state.ask(own=False)
    state.record(asked[1], Evaluated(Status.OK, 5.0))
    assert state.room(2) == (True, False)


def test_a_retired_variants_time_is_no_one_s_best(tmp_path, monkeypatch):
    """A variant that failed its checks (a cheat, say, at 100x) leaves the space: its time is
    neither the variants' lead nor the own sources' best that other variants must beat."""
    state, own, variant = _joined(tmp_path, monkeypatch)
    asked = None
    while asked is None or asked[1].source_hash != variant.bundle.hash:
        asked = state.ask(own=False)
    state.record(asked[1], Evaluated(Status.OK, 0.1))
    assert state.variants_lead() and state.own_best == own.key
    state.retire(variant.bundle.hash)
    assert not state.variants_lead() and state.own_best == own.key
