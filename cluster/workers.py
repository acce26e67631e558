"""The Ray side: compile tasks on any CPU, one measuring actor per GPU (or CPU workers).

Compilation and measurement are separate so the GPU never waits on a compiler: compile tasks
run in parallel and hand the binary to a measuring actor through the object store.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import ray

from cluster.build import compile_candidate
from cluster.config import Target
from cluster.devices import cpu_device, gpu_device
from cluster.measure import Reference, measure_candidate
from cluster.profile import Profile, profile_candidate
from cluster.sanitize import SanitizerResult, sanitize_candidate
from cluster.telemetry import Monitor, NvmlSource
from cluster.types import BuildArtifact, Candidate, DeviceInfo, Measurement, Status


def _scratch_root() -> Path | None:
    # The only environment variable warpfleet reads: where scratch directories go on a node.
    root = os.environ.get("WARPFLEET_SCRATCH")
    return Path(root) if root else None


# max_retries: system failures only (a lost node); a compile error is a value, never retried.
@ray.remote(num_cpus=1, num_returns=2, max_retries=2)
def compile_task(target: Target, candidate: Candidate) -> tuple[BuildArtifact, bytes | None]:
    """Returns the artifact without its binary (small, for the driver) and the binary (for the
    measuring actor), so the binary never passes through the driver."""
    artifact = compile_candidate(target, candidate, _scratch_root())
    return dataclasses.replace(artifact, binary=None), artifact.binary


class MeasureWorker:
    """Measures candidates one at a time on the device it owns. State stays in the actor."""

    def __init__(self, worker_id: str) -> None:
        # Idempotent: a restarted actor describes its device again and carries on.
        gpu_ids = ray.get_gpu_ids()
        self.device: DeviceInfo = (gpu_device(int(gpu_ids[0]), worker_id) if gpu_ids
                                   else cpu_device(worker_id))
        self.nvml = NvmlSource(int(gpu_ids[0])) if gpu_ids else None

    def device_info(self) -> DeviceInfo:
        return self.device

    def measure(self, target: Target, candidate: Candidate, binary: bytes | None,
                reference: Reference | None, runs: int, submitted_at: float) -> Measurement:
        queue_s = max(0.0, time.time() - submitted_at)
        artifact = BuildArtifact(candidate.key, Status.OK, binary)
        monitor = Monitor(self.nvml) if self.nvml else None
        result = measure_candidate(target, candidate, artifact, self.device, reference, runs,
                                   _scratch_root(), monitor)
        return dataclasses.replace(result, queue_s=queue_s)

    def sanitize(self, target: Target, candidate: Candidate, binary: bytes | None, tools: tuple[str, ...],
                 timeout: float) -> tuple[SanitizerResult, ...]:
        if binary is None:
            return tuple(SanitizerResult(t, "inconclusive", "no binary") for t in tools)
        return sanitize_candidate(target, candidate, binary, tools, timeout, _scratch_root())

    def profile(self, target: Target, candidate: Candidate, binary: bytes | None, metrics: tuple[str, ...],
                timeout: float) -> Profile:
        if binary is None:
            return Profile(candidate.key, Status.COMPILE_ERROR, error_tail="no binary to profile")
        if shutil.which("ncu") is None:
            return Profile(candidate.key, Status.CRASHED, error_tail=f"ncu not found on {self.device.hostname}")
        return profile_candidate(target, candidate, binary, metrics, timeout, _scratch_root())


MAX_RESTARTS = 10  # per actor; a poison candidate is quarantined long before (Pipeline.max_attempts)


def start_workers(need_gpu: bool, need_cpu: bool, cpu_workers: int) -> list[ray.actor.ActorHandle]:
    """One actor per GPU in the cluster when GPU targets are swept; ``cpu_workers`` CPU actors
    when CPU targets are."""
    actor = ray.remote(MeasureWorker)
    gpus = int(ray.cluster_resources().get("GPU", 0)) if need_gpu else 0
    handles = [actor.options(num_gpus=1, num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=0).remote(f"gpu-{i}")
               for i in range(gpus)]
    if need_cpu:
        # SPREAD: CPU workers on different nodes where there are several, so that one lost node
        # leaves workers elsewhere.
        handles += [actor.options(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=0,
                                  scheduling_strategy="SPREAD").remote(f"cpu-{i}")
                    for i in range(cpu_workers)]
    return handles
