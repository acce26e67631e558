"""The candidate's encodings: Optuna parameter names, long value lists searched by index."""

from __future__ import annotations

from cluster.core.encodings import INDEXED_ABOVE, OPTUNA_PARAM, OPTUNA_PARAM_INDEX, VARIANT, indexed, optuna_point


def test_a_long_value_list_is_enqueued_by_index_a_short_one_by_value():
    space = {"TILE": [8, 16, 32], "N": list(range(0, 10 * (INDEXED_ABOVE + 1), 10))}
    assert not indexed(space["TILE"]) and indexed(space["N"])
    point = optuna_point({"opt": "-O2"}, {"TILE": 16, "N": 300}, space, variant="")
    assert point == {VARIANT: "", "flag:opt": "-O2", OPTUNA_PARAM + "TILE": 16, OPTUNA_PARAM_INDEX + "N": 30}
    assert VARIANT not in optuna_point({}, {"TILE": 8}, space)


def test_a_configuration_is_shown_by_what_a_user_can_use_not_by_the_agents_macros():
    """Seen in show: `-DWF_LB_WARPS_scale_or_repair=32`, a macro of the variant's own source that a
    user never wrote and cannot pass to the original one."""
    from agents.experts.unroll import MACRO
    from cluster.core.encodings import LAUNCH_BOUNDS_PARAM, agent_param_text, readable_configuration

    params = {"BLOCK": 256, LAUNCH_BOUNDS_PARAM.format(kernel="scale_or_repair"): 32, MACRO: 4}
    assert readable_configuration(["-O3"], params, variant=True) == (
        "-O3 -DBLOCK=256 + the agents' variant (scale_or_repair's __launch_bounds__ for 32 warps per SM, "
        "unrolled by 4)")
    assert readable_configuration([], {"BLOCK": 256}, variant=True) == "-DBLOCK=256 + the agents' variant"
    assert readable_configuration(["-Xptxas", "-O2"], {"T": "float x"}, variant=False) == "-Xptxas -O2 '-DT=float x'"
    assert readable_configuration([], {}, variant=False) == ""
    assert agent_param_text("FUSE_BLOCK", 128) is None  # a custom optimization's param: its user named it
