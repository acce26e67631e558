"""The ``warpfleet`` command line: sweep, optimize, validate, show, check, export, evaluate, compare, report."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import wraps
from pathlib import Path
from typing import Any

import click

from cluster.api import configure_logging
from cluster.api import selected as selected_configs
from cluster.config import RunPlan, Target, load_run
from cluster.config.run import MAX_TRIALS
from cluster.core.errors import ConfigError
from cluster.core.registry import EXPORT_FORMATS


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input ends in one line on stderr and exit status 2, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper


class _OneLineErrors(click.Group):
    """Usage errors (an unknown option, a bad value) in one line, like every other bad input."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = f"{ctx.command_path}: " if ctx else ""
            click.echo(f"error: {where}{exc.format_message()}", err=True)
            sys.exit(2)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)


ACCEPT_CHANGES_HELP = ("With --resume: a target whose sources or spec changed since the run gets a new study "
                       "(its old rows stay, no longer counted), and targets added to the config get theirs.")


@click.group(cls=_OneLineErrors)
@click.version_option(package_name="warpfleet")
def main() -> None:
    """Profile-guided tuning of CUDA (and C) programs, swept over a Ray cluster."""
    configure_logging()  # what a sweep says, a line each on stderr (rich on a terminal); Optuna's own from warnings up
    banner = logging.getLogger(RAY_AUTH_LOGGER)
    if _not_the_auth_banner not in banner.filters:
        banner.addFilter(_not_the_auth_banner)


