"""The sweep driver: baselines first, then the Optuna-guided search, then the final re-measure.

    RunPlan ─► studies (target x device type) ─► Pipeline (compile ─► measure) ─► ResultWriter
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import optuna
import pyarrow as pa
import ray

from agents.workflow import Steps
from cluster.config import RunPlan, Target
from cluster.core.encodings import SUSPECT_SPEEDUP, speedup, suspect_speedup
from cluster.core.types import BuildArtifact, Measurement, Phase, Status
from cluster.engine.agent_stage import AgentStage
from cluster.engine.pipeline import Done, Job, Pipeline
from cluster.engine.progress import SweepProgress
from cluster.engine.studies import (
    Evaluated,
    StudyState,
    create_study,
    load_reference,
    open_storage,
    save_reference,
)
from cluster.engine.workers import compile_task, start_fleet
from cluster.outputs.select import select_best
from cluster.runners.isolation import protect_ray_token, ray_env_vars, secrets_withheld  # sandbox
from cluster.runners.measure import Reference
from cluster.runners.profile import DEFAULT_METRICS, PROFILE_SCHEMA, Profile, profile_records
from cluster.store.results import ResultWriter, make_row, read_results, read_table, results_schema
from cluster.store.rundir import RunDir
from cluster.toolchains import get_toolchain

optuna.logging.set_verbosity(optuna.logging.WARNING)
POLL_S = 0.2
REVIEW_SCHEMA = pa.schema([("run_id", pa.string()), ("study", pa.string()), ("candidate_key", pa.string()),
                           ("speedup", pa.float64()), ("status", pa.string()), ("detail", pa.string())])


@dataclass(frozen=True)
class SweepSummary:
    run_dir: Path
    evaluated: int  # rows written by this invocation
    skipped: tuple[str, ...]  # why targets or studies were left out
    wall_s: float = 0.0
    bookkeeping_s: float = 0.0  # driver time spent asking, submitting and recording


def init_ray(address: str | None) -> None:
    """Join the cluster at ``address``, or start a local instance. Worker nodes get this
    project's packages through the runtime environment."""
    if ray.is_initialized():
        return
    import agents
    import cluster
    import search_spaces

    if address and "RAY_AUTH_MODE" not in os.environ and (
            "RAY_AUTH_TOKEN" in os.environ or "RAY_AUTH_TOKEN_PATH" in os.environ
            or (Path.home() / ".ray" / "auth_token").is_file()):
        # Ray 2.60 only sends a token to an explicit address when told to; with one at hand, do.
        os.environ["RAY_AUTH_MODE"] = "token"
    runtime_env: dict = {"py_modules": [cluster, agents, search_spaces]} if address else {}
    runtime_env["env_vars"] = ray_env_vars()  # sandbox: the sandbox policy to every node; the driver's secrets blanked
    with secrets_withheld():  # sandbox: a local Ray's processes start without the driver's secrets
        ray.init(address=address, runtime_env=runtime_env, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    protect_ray_token()  # sandbox: Ray writes ~/.ray/auth_token readable by all


class Sweep:
    def __init__(self, plan: RunPlan, run_dir: RunDir, log: Callable[[str], None] = print,
                 agent_steps: Callable[[], list[Steps]] | None = None) -> None:
        """``agent_steps``: who does the workflow's steps 1-3 (default: the config's experts)."""
        self.plan, self.run_dir, self.log = plan, run_dir, log
        self.agent_steps = agent_steps
        self.config = plan.config
        self.skipped: list[str] = []
        self.written = 0
        self.bookkeeping_s = 0.0
        self.baseline_kernels: dict[str, tuple] = {}
        self.schema_targets: list[Target] = list(plan.targets)  # plus agents' variants with params of their own

    def run(self, address: str | None = None, show_progress: bool = True) -> SweepSummary:
        start = time.monotonic()
        init_ray(address or self.config.cluster.address)
        studies, workers = self._start()
        stage = self._agent_stage(workers)
        workflow_done = {s.name: stage.restore(s) for s in studies} if stage else {}
        existing = read_results(self.run_dir.path)
        for study in studies:
            study.restore(existing[existing["study"] == study.name] if len(existing) else existing)
        pipeline = Pipeline(workers, self.config.cluster.inflight_per_worker, reuse=self._reuse(studies),
                            max_attempts=self.config.cluster.max_attempts)
        self._cover(v for s in studies for v in s.variants.values())
        with ResultWriter(self.run_dir.path, results_schema(self.schema_targets), self.config.flush_interval_s) \
                as writer, \
                SweepProgress(studies, self.config.search.trials, enabled=show_progress) as progress:
            self.writer, self.progress = writer, progress
            self._baselines(studies, pipeline)
            if stage:
                self._agents(stage, [s for s in studies if not s.disabled], workflow_done)
            self._search([s for s in studies if not s.disabled], pipeline)
            self._final([s for s in studies if not s.disabled], pipeline)
            self._review([s for s in studies if not s.disabled], workers)
        self._profile([s for s in studies if not s.disabled], workers)
        return SweepSummary(self.run_dir.path, self.written, tuple(self.skipped), time.monotonic() - start,
                            self.bookkeeping_s)

    # -- setup -------------------------------------------------------------------------------
    def _cover(self, targets: Iterable[Target]) -> bool:
        """Take in the targets whose params the results' schema lacks; True when it grew."""
        known = {name for t in self.schema_targets for name in t.spec.params}
        new = [t for t in targets if set(t.spec.params) - known]
        self.schema_targets += new
        return bool(new)

    def _agent_stage(self, workers: list[ray.actor.ActorHandle]) -> AgentStage | None:
        if not self.config.agents.enabled:
            return None
        return AgentStage(self.run_dir.path, self.run_dir.run_id, self.config.agents, self.config.profile,
                          max(self.config.measure.runs, 2), workers, self._record_direct, self.log,
                          (lambda verifier: self.agent_steps()) if self.agent_steps else None,
                          self.config.search.trials)

    def _start(self) -> tuple[list[StudyState], list[ray.actor.ActorHandle]]:
        kinds = {get_toolchain(t.spec.toolchain).device_kind for t in self.plan.targets}
        workers, devices, left_out = start_fleet(self.config.cluster, kinds, self.plan.file)
        self.skipped += left_out
        groups: dict[str, list[int]] = defaultdict(list)
        for i, device in enumerate(devices):
            groups[device.device_type].append(i)
        storage = open_storage(self.config.search, self.run_dir.path)
        studies = []
        for target in self.plan.targets:
            toolchain = get_toolchain(target.spec.toolchain)
            target_ref = ray.put(target)
            matching = [(t, idx) for t, idx in groups.items() if devices[idx[0]].kind == toolchain.device_kind]
            if not matching:
                self.skipped.append(f"{target.name}: no {toolchain.device_kind.upper()} worker in the cluster")
                continue
            for device_type, indices in matching:
                device = devices[indices[0]]
                study = create_study(self.config.search, target, f"{target.name}@{device_type}", storage)
                studies.append(StudyState(target, target_ref, device, indices, study, toolchain.arch_for(device),
                                          self.config.search.objective, space_size=target.space_size()))
        for reason in self.skipped:
            self.log(f"skipped {reason}")
        return studies, workers

    def _reuse(self, studies: list[StudyState]) -> Callable[[Job, BuildArtifact], Measurement | None]:
        by_name = {s.name: s for s in studies}

        def reuse(job: Job, artifact: BuildArtifact) -> Measurement | None:
            previous = by_name[job.candidate.study].binaries.get(artifact.binary_hash)
            if previous is None:
                return None
            now = time.time()
            return dataclasses.replace(previous, candidate_key=job.candidate.key, run_s=0.0, verify_s=0.0,
                                       queue_s=0.0, started_at=now, finished_at=now,
                                       error_tail=f"same binary as {previous.candidate_key}; measured once")

        return reuse

    # -- phases ------------------------------------------------------------------------------
    def _job(self, study: StudyState, candidate, runs: int, reusable: bool = True) -> Job:
        target, target_ref = study.source_of(candidate)
        return Job(target_ref, target, candidate, study.workers, study.device, runs, study.reference, reusable)

    def _agents(self, stage: AgentStage, studies: list[StudyState], done: dict[str, bool]) -> None:
        """The optimization workflow per study: verified variants join its search."""
        for study in studies:
            baseline = study.baseline_candidate()
            kernels = self.baseline_kernels.get(study.name)
            if kernels is None and not done.get(study.name):
                artifact, _ = compile_task.remote(study.target_ref, baseline)
                kernels = ray.get(artifact).kernels
            stage.run(study, baseline, tuple(kernels or ()), done.get(study.name, False))
        if self._cover(v for s in studies for v in s.variants.values()):
            self.writer.widen(results_schema(self.schema_targets))

    def _record_direct(self, study: StudyState, source: Target, candidate, artifact: BuildArtifact,
                       measurement: Measurement | None) -> None:
        """A row for a run made outside the pipeline (an agent variant's verification)."""
        if self._cover([source]):
            self.writer.widen(results_schema(self.schema_targets))
        row = make_row(self.run_dir.run_id, candidate, artifact, measurement, study.baseline_median, study.goal,
                       unit=study.target.spec.metric.unit, max_noise=self.config.measure.max_noise,
                       objective=study.objective)
        self.writer.append(row)
        self.written += 1
        stats = measurement.stats if measurement else None
        status = measurement.status if measurement else artifact.status
        median = stats.median if status is Status.OK and stats else None
        energy = measurement.telemetry.energy_j if measurement and measurement.telemetry else None
        study.record(candidate, Evaluated(status, median, energy))

    def _baselines(self, studies: list[StudyState], pipeline: Pipeline) -> None:
        for study in studies:
            baseline = study.baseline_candidate()
            study.candidates[baseline.key] = baseline
            reference = load_reference(self.run_dir.path, baseline.key)
            previous = study.results.get(baseline.key)
            if reference is not None and previous is not None and previous.status is Status.OK:
                study.reference = ray.put(reference)
                continue
            runs = max(self.config.measure.runs, self.config.measure.final_runs)
            pipeline.submit(self._job(study, baseline, runs, reusable=False))
        self._drain(pipeline, studies)
        for study in studies:
            if study.reference is None and not study.disabled:
                study.disabled = "its baseline did not run"
        for study in studies:
            if study.disabled:
                self.skipped.append(f"{study.name}: {study.disabled}")
                self.log(f"skipped {study.name}: {study.disabled}")

    def _search(self, studies: list[StudyState], pipeline: Pipeline) -> None:
        budget = self.config.search
        deadline = time.monotonic() + budget.time_budget_s if budget.time_budget_s else float("inf")
        cap = {s.name: len(s.workers) * pipeline.per_worker + self._compile_slots() for s in studies}

        def wants_more(s: StudyState) -> bool:
            trials_left = budget.trials is None or s.n_search + len(s.pending) < budget.trials
            return trials_left and not s.exhausted and time.monotonic() < deadline

        while True:
            t0 = time.perf_counter()
            asking = True
            while asking:  # one ask per study per pass, so that studies sharing workers take turns
                asking = False
                for study in studies:
                    if wants_more(study) and pipeline.in_flight(study.workers) < cap[study.name]:
                        asking = True
                        asked = study.ask()
                        if asked is not None:
                            study.pending.add(asked[1].key)
                            pipeline.submit(self._job(study, asked[1], self.config.measure.runs))
            self.bookkeeping_s += time.perf_counter() - t0
            if pipeline.idle():
                break
            self._collect(pipeline.poll(POLL_S), studies)

    def _final(self, studies: list[StudyState], pipeline: Pipeline) -> None:
        """Re-measure the few best (and the baseline) with more repetitions for the selection."""
        k = self.config.measure.final_top_k
        if k == 0:
            return
        done = read_results(self.run_dir.path)
        finals = set(done.loc[done["phase"] == Phase.FINAL.value, "candidate_key"]) if len(done) else set()
        for study in studies:
            chosen = {c.key: c for c in [*study.top(k), study.baseline_candidate()]}
            for candidate in chosen.values():
                if candidate.key not in finals:
                    final = candidate.with_phase(Phase.FINAL)
                    pipeline.submit(self._job(study, final, self.config.measure.final_runs, reusable=False))
        self._drain(pipeline, studies)

    def _review(self, studies: list[StudyState], workers: list[ray.actor.ActorHandle]) -> None:
        """Candidates more than ``SUSPECT_SPEEDUP`` x faster than their baseline, run again against it
        on fresh seeds (cluster.runners.guardrails). A failure is a final row with ``verify_failed``, which
        keeps the candidate out of the selection; every verdict goes to the ``reviews/`` table."""
        done = set(read_table(self.run_dir.path, "reviews", REVIEW_SCHEMA)["candidate_key"])
        for study in studies:
            if not study.baseline_median:
                continue
            baseline_binary = None  # built once per study, on the first suspect
            for key, result in study.results.items():
                if result.median is None or key in done or key not in study.candidates:
                    continue
                ratio = speedup(result.median, study.baseline_median, study.goal)
                if not suspect_speedup(ratio, SUSPECT_SPEEDUP):
                    continue
                candidate = study.candidates[key]
                target, target_ref = study.source_of(candidate)
                if baseline_binary is None:
                    _, baseline_binary = compile_task.remote(study.target_ref, study.baseline_candidate())
                artifact_ref, binary = compile_task.remote(target_ref, candidate)
                worker = workers[study.workers[0]]
                verdict = ray.get(worker.reverify.remote(study.target, target, baseline_binary, binary))
                self.log(f"{study.name}: {ratio:.1f}x over the baseline: re-verified on fresh seeds: "
                         f"{verdict.status.value} {verdict.detail}")
                with ResultWriter(self.run_dir.path, REVIEW_SCHEMA, subdir="reviews") as writer:
                    writer.append_record({"run_id": self.run_dir.run_id, "study": study.name, "candidate_key": key,
                                          "speedup": ratio, "status": verdict.status.value,
                                          "detail": verdict.detail})
                if verdict.failed:
                    failed = Measurement(key, Status.VERIFY_FAILED, study.device,
                                         error_tail=f"fresh-seed re-verification: {verdict.detail}")
                    self._record_direct(study, target, candidate.with_phase(Phase.FINAL), ray.get(artifact_ref),
                                        failed)

    def _profile(self, studies: list[StudyState], workers: list[ray.actor.ActorHandle]) -> None:
        """Nsight Compute profiles of the baseline and the winner (or every correct candidate) of
        each GPU study, into the ``profiles`` table. Candidates already profiled are skipped."""
        spec = self.config.profile
        gpu = [s for s in studies if s.device.kind == "gpu"]
        if spec.candidates == "none" or not gpu:
            return
        rows = read_results(self.run_dir.path)
        done = set(read_table(self.run_dir.path, "profiles", PROFILE_SCHEMA)["candidate_key"])
        winners = {(b.target, b.device_type): b.candidate_key for b in select_best(rows)}
        metrics = tuple(spec.metrics or DEFAULT_METRICS)
        pending: dict[ray.ObjectRef, StudyState] = {}
        for study in gpu:
            if spec.candidates == "all":
                keys = [k for k, r in study.results.items() if r.status is Status.OK]
            else:
                keys = [study.baseline_candidate().key, winners.get((study.target.name, study.device.device_type))]
            for key in dict.fromkeys(k for k in keys if k and k not in done and k in study.candidates):
                target_ref = study.source_of(study.candidates[key])[1]
                _, binary = compile_task.remote(target_ref, study.candidates[key])
                worker = workers[study.workers[len(pending) % len(study.workers)]]
                pending[worker.profile.remote(target_ref, study.candidates[key], binary, metrics,
                                              spec.timeout_s)] = study
        if not pending:
            return
        self.log(f"profiling {len(pending)} candidates with Nsight Compute")
        with ResultWriter(self.run_dir.path, PROFILE_SCHEMA, subdir="profiles") as writer:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                study = pending.pop(ready[0])
                try:
                    profile: Profile = ray.get(ready[0])
                except ray.exceptions.RayError as exc:
                    self.log(f"profile lost for {study.name}: {exc}")
                    continue
                for record in profile_records(self.run_dir.run_id, study, profile):
                    writer.append_record(record)

    def _drain(self, pipeline: Pipeline, studies: list[StudyState]) -> None:
        while not pipeline.idle():
            self._collect(pipeline.poll(POLL_S), studies)

    def _compile_slots(self) -> int:
        return self.config.cluster.compile_workers or max(1, int(ray.cluster_resources().get("CPU", 1)))

    # -- results -----------------------------------------------------------------------------
    def _collect(self, finished: list[Done], studies: list[StudyState]) -> None:
        t0 = time.perf_counter()
        by_name = {s.name: s for s in studies}
        for done in finished:
            study = by_name[done.job.candidate.study]
            candidate, measurement = done.job.candidate, done.measurement
            if candidate.phase is Phase.BASELINE:
                self._baseline_done(study, done)
            row = make_row(self.run_dir.run_id, candidate, done.artifact, measurement,
                           study.baseline_median, study.goal, unit=study.target.spec.metric.unit,
                           max_noise=self.config.measure.max_noise, objective=study.objective)
            self.writer.append(row)
            self.written += 1
            stats = measurement.stats if measurement else None
            status = measurement.status if measurement else done.artifact.status
            ok = status is Status.OK and stats is not None
            energy = measurement.telemetry.energy_j if measurement and measurement.telemetry else None
            study.record(candidate, Evaluated(status, stats.median if ok and stats else None, energy))
            if ok and measurement is not None and done.artifact.binary_hash and candidate.phase is Phase.SEARCH:
                study.binaries.setdefault(done.artifact.binary_hash, measurement)
            self.progress.update(study)
        self.writer.maybe_flush()
        self.bookkeeping_s += time.perf_counter() - t0

    def _baseline_done(self, study: StudyState, done: Done) -> None:
        measurement = done.measurement
        stats = measurement.stats if measurement else None
        if measurement is None or measurement.status is not Status.OK or stats is None:
            status = measurement.status if measurement else done.artifact.status
            error = (measurement.error_tail if measurement else done.artifact.error_tail) or ""
            lines = [line for line in error.splitlines() if line.strip()]
            study.disabled = f"its baseline failed ({status.value}" + (f": {lines[-1][:200]})" if lines else ")")
            return
        self.baseline_kernels[study.name] = done.artifact.kernels
        reference = Reference(measurement.outputs)
        save_reference(self.run_dir.path, measurement.candidate_key, reference)
        study.reference = ray.put(reference)
        study.baseline_median = stats.median
