"""How a candidate is written down, in one place: its results columns, its Optuna parameter
names, its identity across archs, and what "better" means for either goal.

    flag  NAME  ─► column f_NAME  ─► Optuna param flag:NAME
    param NAME  ─► column p_NAME  ─► Optuna param param:NAME, a categorical of its values; of more
                                     than INDEXED_ABOVE values, param#:NAME, an int: the value's
                                     index in the list (the journal stores each trial's
                                     distribution, and a categorical's holds every value)
    an agent's variant            ─► Optuna param variant (its source hash; "" is the target's own)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

FLAG_PREFIX = "f_"
PARAM_PREFIX = "p_"
OPTUNA_FLAG = "flag:"
OPTUNA_PARAM = "param:"
OPTUNA_PARAM_INDEX = "param#:"
INDEXED_ABOVE = 64  # values, past which a param is searched by its index
VARIANT = "variant"

# The params the rule-based experts give a variant (agents/experts: unroll, launch_bounds): macros
# of the variant's own source, set by its patch. Shown to a user by what they do (agent_param_text),
# not by these names; the exports keep the defines, which build the patched source as measured.
UNROLL_PARAM = "WF_UNROLL_N"
LAUNCH_BOUNDS_PARAM = "WF_LB_WARPS_{kernel}"
_AGENT_PARAMS = ((re.compile(r"WF_UNROLL_N"), "unrolled by {value}"),
                 (re.compile(r"WF_LB_WARPS_(?P<kernel>\w+)"), "{kernel}'s __launch_bounds__ for {value} warps per SM"))

# A candidate this many times better than its baseline is run again on fresh seeds before it is
# believed, and flagged for review (measure/guardrails.py runs the check).
SUSPECT_SPEEDUP = 10.0


def agent_param_text(name: str, value: Any) -> str | None:
    """What an expert's param set to ``value`` does, in a user's words ("unrolled by 4"); None for
    a param that is no expert's (the target's own, or a custom optimization's, named by its user)."""
    for pattern, text in _AGENT_PARAMS:
        if found := pattern.fullmatch(name):
            return text.format(value=value, **found.groupdict())
    return None


def readable_configuration(flag_args: Sequence[str], params: Mapping[str, Any], variant: bool) -> str:
    """A configuration as a user reads it: the flags and the defines a user passes, then, for an
    agent's variant, that it is one and what its experts' params do (their macros are the variant's
    own: `warpfleet export --format patch` carries the source change, the other formats the defines)."""
    defines = [f"-D{name}={value}" for name, value in params.items() if agent_param_text(name, value) is None]
    agents = [text for name, value in params.items() if (text := agent_param_text(name, value))]
    text = shlex.join([*flag_args, *defines])
    if variant or agents:
        text += (" + " if text else "") + "the agents' variant" + (f" ({', '.join(agents)})" if agents else "")
    return text


def flag_column(name: str) -> str:
    return FLAG_PREFIX + name


def param_column(name: str) -> str:
    return PARAM_PREFIX + name


def settings(row: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The flags (``FLAG_PREFIX``) or params (``PARAM_PREFIX``) a results row carries, by name:
    null cells (another target's columns) left out, numpy scalars made Python values."""
    out = {}
    for column, value in row.items():
        if not str(column).startswith(prefix) or value is None:
            continue
        if isinstance(value, float) and math.isnan(value):
            continue
        try:
            if value != value:  # pandas NA and numpy NaN
                continue
        except TypeError:  # pd.NA compares to nothing
            continue
        out[str(column)[len(prefix):]] = value.item() if hasattr(value, "item") else value
    return out


def indexed(values: Sequence[Any]) -> bool:
    """Whether a param of these values is searched by its index (``OPTUNA_PARAM_INDEX``)."""
    return len(values) > INDEXED_ABOVE


class Positions(tuple):
    """A param's values whose ``index`` is a lookup, for code that encodes many points (a grid)."""

    def __new__(cls, values: Sequence[Any]) -> Positions:
        made = super().__new__(cls, values)
        made.at = {repr(v): i for i, v in enumerate(values)}
        return made

    def index(self, value: Any, *_: Any) -> int:
        return self.at[repr(value)]


def optuna_point(flags: Mapping[str, str], params: Mapping[str, Any], space: Mapping[str, Sequence[Any]],
                 variant: str | None = None) -> dict[str, Any]:
    """A point as Optuna's ``enqueue_trial`` takes it: ``space`` is the params' value lists (the
    target's or the variant's that the point builds); ``variant`` None: the study has no variants."""
    point: dict[str, Any] = {} if variant is None else {VARIANT: variant}
    point.update({OPTUNA_FLAG + k: v for k, v in flags.items()})
    for name, value in params.items():
        values = space[name]
        if indexed(values):
            point[OPTUNA_PARAM_INDEX + name] = values.index(value)
        else:
            point[OPTUNA_PARAM + name] = value
    return point


def config_id(target: str, source_hash: str, flag_args: Sequence[str], define_args: Sequence[str]) -> str:
    """What was built, whatever the arch and the flags space: target, sources, flags, defines.
    The arguments are sorted: two spaces may list the same flags in another order."""
    payload = json.dumps([target, source_hash, sorted(flag_args), sorted(define_args)])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def speedup(value: float | None, baseline: float | None, goal: str) -> float | None:
    """How many times better than the baseline ``value`` is (>1 is better, for either goal), or
    None where it cannot be said (a value missing, zero or not finite)."""
    if goal not in ("minimize", "maximize"):
        raise ValueError(f"unknown goal {goal!r} (known: minimize, maximize)")
    if value is None or baseline is None:
        return None
    numerator, denominator = (baseline, value) if goal == "minimize" else (value, baseline)
    if not denominator or not math.isfinite(numerator) or not math.isfinite(denominator):
        return None
    return numerator / denominator


def better(a: float, b: float, goal: str) -> bool:
    """Whether ``a`` beats ``b`` for ``goal``."""
    return a < b if goal == "minimize" else a > b


def suspect_speedup(value: float | None, threshold: float = SUSPECT_SPEEDUP) -> bool:
    """Whether a speedup is too good to believe without a re-verification on fresh inputs."""
    return value is not None and value > threshold


MIN_LEAD = 0.01  # a lead under 1% of the baseline's median is never taken for a real one
MAX_NOISE_LEAD = 0.25  # however noisy the measurements, a lead of a quarter is taken for a real one


def beats(median: float, iqr: float, baseline_median: float, baseline_iqr: float, goal: str) -> bool:
    """Whether a measurement is better than the baseline's by more than their noise: the larger of
    the two relative interquartile ranges (at least ``MIN_LEAD``, at most ``MAX_NOISE_LEAD``). What
    sends a variant to the expensive checks; the selection's own test is stricter (finals' samples)."""
    if not (median > 0 and baseline_median > 0) or not (math.isfinite(median) and math.isfinite(baseline_median)):
        return False
    noise = max(abs(iqr) / median, abs(baseline_iqr) / baseline_median)
    lead = min(MAX_NOISE_LEAD, max(MIN_LEAD, noise if math.isfinite(noise) else MAX_NOISE_LEAD))
    ratio = speedup(median, baseline_median, goal)
    return ratio is not None and ratio > 1.0 / (1.0 - lead)