# Ray 2.60 logs "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to
# opt out..." whenever it starts a local instance: before every sweep's output, one-line errors
# included. warpfleet keeps token authentication on (README: Security of the cluster), so the line
# asks nothing of a user; Ray's other authentication warnings (it is off, a token is missing) stay.
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _not_the_auth_banner(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--address", help="Ray cluster to join (auto, HOST:PORT, ray://...); default: a local instance.")
@click.option("--resume", "resume", type=click.Path(file_okay=False), help="Continue this run directory.")
@click.option("--accept-changes", is_flag=True, help=ACCEPT_CHANGES_HELP)
@click.option("--trials", type=click.IntRange(min=1, max=MAX_TRIALS),
              help="Evaluated candidates per study (overrides the config; a resume keeps it).")
@click.option("--time-budget", type=click.FloatRange(min=0, min_open=True), callback=lambda ctx, param, value:
              _finite(value), help="The sweep's wall clock in seconds, from this command's start: the search "
                                   "stops in time for the finals and their checks (overrides the config; a resume "
                                   "keeps it).")
@click.option("--output-dir", type=click.Path(file_okay=False), help="Where run directories go (overrides).")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@click.option("--unsandboxed", is_flag=True,
              help="Run candidates without the sandbox where it cannot start (recorded in meta.json).")
@click.option("--json", "as_json", is_flag=True,
              help="The summary as one JSON document (rows written, studies and winners, what to run next).")
@_one_line_errors
def sweep(config: str, address: str | None, resume: str | None, accept_changes: bool, trials: int | None,
          time_budget: float | None, output_dir: str | None, progress: bool | None, unsandboxed: bool,
          as_json: bool) -> None:
    """Sweep the targets of CONFIG, then print the best configurations."""
    started = time.monotonic()  # what --time-budget counts from
    from cluster.engine.driver import Sweep
    from cluster.outputs.show import next_commands, run_record, show
    from cluster.store.check import check_tables
    from cluster.store.rundir import RunDir

    _accept_needs_resume(accept_changes, resume)
    plan = load_run(config)
    budget = {k: v for k, v in {"trials": trials, "time_budget_s": time_budget}.items() if v is not None}
    existing = RunDir.open(resume) if resume else None
    changed: list[str] = []
    if existing is not None:  # the budget given on the first command line holds unless given again
        existing.claim()  # one driver per run: a second one stops here, in one line
        changed = existing.check_resumable(plan, accept_changes)
        budget = {**existing.read_meta().get(COMMAND_LINE, {}), **budget}
        check_tables(existing.path)  # a damaged part is one line now, before Ray and workers start
    plan = _override(plan, budget, output_dir)
    if existing is None:
        _check_output_dir(plan, output_dir)
    _check_runnable_here(plan, address, plan.file, "targets")
    policy = _isolate(plan, unsandboxed)
    joining = time.monotonic()
    where = _join_ray(plan, address)
    _budget_clock(plan, started, time.monotonic() - joining, where)
    _check_runnable(plan, plan.file, "targets")
    with _blamed_on(output_dir, "--output-dir"):
        run_dir = existing or RunDir.create(plan, meta={COMMAND_LINE: budget})
    run_dir.claim()
    if existing is not None and budget:
        run_dir.update_meta(**{COMMAND_LINE: budget})
    if accept_changes:
        _start_new_studies(run_dir, plan, changed)
    _record_sandbox(run_dir, policy)
    click.echo(f"run directory: {run_dir.path}", err=True)
    show_progress = sys.stderr.isatty() if progress is None else progress
    with _resume_hint(f"warpfleet sweep {config} --resume {run_dir.path}", run_dir.path):
        summary = Sweep(plan, run_dir, started_at=started).run(address, show_progress)
    _fail_if_nothing_ran(plan, summary)
    click.echo(f"{summary.evaluated} rows written to {run_dir.results}", err=True)
    if summary.unfinished:
        click.echo(f"time budget: {len(summary.unfinished)} studies stopped before their finals "
                   f"({', '.join(summary.unfinished)}): their best so far is shown, not re-measured; "
                   f"to finish them: warpfleet sweep {config} --resume {run_dir.path}", err=True)
    if as_json:
        record, selected = run_record(run_dir.path), selected_configs(run_dir.path)
        _echo_json({"rows_written": summary.evaluated, "wall_s": summary.wall_s, "skipped": list(summary.skipped),
                    "no_baseline": list(summary.no_baseline), "unfinished": list(summary.unfinished), **record,
                    "next": next_commands(run_dir.path, selected)})
    else:
        selected = show(run_dir.path)
    click.echo("next:\n" + "".join(f"  {command}\n" for command in next_commands(run_dir.path, selected)),
               err=True, nl=False)
    _fail_without_baseline(summary)


def _echo_json(document: Any) -> None:
    """A command's ``--json``: one document on stdout."""
    click.echo(json.dumps(document, indent=1, allow_nan=False))


COMMAND_LINE = "command_line"  # meta.json: the budget given on the command line, for a resume


def _budget_line(plan: RunPlan) -> tuple[str, bool] | None:
    """What a time budget asks of the targets: each study's baseline and finals are runs of its
    program that the search cannot use; on one worker, the run time under which they all fit. And
    whether that is a warning (a run must be short)."""
    budget = plan.config.search.time_budget_s
    if not budget:
        return None
    measure = plan.config.measure
    runs = measure.runs + (max(1, measure.final_top_k) + 1) * (measure.final_runs + 1)
    per_run = budget / (runs * len(plan.targets))
    line = (f"time budget {budget:g} s: each target's baseline and finals take {runs} runs of its program; "
            f"on one worker the {len(plan.targets)} targets' fit where a run takes under {per_run:.3g} s")
    if per_run < 0.5:
        return (f"warning: {plan.file}: search.time_budget_s: {line}, which may not hold; the sweep says so "
                f"once it has measured the baselines"), True
    return line, False


def _budget_note(plan: RunPlan) -> None:
    budget = _budget_line(plan)
    if budget is not None:
        click.echo(budget[0], err=budget[1])


def _accept_needs_resume(accept_changes: bool, resume: str | None) -> None:
    if accept_changes and not resume:
        raise click.UsageError("--accept-changes is for --resume RUN only", click.get_current_context())


def _start_new_studies(run_dir: Any, plan: RunPlan, changed: list[str]) -> None:
    """What --accept-changes accepted, written to meta.json once nothing else can refuse the resume."""
    for name, generation in run_dir.start_new_studies(plan, changed).items():
        click.echo(f"target {name} changed since the run: a new study (generation {generation}); the rows "
                   f"of the old stay in the run, left out of it", err=True)


def _override(plan: RunPlan, budget: dict[str, Any], output_dir: str | None) -> RunPlan:
    search = plan.config.search.model_copy(update=budget)
    update: dict[str, Any] = {"search": search}
    if output_dir:
        update["output_dir"] = output_dir
    return RunPlan(plan.config.model_copy(update=update), plan.file, plan.targets)


def _check_output_dir(plan: RunPlan, option: str | None) -> None:
    """A place that cannot hold a run directory is one line before Ray starts, against what named
    it: ``--output-dir`` when given, else the config's ``output_dir``."""
    from cluster.store.rundir import output_dir_problem

    root = option or plan.config.output_dir
    if not (problem := output_dir_problem(Path(root))):
        return
    message = f"cannot create a run directory there ({problem})"  # in RunDir.create's words
    if option:
        raise ConfigError(option, "--output-dir", message)
    raise ConfigError(plan.file, "output_dir", f"{root}: {message}")


@contextmanager
def _blamed_on(option_value: str | None, option: str) -> Iterator[None]:
    """A ConfigError about the config's field that ``option`` overrode is the option's, where given
    (RunDir.create names the config's output_dir, which --output-dir replaced)."""
    try:
        yield
    except ConfigError as exc:
        if option_value is None or exc.field != option.removeprefix("--").replace("-", "_"):
            raise
        raise ConfigError(option_value, option, exc.message) from None


def _budget_clock(plan: RunPlan, started: float, ray_s: float, where: str | None) -> None:
    """A budgeted sweep's clock, once Ray is up: its start-up is spent from the budget, which counts
    from the command's start."""
    budget = plan.config.search.time_budget_s
    if budget:
        left = max(0.0, budget - (time.monotonic() - started))
        click.echo(f"Ray {'joined' if where else 'started'} in {ray_s:.0f} s; {left:.0f} s of the {budget:g} s "
                   "budget left", err=True)


def _join_ray(plan: RunPlan, address: str | None) -> str | None:
    """Join the Ray cluster (or start a local instance) before anything is written: an address
    with no cluster behind it is one line, with no run directory left behind. The first of
    ``--address``, the config's ``cluster.address`` and the environment's ``RAY_ADDRESS`` names
    the cluster; none: a local instance. Returns the address joined (None: a local instance)."""
    from cluster.config import env
    from cluster.engine.driver import init_ray

    where, file, field, hint = address, plan.file, "--address", ""
    if not where:
        where, field = plan.config.cluster.address, "cluster.address"
    if not where and env.ray_address():
        where, file, field, hint = env.ray_address(), env.RAY_ADDRESS, "", "; unset it for a local instance"
    try:
        _reachable(where)
        init_ray(where)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError, ...: Ray's words, one line
        lines = [line for line in str(exc).splitlines() if line.strip()]
        reason = lines[0][:300] if lines else type(exc).__name__
        raise ConfigError(file, field, f"cannot join a Ray cluster at {where or 'a local instance'} "
                          f"({type(exc).__name__}: {reason}){hint}") from None
    return where


def _reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Raise OSError at once when nothing listens at a HOST:PORT address: Ray would wait minutes for
    a GCS that is not there. ``auto`` and a local instance (None) are left to Ray."""
    import re
    import socket

    match = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", address or "")
    if match:
        with socket.create_connection((match[1], int(match[2])), timeout=timeout_s):
            pass


def _gpu_targets(plan: RunPlan) -> list[str]:
    """The targets' names where every one needs a GPU, else [] (a CPU target runs on any cluster)."""
    from cluster.toolchains import get_toolchain

    gpu_targets = [t.name for t in plan.targets if get_toolchain(t.spec.toolchain).device_kind == "gpu"]
    return gpu_targets if len(gpu_targets) == len(plan.targets) else []


def _nothing_to_run(plan: RunPlan, file: str, field: str, gpu_targets: list[str], present: list[str]) -> ConfigError:
    wanted = plan.config.cluster.gpu_types
    what = f"no GPU of cluster.gpu_types ({', '.join(wanted)})" if wanted else "no GPU"
    where = f" (present: {', '.join(present) or 'none'})" if wanted else ""
    return ConfigError(file, field, f"{what} in the cluster{where}, and {', '.join(gpu_targets)} "
                       f"{'needs' if len(gpu_targets) == 1 else 'need'} one: nothing to run")


def _check_runnable_here(plan: RunPlan, address: str | None, file: str, field: str) -> None:
    """Before Ray starts: a local instance (no cluster named) gets the GPUs this machine shows
    (CUDA_VISIBLE_DEVICES, else NVML, as Ray counts them), so where there are none, GPU targets
    alone are one line now rather than after Ray's start-up (15 s on a loaded machine)."""
    from cluster.config import env
    from cluster.platform.devices import visible_gpu_count

    ray = sys.modules.get("ray")  # not imported for this: its import alone takes a second
    if address or plan.config.cluster.address or env.ray_address() or (ray is not None and ray.is_initialized()):
        return  # a cluster named, or one this process joined already (a script's, the tests')
    if (gpu_targets := _gpu_targets(plan)) and visible_gpu_count() == 0:
        raise _nothing_to_run(plan, file, field, gpu_targets, [])


def _check_runnable(plan: RunPlan, file: str, field: str) -> None:
    """One line, before a run directory is made, where no target can run on the cluster joined
    (GPU targets and no GPU of the types wanted), rather than a run of nothing."""
    import ray

    from cluster.engine.scheduling.workers import gpu_slots

    if not (gpu_targets := _gpu_targets(plan)):
        return
    if sum(gpu_slots(ray.nodes(), plan.config.cluster.gpu_types)[0].values()):
        return
    present = sorted(k or "(no type)" for k in gpu_slots(ray.nodes(), None)[0])
    raise _nothing_to_run(plan, file, field, gpu_targets, present)


def _fail_if_nothing_ran(plan: RunPlan, summary: Any) -> None:
    """Exit status 1 where every target was skipped (its device left the cluster since it was
    checked): a run of nothing is not a sweep to show."""
    skipped = {reason.split(": ", 1)[0] for reason in summary.skipped}
    if summary.evaluated == 0 and all(target.name in skipped for target in plan.targets):
        click.echo(f"error: every target was skipped ({'; '.join(summary.skipped)}): nothing was run", err=True)
        sys.exit(1)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (Slurm's time limit, kill, timeout), raised where Ctrl-C raises KeyboardInterrupt."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated


# Where a write of the run failed for want of room or rights: the rows written so far are kept.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


@contextmanager
def _resume_hint(command: str | None, run: Path) -> Iterator[None]:
    """Ctrl-C or SIGTERM: the command that goes on from where it stopped, exit status 130 (143);
    a disk that fills under the run's journal or part files: one line with it, exit status 1.
    SIGTERM's handler is installed here, after Ray's: Ray's own dumps C++ stack traces and aborts.
    ``command`` None: a run that no resume continues (an evaluation); the run is named instead."""
    then = f"resume with: {command}" if command else f"what was measured is in {run}"
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        click.echo(f"\n{'terminated' if terminated else 'aborted'}; {then}", err=True)
        sys.exit(143 if terminated else 130)
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise
        what = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"error: {run}: cannot write the run ({what}{exc.strerror or exc}); the rows written are "
                   f"kept{f': make room, then {then}' if command else ''}", err=True)
        sys.exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _fail_without_baseline(summary: Any) -> None:
    """Exit status 1 when a study had no valid baseline: its target was never tuned."""
    studies = summary.no_baseline
    if not studies:
        return
    for study in studies:
        reason = next((s.split(": ", 1)[1] for s in summary.skipped if s.startswith(f"{study}: ")),
                      "its baseline failed")
        click.echo(f"error: no valid baseline for {study}: {reason}; nothing was tuned there", err=True)
    sys.exit(1)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--build", is_flag=True, help="Also compile each target's baseline and, per param, one other "
              "value, and warn about a param that does not change the binary (a -D the source ignores).")
@click.option("--arch", default="sm_90", show_default=True, callback=lambda ctx, param, value: _archs((value,))[0],
              help="The arch --build compiles GPU targets for.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON document: the targets, their spaces, the notes, what --build found.")
@_one_line_errors
def validate(config: str, build: bool, arch: str, as_json: bool) -> None:
    """Check CONFIG and its targets without running anything (--build: compile them)."""
    plan = load_run(config)
    _check_output_dir(plan, None)
    notes = [note for target in plan.targets if (note := _sanitizer_note(plan, target))]
    if as_json:
        from cluster.compile.probe import probe_params

        budget = _budget_line(plan)
        _echo_json({"config": str(plan.file), "targets": [_target_record(t) for t in plan.targets], "notes": notes,
                    "time_budget": {"line": budget[0], "warning": budget[1]} if budget else None,
                    "build": {t.name: list(probe_params(t, arch)) for t in plan.targets} if build else None})
        return
    for target in plan.targets:
        points, exact = target.space_count()
        count = f"{points} configurations" if exact else \
            f"at most {points} configurations (too many to count with the constraints)"
        click.echo(f"{target.name}: {target.spec.toolchain}, space {target.space.name}, {count}")
    for note in notes:
        click.echo(note, err=True)
    _budget_note(plan)
    if build:
        from cluster.compile.probe import probe_params

        for target in plan.targets:
            for line in probe_params(target, arch):
                click.echo(f"{target.name}: {line}", err=line.startswith("warning"))


def _target_record(target: Target) -> dict[str, Any]:
    points, exact = target.space_count()
    return {"name": target.name, "file": str(target.file), "toolchain": target.spec.toolchain,
            "space": target.space.name, "configurations": points, "exact": exact}


def _sanitizer_note(plan: RunPlan, target: Target) -> str | None:
    agents = plan.config.agents
    if (agents.enabled and agents.sanitizer and target.spec.toolchain == "nvcc"
            and target.spec.kind == "program" and not target.spec.verify.sanitize_run):
        return (f"note: {target.file}: no verify.sanitize_run: on a GPU, compute-sanitizer "
                f"({', '.join(agents.sanitizer)}) runs each variant that measures faster than the baseline "
                f"on the full problem, up to {agents.sanitizer_timeout_s:g} s per tool; give it a smaller "
                f"one (README: Bounded verification)")
    return None


@main.command()
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON document: each study, its counts and its winner.")
@_one_line_errors
def show(run: str, as_json: bool) -> None:
    """Best configuration per target and GPU, with its speedup over the baseline."""
    from cluster.outputs.show import run_record
    from cluster.outputs.show import show as show_run

    if as_json:
        _echo_json(run_record(Path(run)))
    else:
        show_run(Path(run))


@main.command()
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--dry-run", is_flag=True, help="Name the unreadable part files and journal; move nothing.")
@_one_line_errors
def check(run: str, dry_run: bool) -> None:
    """Read every Parquet part file of RUN whole and replay its Optuna journal; move the unreadable
    ones (truncated, zeroed, empty, of another schema) to RUN/quarantine/, so that show, export and
    --resume go on; a resume runs their rows again, and rebuilds a journal from the rows."""
    from cluster.store.check import check_run
    from cluster.store.rundir import RunDir

    run_dir = RunDir.open(run)
    bad = check_run(run_dir.path, move=not dry_run)
    for part in bad:
        moved = f"; moved to {part.moved_to}" if part.moved_to else ""
        click.echo(f"{part.path}: unreadable ({part.problem}){moved}")
    if not bad:
        journal = " and the Optuna journal replays" if run_dir.journal.is_file() else "; no Optuna journal to replay"
        click.echo(f"{run_dir.path}: every part file reads whole{journal}")
        return
    config = run_dir.read_meta().get("config_file", "CONFIG")
    parts, journal = sum(not b.is_journal for b in bad), any(b.is_journal for b in bad)
    what = [f"{parts} part files" if parts else "", "the Optuna journal" if journal else ""]
    then = ["their rows run again" if parts else "", "the studies are rebuilt from the rows" if journal else ""]
    click.echo(f"{' and '.join(filter(None, what))} {'unreadable' if dry_run else 'moved aside'}; on resume "
               f"{' and '.join(filter(None, then))}: warpfleet sweep {config} --resume {run_dir.path}", err=True)
    if dry_run:
        sys.exit(1)


@main.command()
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--experts", default="registers,unroll,padding,streamify", show_default=True,
              help="Comma-separated rule-based experts to run.")
