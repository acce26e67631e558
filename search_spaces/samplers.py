"""Samplers by name (``search.sampler``), registered in ``cluster.core.registry.SAMPLERS``: each a
function of the search settings that returns an Optuna sampler. A two-objective search
(``time_energy``) takes NSGA-II whatever is named, but grid (whose points are enqueued)."""

from __future__ import annotations

from typing import Protocol

import optuna


class SearchSettings(Protocol):
    seed: int
    objective: str


def tpe(search: SearchSettings) -> optuna.samplers.BaseSampler:
    """Seeded TPE with the constant liar, so that the driver may ask ahead of the results."""
    if search.objective == "time_energy":
        return optuna.samplers.NSGAIISampler(seed=search.seed)  # two objectives: a Pareto front
    return optuna.samplers.TPESampler(seed=search.seed, constant_liar=True, multivariate=True)


def random(search: SearchSettings) -> optuna.samplers.BaseSampler:
    if search.objective == "time_energy":
        return optuna.samplers.NSGAIISampler(seed=search.seed)
    return optuna.samplers.RandomSampler(seed=search.seed)


def grid(search: SearchSettings) -> optuna.samplers.BaseSampler:
    # The points are enqueued up front (cluster.engine.studies.enqueue_grid): Optuna's GridSampler
    # calls Study.stop() when exhausted, which ask/tell outside optimize() does not allow.
    return optuna.samplers.RandomSampler(seed=search.seed)
