"""A simulated fleet, to see past the machines at hand where the driver becomes the bottleneck.

Fakes, named as such: ``SimulatedWorker`` holds a fake GPU resource and, for every job, sleeps a
modelled run time and answers like a measuring worker (its checks, compute-sanitizer, the cheat
checks, the fresh-seed review and Nsight Compute, sleep ``Model.check_s`` and pass);
``simulated_compile`` sleeps a modelled compile time and returns a build with a unique binary.
Everything else is the real engine: the driver, the scheduler, Optuna, the flows, the agents'
workflow, the Parquet writer. ``scripts/bench_sim.py`` runs it on Ray's ``cluster_utils.Cluster``
with 8 to 64 simulated GPUs; the tests of the time budget and the verification tiers on one.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import ray

from cluster.config import ClusterSpec, Target
from cluster.core.types import (
    BuildArtifact,
    Candidate,
    DeviceInfo,
    Measurement,
    Phase,
    RunOutputs,
    Status,
    Telemetry,
    Verdict,
    VerdictStatus,
)
from cluster.measure.measure import Reference
from cluster.measure.profile import Profile
from cluster.measure.sanitize import SanitizerResult

SIMULATED_GPU = "Simulated GPU"


@dataclass(frozen=True)
class Model:
    """The modelled times of one candidate: its compile, its run on a worker, each expensive check;
    ``speed``: a source hash's time factor (an agent's variant made faster or slower), the metric
    of every candidate being otherwise a deterministic function of its key."""

    compile_s: float = 1.0
    run_s: float = 0.05
    check_s: float = 0.0
    speed: tuple[tuple[str, float], ...] = ()
    dirty: tuple[str, ...] = ()  # source hashes whose compute-sanitizer runs find errors
    poisoned: tuple[str, ...] = ()  # source hashes whose outputs are wrong under poison (admission, finals)
    lying: tuple[str, ...] = ()  # source hashes whose finals' clocks do not bear out their claims


@ray.remote(num_cpus=1, num_returns=2, max_retries=2)
def simulated_compile(target: Target, candidate: Candidate, compile_s: float) -> tuple[BuildArtifact, bytes]:
    """A fake compile task: the modelled compile time, then a binary unique to the candidate."""
    time.sleep(compile_s)
    binary = candidate.key.encode()
    artifact = BuildArtifact(candidate.key, Status.OK, None, compile_s, binary_hash=BuildArtifact.hash_binary(binary))
    return artifact, binary


class SimulatedWorker:
    """A fake measuring worker: a fake GPU resource, and a modelled time per job."""

    def __init__(self, worker_id: str, run_s: float, check_s: float = 0.0,
                 speed: tuple[tuple[str, float], ...] = (), dirty: tuple[str, ...] = (),
                 poisoned: tuple[str, ...] = (), lying: tuple[str, ...] = ()) -> None:
        self.device = DeviceInfo("gpu", SIMULATED_GPU, "sm_90", uuid=worker_id, compute_capability="9.0",
                                 worker_id=worker_id)
        self.run_s, self.check_s, self.speed, self.dirty = run_s, check_s, dict(speed), set(dirty)
        self.poisoned, self.lying = set(poisoned), set(lying)

    def device_info(self) -> DeviceInfo:
        return self.device

    def close(self) -> None:
        """Nothing runs beside it to stop (cluster.engine.scheduling.workers.stop_fleet)."""

    def measure(self, target: Target, candidate: Candidate, binary: bytes | None, reference: Reference | None,
                runs: int, submitted_at: float, first_seed: int = 0, stop_above: float | None = None,
                max_samples: int | None = None, telemetry: bool = True, baseline: object = None,
                poison: bool = False, cache_check: bool = False, judge_s: float | None = None,
                earlier: float | None = None) -> Measurement:
        started = time.time()
        time.sleep(self.run_s * runs)
        if poison and candidate.source_hash in self.poisoned:  # a launch that leaves its output to an earlier one
            return Measurement(candidate.key, Status.VERIFY_FAILED, self.device, (), self.run_s * runs, 0.0,
                               started_at=started, finished_at=time.time(),
                               error_tail="poisoned_outputs: simulated: out.bin differs with its outputs poisoned")
        if candidate.phase is Phase.FINAL and candidate.source_hash in self.lying:
            return Measurement(candidate.key, Status.CLOCK_MISMATCH, self.device, (), self.run_s * runs, 0.0,
                               started_at=started, finished_at=time.time(),
                               error_tail="simulated: warpfleet's own clock saw no saving")
        # A deterministic time per configuration, so that the search has something to find.
        digest = int(hashlib.sha256(candidate.key.encode()).hexdigest()[:8], 16)
        sample = (1.0 + (digest % 1000) / 1000) * self.speed.get(candidate.source_hash, 1.0)
        outputs = tuple(RunOutputs() for _ in range(runs)) if reference is None else ()
        raced = stop_above is not None and sample > stop_above  # as the kernel runner's racing decides it
        per_run = min(SAMPLES_PER_RUN, max_samples or SAMPLES_PER_RUN)  # the search's cap, as a harness applies it
        # A monitored job's telemetry (measure.search_telemetry), as a GPU worker's NVML monitor gives one.
        return Measurement(candidate.key, Status.OK, self.device, (sample,) * per_run * runs, self.run_s * runs, 0.0,
                           max(0.0, started - submitted_at), started_at=started, finished_at=time.time(),
                           outputs=outputs, raced=raced,
                           telemetry=Telemetry(0.3 * sample, 300.0, 1980.0, 2619.0, 40.0) if telemetry else None)


    def sanitize(self, target: Target, candidate: Candidate, binary: bytes | None, tools: tuple[str, ...],
                 timeout: float, timeouts: dict[str, float] | None = None, kernels: tuple[str, ...] = (),
                 launches: int | None = None) -> tuple[SanitizerResult, ...]:
        """Each tool takes its share of ``check_s``, or its budget where that is less (then: timeout)."""
        results = []
        for tool in tools:
            need, budget = self.check_s / max(1, len(tools)), (timeouts or {}).get(tool, timeout)
            time.sleep(min(need, budget))
            outcome = "timeout" if need > budget else "errors" if candidate.source_hash in self.dirty else "clean"
            results.append(SanitizerResult(tool, outcome, "simulated", min(need, budget)))
        return tuple(results)

    def reverify(self, target: Target, variant: Target, baseline_binary: bytes | None, binary: bytes | None,
                 timeout: float | None = None):
        return self._bounded("fresh_seeds", timeout)

    def _bounded(self, check: str, timeout: float | None) -> Verdict:
        """``check_s``, or the job's bound where that is less: then its runs timed out, and it failed."""
        if timeout is not None and self.check_s > timeout:
            time.sleep(timeout)
            return Verdict(check, VerdictStatus.FAILED, f"simulated: its runs did not finish within {timeout:.1f} s")
        time.sleep(self.check_s)
        return Verdict(check, VerdictStatus.PASSED, "simulated", self.check_s)

    def profile(self, target: Target, candidate: Candidate, binary: bytes | None, metrics: tuple[str, ...],
                timeout: float, launches: int | None = 1) -> Profile:
        time.sleep(min(self.check_s, timeout))
        return Profile(candidate.key, Status.OK if self.check_s <= timeout else Status.TIMEOUT)


SAMPLES_PER_RUN = 10  # what a simulated run reports without a cap (measure.search_samples)


def simulated_fleet(workers: int, model: Model):
    """A fleet starter for ``Sweep(fleet=...)`` and the compile task for ``Sweep(compile=...)``:
    ``workers`` simulated GPU workers, each holding one (fake) GPU resource of the cluster."""

    def start(cluster: ClusterSpec, kinds: set[str], config_file: str):
        actor = ray.remote(SimulatedWorker)
        handles = [actor.options(num_gpus=1, num_cpus=0, max_restarts=0).remote(f"sim-{i}", model.run_s,
                                                                                 model.check_s, model.speed,
                                                                                 model.dirty, model.poisoned,
                                                                                 model.lying)
                   for i in range(workers)]
        return handles, ray.get([h.device_info.remote() for h in handles]), []

    def compile_with_model(target_ref, candidate):
        return simulated_compile.remote(target_ref, candidate, model.compile_s)

    return start, compile_with_model