@click.option("--trials", type=click.IntRange(min=1, max=MAX_TRIALS), default=24, show_default=True,
              help="Candidates searched over the verified variants and the flags.")
@click.option("--sanitizer", default="memcheck,racecheck", show_default=True,
              help="compute-sanitizer tools run on every transformed source (GPU); '' for none.")
@click.option("--address", help="Ray cluster to join; default: a local instance.")
@click.option("--output-dir", type=click.Path(file_okay=False), default="runs", show_default=True)
@click.option("--resume", "resume", type=click.Path(file_okay=False), help="Continue this run directory.")
@click.option("--accept-changes", is_flag=True, help=ACCEPT_CHANGES_HELP)
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@click.option("--unsandboxed", is_flag=True,
              help="Run candidates without the sandbox where it cannot start (recorded in meta.json).")
@_one_line_errors
def optimize(target: str, experts: str, trials: int, sanitizer: str, address: str | None, output_dir: str,
             resume: str | None, accept_changes: bool, progress: bool | None, unsandboxed: bool) -> None:
    """Run the optimization workflow on TARGET: analysis, plan, patch, verify, then a search over the
    verified variants and the compiler flags; writes report.md in the run directory and prints it."""
    started = time.monotonic()
    import yaml

    from cluster.config import load_target
    from cluster.engine.driver import Sweep
    from cluster.outputs.optimize_report import write_report
    from cluster.store.check import check_tables
    from cluster.store.rundir import RunDir

    _accept_needs_resume(accept_changes, resume)
    spec = load_target(target)
    config = {"name": f"optimize-{spec.name}", "output_dir": str(Path(output_dir).resolve()),
              "targets": [str(Path(target).resolve())], "search": {"trials": trials},
              "agents": _agents_options(experts, sanitizer)}
    config_path = Path(output_dir) / f"optimize-{spec.name}.yaml"
    with _removed_unless_run(config_path) as write:
        try:
            write(("# written by `warpfleet optimize`; `warpfleet sweep` takes it as it is\n"
                   + yaml.safe_dump(config, sort_keys=False)).encode())
        except OSError as exc:
            raise ConfigError(output_dir, "--output-dir", f"cannot be written ({exc.strerror or exc})") from None
        plan = load_run(config_path)
        existing = RunDir.open(resume) if resume else None
        if existing is not None:
            existing.claim()  # one driver per run: a second one stops here, in one line
        changed = existing.check_resumable(plan, accept_changes) if existing is not None else []
        if existing is not None:
            check_tables(existing.path)  # as sweep's resume: a damaged part or journal, before Ray
        _check_runnable_here(plan, address, target, "toolchain")
        policy = _isolate(plan, unsandboxed)
        _join_ray(plan, address)
        _check_runnable(plan, target, "toolchain")
        run_dir = existing or RunDir.create(plan)
        run_dir.claim()
    if accept_changes:
        _start_new_studies(run_dir, plan, changed)
    _record_sandbox(run_dir, policy)
    click.echo(f"run directory: {run_dir.path}", err=True)
    show_progress = sys.stderr.isatty() if progress is None else progress
    with _resume_hint(f"warpfleet optimize {target} --output-dir {output_dir} --resume {run_dir.path}", run_dir.path):
        summary = Sweep(plan, run_dir, started_at=started).run(address, show_progress)
    _fail_if_nothing_ran(plan, summary)
    report = write_report(run_dir.path)
    click.echo(report.read_text())
    click.echo(f"report: {report}", err=True)
    _fail_without_baseline(summary)


