"""The typed config: a run config (YAML) that names target files (YAML next to their sources).

    load_run(path) ─► RunPlan(config: RunConfig, targets: tuple[Target, ...])

Parsing happens in ``load`` and only there; every later stage receives these values.
"""

from cluster.config.agents import AgentsSpec, CustomSpec, Level, LLMSpec, StepChoice
from cluster.config.kernel import KernelSpec
from cluster.config.load import load_run, load_target
from cluster.config.run import (
    ClusterSpec,
    MeasureSpec,
    ProfileSpec,
    RunConfig,
    RunPlan,
    SandboxSpec,
    SearchSpec,
)
from cluster.config.target import (
    BUILD_PLACEHOLDERS,
    RUN_PLACEHOLDERS,
    LimitsSpec,
    MetricSpec,
    OutputSpec,
    Target,
    TargetSpec,
    Timeouts,
    VerifySpec,
)

__all__ = [
    "BUILD_PLACEHOLDERS", "RUN_PLACEHOLDERS", "AgentsSpec", "ClusterSpec", "CustomSpec", "KernelSpec", "LLMSpec",
    "Level", "LimitsSpec", "MeasureSpec", "MetricSpec", "OutputSpec", "ProfileSpec", "RunConfig", "RunPlan",
    "SandboxSpec",
    "SearchSpec", "StepChoice", "Target", "TargetSpec", "Timeouts", "VerifySpec", "load_run", "load_target",
]
