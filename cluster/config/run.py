"""The run config: which targets, how to search, where to run, how to measure and profile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from cluster.config.agents import AgentsSpec
from cluster.config.target import SAFE_NAME, Target, _Model
from cluster.core.registry import SAMPLERS

MAX_TRIALS = 10_000_000  # search.trials and --trials


class SearchSpec(_Model):
    sampler: str = "tpe"  # a name in cluster.core.registry.SAMPLERS: tpe (seeded, constant liar), random, grid
    # time: the target's metric; energy: NVML joules per sample; edp: their product;
    # time_energy: both, a Pareto front found with NSGA-II. Energy needs GPU workers (NVML).
    objective: Literal["time", "energy", "edp", "time_energy"] = "time"
    seed: int = 0
    trials: int | None = Field(40, gt=0, le=MAX_TRIALS)  # evaluated candidates per study (strict: not `true`)
    time_budget_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    storage: str | None = None  # an RDB URL; default: a journal file in the run directory
    # The sampler's own settings: keyword arguments of its Optuna class (tpe: n_startup_trials, ...).
    sampler_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("sampler")
    @classmethod
    def _registered(cls, value: str) -> str:
        return SAMPLERS.check(value)

    @model_validator(mode="after")
    def _sampler_takes_its_options(self) -> SearchSpec:
        if self.sampler_options:
            try:
                SAMPLERS.load(self.sampler)(self)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"sampler_options: {self.sampler} does not take them: {exc}") from None
        return self


class ClusterSpec(_Model):
    address: str | None = None
    cpu_workers: int = Field(1, ge=1, le=4096)  # CPU measuring actors when there is no GPU
    compile_workers: int | None = Field(None, ge=1, le=100_000)  # default: the cluster's CPUs
    inflight_per_worker: int = Field(2, ge=1, le=64)
    max_attempts: int = Field(3, ge=1, le=100)  # a candidate that kills its worker this often is quarantined
    # Ray accelerator types to sweep (H100, A100-80G); null: every GPU. A type not in the cluster is skipped.
    gpu_types: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")]] | None = Field(None, min_length=1)


RACE = 1.10  # measure.race's default
SEARCH_SAMPLES = 100  # measure.search_samples' default


class MeasureSpec(_Model):
    runs: int = Field(1, ge=1, le=1000)  # program runs per candidate in the search
    final_top_k: int = Field(3, ge=0, le=100)  # candidates re-measured for the selection
    final_runs: int = Field(5, ge=1, le=1000)
    max_noise: float = Field(0.05, gt=0, le=10)  # rows whose IQR/median stays above are marked noisy
    # Racing: a search candidate stops sampling once, after the stopping rule's minimum samples, its
    # lower quartile is above this many times the study's best median (a time the goal minimizes;
    # the kernel runner): it has lost, and more samples would only say by how much. Contenders (within
    # 10% by default) sample in full, as do the baseline, the agents' variants and the finals (which
    # re-measure the best few anyway). null: every candidate samples in full.
    race: float | None = Field(RACE, gt=1, le=100)
    # At most this many timed samples per run of a search candidate, where the harness applies its
    # stopping rule (the kernel runner; a program built with the harness, run as a process or in the
    # persistent runner's host): the rule's 0.5% noise is rarely met by a short kernel flushed before
    # each launch, which then samples to the rule's cap of 1000. The baseline, the agents' variants
    # and the finals (the best few, re-measured) sample by the full rule. null: the full rule in the
    # search too.
    search_samples: int | None = Field(SEARCH_SAMPLES, ge=1, le=1_000_000)
    # NVML telemetry (energy, power, clocks, temperature, clock event reasons) on the search's rows.
    # An NVML reading takes about 3 ms on an H200, and a monitored job took 14 ms more than one
    # without (bench_runners.py --actor, BENCHMARKS.md): a third of a short kernel's job. The
    # baseline, the agents' variants and the finals are always monitored, and so is every candidate
    # of an objective other than time (energy, edp, time_energy). true: every search row too.
    search_telemetry: bool = False


class ProfileSpec(_Model):
    """The Nsight Compute stage, for GPU targets: which candidates, which metrics, how many launches."""

    # best: the baseline and each study's winner; baseline: the baseline alone (with the agents on, the
    # analysts' profile: no winner is profiled after the finals); all: every candidate measured ok.
    candidates: Literal["none", "baseline", "best", "all"] = "best"
    metrics: list[str] | None = None  # default: cluster.measure.profile.DEFAULT_METRICS
    timeout_s: float = Field(600, gt=0, le=86400)
    # Launches profiled per launch configuration (kernel, grid, block, shared memory): ncu replays
    # each one many times, so a program of hundreds of launches would time out; null: every launch.
    launches: int | None = Field(1, ge=1)


class SandboxSpec(_Model):
    """How every build and run of a candidate is isolated on every node (cluster.sandbox.bwrap):
    bubblewrap, a process and a memory limit, no network. A sweep refuses to start where the
    sandbox cannot, unless it is given ``--unsandboxed``; ``warpfleet doctor`` says why."""

    # the bwrap program; default: $WARPFLEET_BWRAP, else bwrap on PATH, else the one unpacked into the
    # virtual environment (cluster.sandbox.bwrap.UNPACKED)
    bwrap: str | None = None
    memory_mb: int | None = Field(None, ge=64, le=1 << 30)  # per command; default: half the node's memory
    pids: int = Field(1024, ge=8, le=1 << 22)  # processes and threads per command
    network: bool = False  # True: the candidate shares the node's network
    # More of the worker's variables passed in, by exact name (beyond the allow-list of what a compiler or a
    # CUDA program needs: cluster.sandbox.sandbox.CANDIDATE_ENV, README Security).
    env: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(default_factory=list)


class RunConfig(_Model):
    name: str = Field("sweep", pattern=SAFE_NAME)
    output_dir: str = "runs"
    targets: list[str] = Field(min_length=1)
    search: SearchSpec = SearchSpec()
    cluster: ClusterSpec = ClusterSpec()
    measure: MeasureSpec = MeasureSpec()
    profile: ProfileSpec = ProfileSpec()
    agents: AgentsSpec = AgentsSpec()
    sandbox: SandboxSpec = SandboxSpec()
    flush_interval_s: float = Field(2.0, gt=0, le=3600)


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    file: str
    targets: tuple[Target, ...]