def _agents_options(experts: str, sanitizer: str) -> dict[str, Any]:
    """optimize's agents: section, checked here: a name misspelt is the option's error, not one of
    the config file that optimize writes."""
    from pydantic import ValidationError

    from cluster.config.agents import AgentsSpec

    section = {"enabled": True, "experts": [e for e in experts.split(",") if e],
               "sanitizer": [t for t in sanitizer.split(",") if t]}
    try:
        AgentsSpec.model_validate(section)
    except ValidationError as exc:
        err = exc.errors()[0]
        option = "--sanitizer" if err["loc"][0] == "sanitizer" else "--experts"
        raise click.BadParameter(err["msg"].removeprefix("Value error, "), param_hint=f"'{option}'") from None
    return section


@contextmanager
def _removed_unless_run(path: Path) -> Iterator[Callable[[bytes], None]]:
    """Write ``path`` (and the folders above it) for what follows; where that fails before a run
    starts, remove what this wrote: a refused optimize leaves nothing behind."""
    from cluster.store.rundir import write_atomic

    made = [p for p in (path, *path.parents) if not os.path.lexists(p)]

    def write(content: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, content)

    try:
        yield write
    except BaseException:
        for place in made:  # the file, then the folders made for it, deepest first
            with suppress(OSError):
                place.unlink() if place == path else place.rmdir()
        raise


