"""The agent contract. Agents propose source variants of a target; the sweep verifies and
measures them like any other candidate. Rule-based experts and LLM agents both implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from cluster.config import Target
from cluster.core.types import KernelResources, Proposal

__all__ = ["Agent", "AnalysisContext", "Proposal"]  # Proposal: a value of the sweep's (cluster.core.types)


@dataclass(frozen=True)
class AnalysisContext:
    """What an agent may look at: the target, and what is known of its baseline."""

    target: Target
    arch: str
    baseline_median: float | None = None
    kernels: tuple[KernelResources, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)  # profiler metrics, when profiled
    # The kernels the baseline's profile saw launched (their names: no return type, template
    # arguments or parameters); empty when not profiled.
    launched: frozenset[str] = frozenset()


class Agent(ABC):
    """One step of the optimization workflow that proposes variants of a target."""

    name: str

    @abstractmethod
    def propose(self, context: AnalysisContext) -> list[Proposal]:
        """Zero or more proposals; an agent with nothing to say returns an empty list."""
