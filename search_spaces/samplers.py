"""Samplers by name (``search.sampler``), registered in ``cluster.core.registry.SAMPLERS``: each a
function of the search settings that returns an Optuna sampler, given ``search.sampler_options`` (the
keyword arguments of its Optuna class: ``n_startup_trials`` for TPE, say). A two-objective search
(``time_energy``) takes NSGA-II whatever is named, but grid (whose points are enqueued); NSGA-II
takes the options too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import optuna


class SearchSettings(Protocol):
    seed: int
    objective: str
    sampler_options: Mapping[str, Any]


def tpe(search: SearchSettings) -> optuna.samplers.BaseSampler:
    """Seeded TPE with the constant liar, so that the driver may ask ahead of the results."""
    options = {"constant_liar": True, "multivariate": True, **search.sampler_options}
    if search.objective == "time_energy":
        return optuna.samplers.NSGAIISampler(seed=search.seed, **search.sampler_options)  # a Pareto front
    return optuna.samplers.TPESampler(seed=search.seed, **options)


def random(search: SearchSettings) -> optuna.samplers.BaseSampler:
    if search.objective == "time_energy":
        return optuna.samplers.NSGAIISampler(seed=search.seed, **search.sampler_options)
    return optuna.samplers.RandomSampler(seed=search.seed, **search.sampler_options)


def grid(search: SearchSettings) -> optuna.samplers.BaseSampler:
    # The points are enqueued up front (cluster.engine.study.state.enqueue_grid): Optuna's GridSampler
    # calls Study.stop() when exhausted, which ask/tell outside optimize() does not allow.
    return optuna.samplers.RandomSampler(seed=search.seed, **search.sampler_options)