@main.command()
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(list(EXPORT_FORMATS)), default="flags", show_default=True,
              help="t4: Kernel Tuner's results format, one target on one device; bundle: all of them in a folder.")
@click.option("--output", type=click.Path(), help="Write here instead of stdout (bundle: the folder, required).")
@click.option("--target", help="Only this target.")
@click.option("--device", help="Only device types whose name contains this (H100, sm_90).")
@click.option("--unconfirmed", is_flag=True,
              help="Also export a study's best so far that was never re-measured on fresh seeds (a run stopped, "
                   "or ended by its time budget, before its finals).")
@_one_line_errors
def export(run: str, fmt: str, output: str | None, target: str | None, device: str | None,
           unconfirmed: bool) -> None:
    """Export the best configurations of RUN for a build."""
    from cluster.outputs.exports import (
        WHOLE_STUDIES,
        WRITES_FOLDER,
        ExportError,
        ExportRequest,
        NothingToExport,
        render,
    )
    from cluster.store.results import read_results
    from cluster.store.rundir import RunDir
    from cluster.store.select import load_verified, select_best

    run_dir = RunDir.open(run)
    rows = read_results(run_dir.path)
    best = select_best(rows, load_verified(run_dir.path))
    if target:
        best = [b for b in best if b.target == target]
        if not best:
            raise ConfigError(run, "--target", f"no selected configuration for target {target!r}")
    if device:
        best = [b for b in best if device.lower() in b.device_type.lower()]
        if not best:
            raise ConfigError(run, "--device", f"no selected configuration on a device matching {device!r}")
    if not best:
        raise ConfigError(run, "results", "no correct candidate to export")
    interim = [b for b in best if not b.remeasured]
    if interim and not unconfirmed and fmt not in WHOLE_STUDIES:
        names = ", ".join(f"{b.target} on {b.device_type} ({b.speedup:.2f}x)" for b in interim)
        raise ConfigError(run, "--unconfirmed", f"not re-measured on fresh seeds (the run stopped before its "
                          f"finals): {names}; resume the run, or export them with --unconfirmed")
    request = ExportRequest(best, rows, run_dir.path, Path(output) if output else None)
    try:
        text = render(fmt, request)
    except ExportError as exc:
        raise ConfigError(output if exc.option == "--output" and output else run, exc.option, str(exc)) from None
    except NothingToExport as exc:
        click.echo(f"{run}: {exc}", err=True)  # said, not an error: and no empty file written
        return
    if fmt in WRITES_FOLDER:
        click.echo(text, err=True)
    elif output:
        _write_output(output, text)
    else:
        click.echo(text, nl=not text.endswith("\n"))


