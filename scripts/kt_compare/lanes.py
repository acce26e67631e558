"""A lane: one process that runs a list of blocks, in order, on the GPUs it was given
(``CUDA_VISIBLE_DEVICES``), until its deadline. A block that cannot finish before the deadline
(by the longest of the last three blocks of its kind) is skipped, except the exhaustive reference;
every block, done or not, leaves a row in the ``blocks`` table, and its results in their own part
files.

    python -m scripts.kt_compare.lanes LANE.json
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cluster.config.run import RACE, SEARCH_SAMPLES
from scripts.kt_compare import rehearsal
from scripts.kt_compare.records import Block, RunResult, read_table, run_records, stamp, write_part
from scripts.kt_compare.spaces import KERNEL_SPACES, write_wf_target

WF_STRATEGY_NAMES = {"best": "Optuna TPE", "random": "Optuna random"}

# First guesses of a block's seconds, before the lane has seen one of its kind.
FIRST_GUESS_S = {"reference": 60.0, "remeasure": 30.0, ("run", "kernel_tuner"): 10.0, ("run", "warpfleet"): 15.0}


@dataclass
class Settings:
    max_evals: int = 20
    run_limit_s: float = 30.0
    wf_harness_args: list[str] = field(default_factory=lambda: ["--min-time", "0.05"])
    wf_kind: str = "program"  # program: a program per configuration; kernel: a kernel target (kernel_targets.py)
    wf_min_time: float = 0.05  # the kernel runner's min_time_s, as the program's --min-time
    wf_compile_workers: int | None = 4
    wf_final_top_k: int = 2
    wf_final_runs: int = 1
    wf_race: float | None = RACE  # measure.race: losers stop sampling past it x the study's best; None: never
    wf_search_samples: int | None = SEARCH_SAMPLES  # measure.search_samples; None: the full rule in the search
    wf_keep_fleet: bool = True  # one warpfleet fleet (actors, CUDA contexts) for the lane's runs: KeptFleet
    kt_best: str = "genetic_algorithm"
    ray_cpus: int = 8
    jobs: int = 4  # parallel nvcc for the independent timer
    ref_samples: int = 15
    ref_refine_top: int = 8
    ref_refine_samples: int = 31
    remeasure_rounds: int = 3
    remeasure_samples: int = 31
    dry_run: bool = False  # the rehearsal (rehearsal.py): no GPU, synthetic times
    rehearsal_pace_s: float = 0.0  # in the rehearsal, seconds each tuning run takes (to rehearse the deadlines)


@dataclass
class LaneSpec:
    name: str
    out: str
    work: str
    deadline: float  # epoch seconds
    gpus: int
    blocks: list[dict[str, Any]]
    settings: dict[str, Any]


def forget_compiled_kernels() -> None:
    """Cold compiles for the next warpfleet run, as Kernel Tuner's get (kt_run.forget_compiled): the
    kernel targets' compile cache (keyed by content, kept under the scratch root the workers share
    with this process) would otherwise serve every configuration an earlier run compiled."""
    from cluster.compile.kernel import cache_dir
    from cluster.config.env import scratch_root

    shutil.rmtree(cache_dir(scratch_root()), ignore_errors=True)


class Lane:
    def __init__(self, spec: LaneSpec) -> None:
        self.spec = spec
        self.out, self.work = Path(spec.out), Path(spec.work) / spec.name
        self.settings = Settings(**spec.settings)
        self.durations: dict[Any, list[float]] = defaultdict(list)
        self.log_file = self.out / "logs" / f"{spec.name}.log"
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._kt: Any = None
        self._fleet: Any = None  # the KeptFleet of this lane's warpfleet runs

    def log(self, message: str) -> None:
        line = f"[{stamp()} {self.spec.name}] {message}\n"
        sys.stdout.write(line)  # one write per line: the lanes share the command's output
        sys.stdout.flush()
        with self.log_file.open("a") as f:
            f.write(line)

    def run(self) -> None:
        self.log(f"{len(self.spec.blocks)} blocks, {self.spec.deadline - time.time():.0f} s to the deadline, "
                 f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")
        for data in self.spec.blocks:
            block = Block.from_dict(data)
            kind = block.kind if block.kind != "run" else (block.kind, block.tool)
            guess = max(self.durations[kind][-3:], default=FIRST_GUESS_S[kind])
            # The exhaustive reference always runs: without it no figure can be judged.
            if block.kind != "reference" and time.time() + guess > self.spec.deadline:
                self._record(block, "skipped", 0.0, f"would not finish by the deadline (~{guess:.0f} s)")
                continue
            start = time.time()
            try:
                detail = self._do(block)
                status = "done"
            except Exception as exc:
                detail, status = f"{type(exc).__name__}: {exc}", "failed"
                self.log(f"{block.id} failed:\n{traceback.format_exc()[-3000:]}")
            self.durations[kind].append(time.time() - start)
            self._record(block, status, time.time() - start, detail)
        self._shutdown()

    def _record(self, block: Block, status: str, seconds: float, detail: str) -> None:
        self.log(f"{block.id}: {status} in {seconds:.1f} s {detail}")
        row = {**asdict(block), "block_id": block.id, "lane": self.spec.name, "status": status,
               "seconds": seconds, "detail": detail[-2000:], "finished_at": time.time()}
        write_part(self.out, "blocks", f"{self.spec.name}-{block.id}", [row])

    def _do(self, block: Block) -> str:
        if block.kind == "reference":
            return self._reference(block)
        if block.kind == "remeasure":
            return self._remeasure(block)
        return self._tuning_run(block)

    # -- the independent timer ---------------------------------------------------------------
    def _reference(self, block: Block) -> str:
        from scripts.kt_compare.reference import exhaustive

        s = self.settings
        space = KERNEL_SPACES[block.kernel]
        if s.dry_run:
            measured = rehearsal.reference(space)
        else:
            measured = exhaustive(space, self.work / "reference" / space.name, s.jobs, s.ref_samples,
                                  s.ref_refine_top, s.ref_refine_samples, log=self.log)
        write_part(self.out, "reference", block.id, self._measured_rows(measured, "exhaustive"))
        ok = [m for m in measured if m.status == "ok"]
        best = min(ok, key=lambda m: m.median or 0.0) if ok else None
        return f"{len(ok)}/{len(measured)} ok, optimum {best.key} {best.median:.4f} ms" if best else "nothing ok"

    def _remeasure(self, block: Block) -> str:
        from scripts.kt_compare.reference import remeasure

        s = self.settings
        space = KERNEL_SPACES[block.kernel]
        runs, ref = read_table([self.out], "runs"), read_table([self.out], "reference")
        keys: list[str] = []
        if len(ref):
            ok = ref[(ref["kernel"] == space.name) & (ref["status"] == "ok")].sort_values("median_ms")
            keys += list(ok["key"][:5])  # the optimum and the configurations nearest it
        if len(runs):
            keys += [k for k in runs.loc[runs["kernel"] == space.name, "winner_key"].dropna()]
        configs = [parse_key(k) for k in dict.fromkeys(keys)]
        if not configs:
            return "nothing to re-measure"
        if s.dry_run:
            measured = rehearsal.remeasure(space, configs)
        else:
            measured = remeasure(space, configs, self.work / "reference" / space.name, s.jobs, s.remeasure_rounds,
                                 s.remeasure_samples)
        write_part(self.out, "remeasure", block.id, self._measured_rows(measured, "remeasure"))
        return f"{len(measured)} configurations"

    def _measured_rows(self, measured: list, phase: str) -> list[dict[str, Any]]:
        name = "rehearsal (no GPU)" if self.settings.dry_run else _device_name()
        return [{"kernel": m.kernel, "key": m.key, "config": json.dumps(m.config), "status": m.status,
                 "median_ms": m.median, "min_ms": min(m.samples) if m.samples else None,
                 "n_samples": len(m.samples), "samples": json.dumps(m.samples), "error": m.error[-1000:],
                 "phase": phase, "gpu_name": name, "lane": self.spec.name} for m in measured]

    # -- tuning runs -------------------------------------------------------------------------
    def _tuning_run(self, block: Block) -> str:
        s = self.settings
        space = KERNEL_SPACES[block.kernel]
        started = time.time()
        if s.dry_run:
            time.sleep(s.rehearsal_pace_s)
        if block.tool == "kernel_tuner" and s.dry_run:
            cache = rehearsal.kt_cache(space, self.work / "rehearsal")
            result, strategy_name = rehearsal.kt_run(space, cache, block.strategy, s.kt_best, block.seed, s.max_evals,
                                                     s.run_limit_s)
        elif block.tool == "kernel_tuner":
            if block.gpus > 1:
                self._ray(block.gpus)
            result, strategy_name = self._kernel_tuner().run(
                space, block.strategy, s.kt_best, block.seed, s.max_evals, s.run_limit_s, block.gpus,
                repaired=block.variant == "repaired")
        else:
            result, strategy_name = self._warpfleet(block, space), WF_STRATEGY_NAMES[block.strategy]
        evals, runs = run_records(block, result, strategy_name, started)
        write_part(self.out, "evals", block.id, evals)
        write_part(self.out, "runs", block.id, runs)
        return self._describe(result)

    def _warpfleet(self, block: Block, space) -> RunResult:
        from scripts.kt_compare.wf_run import run_sweep, write_run_config

        s = self.settings
        if s.wf_kind == "kernel":
            from scripts.kt_compare.kernel_targets import write_wf_kernel_target

            target = write_wf_kernel_target(space, self.work / "kernel-targets" / space.name, s.wf_min_time)
        else:
            target = write_wf_target(space, self.work / "targets" / space.name, s.wf_harness_args)
        forget_compiled_kernels()
        if s.dry_run:
            return rehearsal.wf_run(space, target, block.strategy, block.seed, s.max_evals, block.gpus)
        self._ray(block.gpus)
        folder = self.work / "wf" / block.id
        folder.mkdir(parents=True, exist_ok=True)
        config = write_run_config(folder, target, space, block.strategy, block.seed, s.max_evals, s.run_limit_s,
                                  s.wf_compile_workers, s.wf_final_top_k, s.wf_final_runs, s.wf_race,
                                  s.wf_search_samples)
        if s.wf_keep_fleet and self._fleet is None:
            # the engine's workers kept across runs, as KT keeps its own
            from cluster.engine.scheduling.workers import KeptFleet

            self._fleet = KeptFleet()
        return run_sweep(config, space, block.gpus, log=lambda m: self.log(f"  warpfleet: {m}"), fleet=self._fleet)

    @staticmethod
    def _describe(result: RunResult) -> str:
        if result.error:
            return f"error: {result.error[:300]}"
        return (f"{result.unique_evaluations} configurations in {result.wall_s:.1f} s, winner {result.winner_key} "
                f"({result.winner_tool_ms}), workers {result.workers_used}/{result.workers_requested}")

    def _kernel_tuner(self) -> Any:
        if self._kt is None:
            from scripts.kt_compare.kt_run import KernelTunerRuns

            self._kt = KernelTunerRuns(log=self.log)
        return self._kt

    def _ray(self, gpus: int) -> None:
        import ray

        if not ray.is_initialized():
            t0 = time.time()
            # address="local": a new instance of this lane's own, never another lane's.
            ray.init(address="local", num_cpus=self.settings.ray_cpus, num_gpus=gpus, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
            self.log(f"Ray up in {time.time() - t0:.1f} s: {ray.cluster_resources()}")

    def _shutdown(self) -> None:
        if self._fleet is not None:
            self._fleet.close()
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                ray.shutdown()


def _device_name() -> str:
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def parse_key(key: str) -> dict[str, int]:
    """spaces.config_key, read back."""
    return {name: int(value) for name, value in (part.split("=") for part in key.split(","))}


def main(argv: list[str]) -> None:
    spec = LaneSpec(**json.loads(Path(argv[0]).read_text()))
    os.environ.pop("KERNEL_TUNER_PARALLEL", None)  # Kernel Tuner's own switch; the blocks say what they want
    os.environ.pop("RAY_ADDRESS", None)  # each lane starts a Ray instance of its own
    # Set before Ray starts, so that Kernel Tuner's Ray actors inherit it too (kt_run explains why).
    os.environ["CUPY_CACHE_IN_MEMORY"] = "1"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped past the deadline: Ray shuts down on exit
    Lane(spec).run()


if __name__ == "__main__":
    main(sys.argv[1:])
