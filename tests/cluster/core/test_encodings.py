"""The candidate's encodings: Optuna parameter names, long value lists searched by index."""

from __future__ import annotations

from cluster.core.encodings import INDEXED_ABOVE, OPTUNA_PARAM, OPTUNA_PARAM_INDEX, VARIANT, indexed, optuna_point


def test_a_long_value_list_is_enqueued_by_index_a_short_one_by_value():
    space = {"TILE": [8, 16, 32], "N": list(range(0, 10 * (INDEXED_ABOVE + 1), 10))}
    assert not indexed(space["TILE"]) and indexed(space["N"])
    point = optuna_point({"opt": "-O2"}, {"TILE": 16, "N": 300}, space, variant="")
    assert point == {VARIANT: "", "flag:opt": "-O2", OPTUNA_PARAM + "TILE": 16, OPTUNA_PARAM_INDEX + "N": 30}
    assert VARIANT not in optuna_point({}, {"TILE": 8}, space)