# -- portability: evaluate, compare, report (issue 6) ------------------------------------------
@main.command()
@click.argument("sources", nargs=-1, required=True, type=click.Path())
@click.option("--config", type=click.Path(dir_okay=False),
              help="The run config of the configurations' targets (default: the first run directory's).")
@click.option("--runs", type=click.IntRange(min=1),
              help="Program runs per configuration (default: measure.final_runs).")
@click.option("--address", help="Ray cluster to join (auto, HOST:PORT, ray://...); default: a local instance.")
@click.option("--output-dir", type=click.Path(file_okay=False), help="Where the run directory goes (overrides).")
@click.option("--progress/--no-progress", default=None, help="Progress bars (default: when stderr is a terminal).")
@click.option("--unsandboxed", is_flag=True,
              help="Run candidates without the sandbox where it cannot start (recorded in meta.json).")
@_one_line_errors
def evaluate(sources: tuple[str, ...], config: str | None, runs: int | None, address: str | None,
             output_dir: str | None, progress: bool | None, unsandboxed: bool) -> None:
    """Measure the configurations of SOURCES (run directories: their winners; export files from
    warpfleet export --format json or yaml) on the devices at hand, with the baseline measured again."""
    from cluster.engine.evaluate import Evaluation, create_run_dir, plan_for

    plan, origins = plan_for(list(sources), config)
    _check_output_dir(plan, output_dir)
    policy = _isolate(plan, unsandboxed)
    _join_ray(plan, address)
    with _blamed_on(output_dir, "--output-dir"):
        run_dir = create_run_dir(plan, origins, list(sources), output_dir)
    _record_sandbox(run_dir, policy)
    click.echo(f"run directory: {run_dir.path}", err=True)
    with _resume_hint(None, run_dir.path):
        show_progress = sys.stderr.isatty() if progress is None else progress
        summary = Evaluation(plan, origins, run_dir, runs).run(address, show_progress)
    click.echo(f"{summary.rows} rows written to {run_dir.results}", err=True)
    # compare reads run directories: an export file's configurations are listed in this run's meta.json
    runs_given = [s for s in sources if Path(s).is_dir()]
    click.echo(f"compare: warpfleet compare {' '.join([*runs_given, str(run_dir.path)])}", err=True)



