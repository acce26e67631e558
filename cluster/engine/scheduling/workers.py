"""The Ray side: compile tasks on any CPU, one measuring actor per GPU (or CPU workers).

Compilation and measurement are separate so the GPU never waits on a compiler: compile tasks
run in parallel and hand the binary to a measuring actor through the object store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from pathlib import Path

import ray

from cluster.compile.build import compile_candidate
from cluster.config import ClusterSpec, Target
from cluster.config.env import scratch_root
from cluster.core.errors import ConfigError
from cluster.core.registry import RUNNERS
from cluster.core.types import BuildArtifact, Candidate, DeviceInfo, Measurement, Status, Verdict, VerdictStatus
from cluster.engine.scheduling.jobs import BaselineBuild
from cluster.measure.guardrails import reverify_fresh_seeds
from cluster.measure.measure import Reference, measure_candidate
from cluster.measure.profile import DEFAULT_LAUNCHES, LaunchFilter, Profile, profile_candidate
from cluster.measure.sanitize import SanitizerResult, sanitize_candidate
from cluster.measure.telemetry import Monitor
from cluster.platform import node_platform
from cluster.platform.devices import cpu_device, gpu_device
from cluster.runners._base import Runner
from cluster.sandbox.isolation import node_sandbox  # sandbox
from cluster.sandbox.sandbox import clean_stale_scratch  # sandbox


def _scratch_root() -> Path | None:
    # The only environment variable warpfleet reads: where scratch directories go on a node.
    return scratch_root()  # cluster.config.env: absolute (issue 17: a relative one failed every build)


# max_retries: system failures only (a lost node); a compile error is a value, never retried.
@ray.remote(num_cpus=1, num_returns=2, max_retries=2)
def compile_task(target: Target, candidate: Candidate) -> tuple[BuildArtifact, bytes | None]:
    """Returns the artifact without its binary (small, for the driver) and the binary (for the
    measuring actor), so the binary never passes through the driver."""
    artifact = compile_candidate(target, candidate, _scratch_root(), node_sandbox(gpu=False))  # sandbox
    return dataclasses.replace(artifact, binary=None), artifact.binary


class MeasureWorker:
    """Measures candidates one at a time on the device it owns. State stays in the actor."""

    def __init__(self, worker_id: str) -> None:
        # Idempotent: a restarted actor describes its device again and carries on.
        gpu_ids = ray.get_gpu_ids()
        self.device: DeviceInfo = (gpu_device(int(gpu_ids[0]), worker_id) if gpu_ids
                                   else cpu_device(worker_id))
        self.nvml = node_platform().telemetry(int(gpu_ids[0])) if gpu_ids else None  # NVML on NVIDIA's
        clean_stale_scratch(_scratch_root())  # sandbox: what workers killed mid-command left behind
        self.sandbox = node_sandbox(gpu=bool(gpu_ids))  # sandbox
        self.runners: dict[str, Runner] = {}  # by name, made on first use: a persistent host starts once

    def runner(self, name: str) -> Runner:
        if name not in self.runners:
            self.runners[name] = RUNNERS.load(name).for_worker(self.sandbox, _scratch_root(), self.device)
        return self.runners[name]

    def close(self) -> None:
        """Stop what the runners keep running (a persistent host, the kernel runner's), before the
        actor goes: its processes end with it, not when the node's Ray does."""
        for runner in self.runners.values():
            runner.close()
        self.runners.clear()

    def device_info(self) -> DeviceInfo:
        return self.device

    def measure(self, target: Target, candidate: Candidate, binary: bytes | None,
                reference: Reference | None, runs: int, submitted_at: float, first_seed: int = 0,
                stop_above: float | None = None, max_samples: int | None = None,
                telemetry: bool = True, baseline: BaselineBuild | None = None, poison: bool = False,
                cache_check: bool = False, judge_s: float | None = None, earlier: float | None = None) -> Measurement:
        """``baseline``: fetched only if the candidate's claimed time needs a fresh baseline clock, its
        runs beside it within ``judge_s``; ``poison``, ``cache_check``, ``earlier``: the finals' cheat
        checks (``measure_candidate``)."""
        queue_s = max(0.0, time.time() - submitted_at)
        artifact = BuildArtifact(candidate.key, Status.OK, binary)
        monitor = Monitor(self.nvml) if self.nvml and telemetry else None  # measure.search_telemetry
        result = measure_candidate(target, candidate, artifact, self.device, reference, runs,
                                   self.runner(candidate.runner), monitor, first_seed, stop_above,
                                   max_samples, baseline.fetch if baseline else None, poison, cache_check,
                                   judge_s, earlier)
        return dataclasses.replace(result, queue_s=queue_s)

    def sanitize(self, target: Target, candidate: Candidate, binary: bytes | None, tools: tuple[str, ...],
                 timeout: float, timeouts: dict[str, float] | None = None, kernels: tuple[str, ...] = (),
                 launches: int | None = None) -> tuple[SanitizerResult, ...]:
        if binary is None:
            return tuple(SanitizerResult(t, "inconclusive", "no binary") for t in tools)
        return sanitize_candidate(target, candidate, binary, tools, timeout, self.runner(candidate.runner),
                                  timeouts, kernels, launches)

    def reverify(self, target: Target, variant: Target, baseline_binary: bytes | None, binary: bytes | None,
                 timeout: float | None = None):
        """A suspiciously fast candidate against the baseline on fresh seeds (cluster.measure.guardrails)."""
        if not baseline_binary or not binary:
            return Verdict("fresh_seeds", VerdictStatus.SKIPPED, "no binary")
        return reverify_fresh_seeds(variant, BuildArtifact("baseline", Status.OK, baseline_binary),
                                    BuildArtifact("candidate", Status.OK, binary),
                                    runner=Bounded.of(self.runner(variant.runner), timeout))

    def profile(self, target: Target, candidate: Candidate, binary: bytes | None, metrics: tuple[str, ...],
                timeout: float, launches: int | None = DEFAULT_LAUNCHES.count) -> Profile:
        """``launches``: per launch configuration (ProfileSpec.launches; None: every launch)."""
        if binary is None:
            return Profile(candidate.key, Status.COMPILE_ERROR, error_tail="no binary to profile")
        profiler = node_platform().profiler
        if shutil.which(profiler) is None:
            return Profile(candidate.key, Status.CRASHED, error_tail=f"{profiler} not found on {self.device.hostname}")
        return profile_candidate(target, candidate, binary, metrics, timeout, self.runner(candidate.runner),
                                 LaunchFilter(launches))


class Bounded(Runner):
    """Another runner's runs, each within what is left of one job's bound: a check of many runs (the
    cheat checks, a review) ends by its deadline, its runs past it timed out (which fails the check:
    a candidate not checked is never a winner)."""

    def __init__(self, inner: Runner, deadline: float) -> None:
        super().__init__(inner.sandbox, inner.scratch_root)
        self.inner, self.deadline = inner, deadline
        self.name, self.samples_are_warpfleets = inner.name, inner.samples_are_warpfleets

    @classmethod
    def of(cls, inner: Runner, timeout: float | None) -> Runner:
        return inner if timeout is None else cls(inner, time.monotonic() + timeout)

    @contextlib.contextmanager
    def stage(self, *args, **kwargs):
        with self.inner.stage(*args, **kwargs) as staged:
            staged.runner = self
            yield staged

    def binary_argv(self, workdir: Path) -> str | list[str]:
        return self.inner.binary_argv(workdir)

    def execute(self, staged, invocation):
        left = max(0.1, self.deadline - time.monotonic())
        wanted = invocation.timeout if invocation.timeout is not None else staged.target.spec.timeouts.run
        staged.runner = self.inner
        try:
            return self.inner.execute(staged, dataclasses.replace(invocation, timeout=min(wanted, left)))
        finally:
            staged.runner = self

    def close(self) -> None:
        """The inner runner is the worker's: it stays."""


MAX_RESTARTS = 10  # per actor; a poison candidate is quarantined long before (Pipeline.max_attempts)


def gpu_slots(nodes: list[dict], wanted: list[str] | None) -> tuple[dict[str, int], list[str]]:
    """GPUs per Ray accelerator type (``H100``; "" for a node Ray gave no type) over the alive
    ``nodes`` (``ray.nodes()``), keeping only the ``wanted`` types when named; and the wanted
    types that no node has."""
    present: dict[str, int] = {}
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive", True) or not resources.get("GPU"):
            continue
        kind = next((r.split(":", 1)[1] for r in resources if r.startswith("accelerator_type:")), "")
        present[kind] = present.get(kind, 0) + int(resources["GPU"])
    if wanted is None:
        return present, []
    return {k: present[k] for k in wanted if k in present}, [k for k in wanted if k not in present]


def start_workers(need_gpu: bool, need_cpu: bool, cpu_workers: int,
                  gpu_types: dict[str, int] | None = None) -> list[ray.actor.ActorHandle]:
    """One actor per GPU in the cluster when GPU targets are swept (per named accelerator type,
    placed by Ray on nodes of that type, when ``gpu_types`` is given); ``cpu_workers`` CPU actors
    when CPU targets are."""
    actor = ray.remote(MeasureWorker)
    options = {"num_gpus": 1, "num_cpus": 1, "max_restarts": MAX_RESTARTS, "max_task_retries": 0}
    if gpu_types is None:
        gpus = int(ray.cluster_resources().get("GPU", 0)) if need_gpu else 0
        handles = [actor.options(**options).remote(f"gpu-{i}") for i in range(gpus)]
    else:
        per_type = [kind for kind, count in gpu_types.items() for _ in range(count)] if need_gpu else []
        handles = [actor.options(**options, accelerator_type=kind).remote(f"gpu-{i}-{kind}")
                   for i, kind in enumerate(per_type)]
    if need_cpu:
        # SPREAD: CPU workers on different nodes where there are several, so that one lost node
        # leaves workers elsewhere.
        handles += [actor.options(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=0,
                                  scheduling_strategy="SPREAD").remote(f"cpu-{i}")
                    for i in range(cpu_workers)]
    return handles


def start_fleet(cluster: ClusterSpec, kinds: set[str], config_file: str) -> tuple[
        list[ray.actor.ActorHandle], list[DeviceInfo], list[str]]:
    """The measuring actors for targets of these device ``kinds`` ("gpu", "cpu"), the device each
    holds, and why named GPU types were left out. A type named in ``cluster.gpu_types`` that the
    cluster lacks is left out with a reason, so that one config serves clusters of other GPUs."""
    resources = ray.cluster_resources()
    cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
    gpu_types, left_out = None, []
    if cluster.gpu_types is not None:
        gpu_types, missing = gpu_slots(ray.nodes(), cluster.gpu_types)
        gpus = sum(gpu_types.values())
        if "gpu" in kinds:
            present = ", ".join(sorted(k or "(no type)" for k in gpu_slots(ray.nodes(), None)[0])) or "none"
            left_out = [f"GPU type {kind}: not present in the cluster (present: {present})" for kind in missing]
    actors = ("gpu" in kinds) * gpus + ("cpu" in kinds) * cluster.cpu_workers
    if cpus <= actors:  # every measuring actor holds a CPU; compile tasks need one more
        raise ConfigError(config_file, "cluster.cpu_workers",
                          f"{actors} measuring workers leave none of the cluster's {cpus} CPUs for compiling")
    workers = start_workers("gpu" in kinds, "cpu" in kinds, cluster.cpu_workers, gpu_types)
    return workers, ray.get([w.device_info.remote() for w in workers]), left_out


def stop_fleet(workers: list[ray.actor.ActorHandle], timeout_s: float = 10.0) -> None:
    """A finished sweep's measuring actors, stopped: their runners closed (``close``), then the
    actors killed. Their GPUs and CPUs are free for the next sweep of the same
    process at once; left to themselves, handles held in a reference cycle kept them until the
    garbage collector ran (a second sweep in one process waited ~15 s for its compiles' CPUs)."""
    closing = [worker.close.remote() for worker in workers]
    if closing:
        ray.wait(closing, num_returns=len(closing), timeout=timeout_s)
    for worker in workers:
        ray.kill(worker, no_restart=True)


Fleet = tuple[list[ray.actor.ActorHandle], list[DeviceInfo], list[str]]


def fleet_key(cluster: ClusterSpec, kinds: set[str]) -> tuple:
    """What decides the measuring actors a sweep gets (start_fleet): the cluster it joins, the CPU
    workers, the GPU types, and the device kinds of its targets. The rest of the cluster spec (the
    compile slots, the look-ahead per worker, the quarantine) is the driver's."""
    return cluster.address, cluster.cpu_workers, tuple(cluster.gpu_types or ()), tuple(sorted(kinds))


class KeptFleet:
    """Measuring actors kept for every sweep of one driver process, for a script that runs many
    short sweeps (a kernel after kernel, a seed after seed): the actors, their CUDA contexts and
    their runners' hosts start once, not once a sweep. Pass it as ``Sweep(..., fleet=kept)``; the
    sweep then leaves the actors running, and ``close`` (or the end of a ``with`` block) stops them.
    A sweep whose fleet would differ (``fleet_key``), or that finds one of its actors gone (killed,
    or of a Ray instance shut down and started again), gets a fresh fleet."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._fleet: Fleet | None = None
        self.starts = 0  # fleets started: the first sweep's, and one per change

    def __call__(self, cluster: ClusterSpec, kinds: set[str], config_file: str) -> Fleet:
        key = fleet_key(cluster, kinds)
        if self._fleet is not None and (key != self._key or not self._alive()):
            self.close()
        if self._fleet is None:
            self._fleet, self._key = start_fleet(cluster, kinds, config_file), key
            self.starts += 1
        return self._fleet

    def _alive(self, timeout_s: float = 10.0) -> bool:
        workers = self._fleet[0] if self._fleet else []
        try:
            ray.get([w.device_info.remote() for w in workers], timeout=timeout_s)
            return True
        except Exception:  # an actor that died, or handles of a Ray instance that is gone
            return False

    def close(self) -> None:
        if self._fleet is not None:
            with contextlib.suppress(Exception):  # the Ray instance they ran in is gone: nothing to stop
                stop_fleet(self._fleet[0])
        self._fleet, self._key = None, None

    def __enter__(self) -> KeptFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