@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--arch", "archs", multiple=True, callback=lambda ctx, param, value: _archs(value),
              help="Also compile each configuration for this arch (sm_80): ptxas's registers, spills and "
              "shared memory where no GPU of it is at hand. Repeatable.")
@click.option("--config", type=click.Path(dir_okay=False),
              help="The run config of the targets, for compiling (default: each run's).")
@click.option("--compile/--no-compile", "compile_missing", default=True, show_default=True,
              help="Compile configurations for archs no run built them for.")
@_one_line_errors
def compare(runs: tuple[str, ...], fmt: str, output: str | None, archs: tuple[str, ...], config: str | None,
            compile_missing: bool) -> None:
    """The portability matrix per target over RUNS: each configuration tuned on one device type,
    measured on another, as a share of that one's own best; and the best worst case."""
    from cluster.outputs.compare import add_resources, build_matrices, host_targets, load_run_dir, load_targets
    from cluster.outputs.compare_text import to_json, to_markdown

    loaded = [load_run_dir(run) for run in runs]
    if archs and (hosts := host_targets(loaded)):
        named = ", ".join(f"{target} ({toolchain})" for target, toolchain in hosts.items())
        click.echo(f"note: --arch {', '.join(archs)}: ignored for {named}: built for the host's CPU, "
                   "not for a GPU arch", err=True)
    targets, problems = load_targets(loaded, config) if compile_missing else ({}, [])
    for problem in problems:
        click.echo(problem, err=True)
    matrices = [add_resources(m, loaded, archs, targets if compile_missing else None) for m in build_matrices(loaded)]
    text = to_json(matrices) if fmt == "json" else to_markdown(matrices)
    if output:
        _write_output(output, text)
    else:
        click.echo(text, nl=False)


def _write_output(output: str, text: str) -> None:
    """``--output FILE``: written whole or not at all, into a folder that exists (as ``cp`` does: a
    typo in a folder's name must not send a result somewhere new); a place that cannot be written is
    one line."""
    from cluster.store.rundir import write_atomic

    path = Path(output)
    if not path.parent.is_dir():
        raise ConfigError(output, "--output", f"no folder {path.parent} to write it in (make it first)")
    try:
        write_atomic(path, text.encode())
    except OSError as exc:
        raise ConfigError(output, "--output", f"cannot be written ({exc.strerror or exc})") from None
    click.echo(f"wrote {output}", err=True)



def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):  # FloatRange lets nan through, and inf has no bound
        raise click.BadParameter(f"{value} is not a finite number of seconds")
    return value


def _archs(values: tuple[str, ...]) -> tuple[str, ...]:
    import re

    for arch in values:
        if not re.fullmatch(r"sm_\d+[a-z]?", arch):
            raise click.BadParameter(f"{arch!r}: an arch is sm_ and a compute capability's digits (sm_80, sm_90a)")
    return values



@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--output", type=click.Path(file_okay=False), help="The report's folder (default: FIRST_RUN/report).")
@_one_line_errors
def report(runs: tuple[str, ...], output: str | None) -> None:
    """An HTML report (self-contained) and markdown with PNG plots of RUNS: speedups, portability,
    search progress, time against energy, parameter importance."""
    from cluster.outputs.report import write_report

    out = Path(output) if output else Path(runs[0]) / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(out, "--output", f"cannot be written ({exc.strerror})") from None
    page, markdown = write_report(list(runs), out)
    click.echo(f"wrote {page} and {markdown}", err=True)


@main.command("kt-import")
@click.argument("script", type=click.Path(dir_okay=False, exists=True))
@click.option("--output", required=True, type=click.Path(dir_okay=False),
              help="The target file to write; the kernel source and any .npy inputs go beside it.")
@click.option("--name", help="The target's name (default: the kernel's).")
@click.option("--inputs", type=click.Choice(["uniform", "npy"]), default="uniform", show_default=True,
              help="Float input arrays: seeded uniform over the script's range (fresh each run), or its values (.npy).")
@click.option("--outputs", help="Comma-separated arguments to compare (default: the script's answer).")
@click.option("--params-only", is_flag=True, help="Search the params alone, no compiler flags (as Kernel Tuner).")
@_one_line_errors
def kt_import(script: str, output: str, name: str | None, inputs: str, outputs: str | None, params_only: bool) -> None:
    """A kernel target from a Kernel Tuner script (the arguments of its first tune_kernel call)."""
    from cluster.config import load_target
    from cluster.config.kt_import import KtImportError
    from cluster.config.kt_import import kt_import as convert

    try:
        imported = convert(Path(script), Path(output), name, inputs, [o for o in (outputs or "").split(",") if o],
                           params_only)
    except KtImportError as exc:
        raise ConfigError(script, "", str(exc)) from None
    except OSError as exc:  # the script ran: what failed is writing the target or what goes beside it
        where = f" ({exc.filename})" if exc.filename and exc.filename != output else ""
        raise ConfigError(output, "--output", f"cannot be written{where}: {exc.strerror or exc}") from None
    for note in imported.notes:
        click.echo(f"note: {script}: {note}", err=True)
    target = load_target(output)  # what was written must load as it is
    click.echo(f"wrote {output}: kernel {target.spec.kernel.name if target.spec.kernel else ''}, "
               f"{target.space_size()} configurations", err=True)


# -- the sandbox (issue 16) ---------------------------------------------------------------------
def _isolate(plan: RunPlan, unsandboxed: bool) -> Any:
    """The run's sandbox policy, made this process's and its Ray workers'. Where the sandbox cannot
    start here, a one-line error, unless ``--unsandboxed``."""
    from cluster.sandbox.isolation import Policy, start_bubblewrap
    from cluster.sandbox.sandbox import SandboxError

    out_of_sight = (str(Path(plan.config.output_dir).resolve()),)  # the runs: references, others' outputs
    if unsandboxed:
        click.echo("warning: --unsandboxed: candidates run with this user's rights, files and network", err=True)
        policy = Policy("off", plan.config.sandbox)
    else:
        try:
            start_bubblewrap(plan.config.sandbox)
        except SandboxError as exc:
            raise ConfigError(plan.file, "sandbox", f"cannot start on this node: {exc}; `warpfleet doctor` says "
                              "more, --unsandboxed runs without it") from None
        policy = Policy("bwrap", plan.config.sandbox, out_of_sight)
    policy.install()
    return policy


def _record_sandbox(run_dir: Any, policy: Any) -> None:
    """meta.json says how this invocation isolated candidates, and whether any ever ran unsandboxed."""
    unsandboxed = run_dir.read_meta().get("unsandboxed", False) or policy.mode == "off"
    run_dir.update_meta(sandbox={"mode": policy.mode, **policy.spec.model_dump()}, unsandboxed=unsandboxed)


@main.command()
@click.option("--config", type=click.Path(dir_okay=False), help="A run config whose sandbox: section to check.")
@click.option("--gpu/--no-gpu", default=None, help="Check the GPU in the sandbox (default: where /dev/nvidia* is).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: each check and whether the sandbox works.")
@_one_line_errors
def doctor(config: str | None, gpu: bool | None, as_json: bool) -> None:
    """Whether the sandbox works on this node, and why not: exit status 0 if it does, else 1."""
    from cluster.compile.build import HARNESS_INCLUDE
    from cluster.config import SandboxSpec
    from cluster.sandbox.doctor import diagnose

    spec = load_run(config).config.sandbox if config else SandboxSpec()
    checks = diagnose(spec, HARNESS_INCLUDE / "warpfleet" / "harness.cuh", gpu)
    works = all(check.ok is not False for check in checks)
    if as_json:
        _echo_json({"works": works, "checks": [dataclasses.asdict(check) for check in checks]})
        sys.exit(0 if works else 1)
    for check in checks:
        click.echo(check.line())
    click.echo("the sandbox works here" if works else "the sandbox does not work here: sweeps refuse to run "
               "unless given --unsandboxed")
    sys.exit(0 if works else 1)


if __name__ == "__main__":
    main()
