"""compute-sanitizer on a built candidate: memcheck, racecheck, initcheck, synccheck, one run each.

The program runs with ``WARPFLEET_PROFILE=1`` (the harness launches once). A tool that finds an
error exits with ``ERROR_EXIT``; its summary line ("ERROR SUMMARY: 3 errors") and first messages
become the verdict's detail. A run that times out says nothing either way: ``inconclusive``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.config import Target
from cluster.core.types import Candidate
from cluster.platform import node_platform
from cluster.runners._base import Invocation, ProcessRunner, Runner

ERROR_EXIT = 86
_SUMMARY = re.compile(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:errors?|hazards?)[^\n]*")


@dataclass(frozen=True)
class SanitizerResult:
    tool: str
    outcome: str  # clean, errors, timeout, inconclusive (the tool could not run)
    detail: str = ""
    seconds: float = 0.0


def sanitizer_prefix(tool: str, kernels: Sequence[str] = (), launches: int | None = None) -> list[str]:
    """The platform's sanitizer in front of a run (``Platform.sanitizer_prefix``: compute-sanitizer on
    NVIDIA's), checking only ``kernels`` (all where empty) and at most ``launches`` launches."""
    platform = node_platform()
    return [*platform.sanitizer_prefix(tool, ERROR_EXIT), *platform.sanitizer_filters(kernels, launches)]


def sanitizer_command(tool: str, run_argv: list[str]) -> list[str]:
    return [*sanitizer_prefix(tool), *run_argv]


def interpret(tool: str, returncode: int | None, timed_out: bool, output: str) -> SanitizerResult:
    """The verdict from one compute-sanitizer run's exit status and output."""
    if timed_out:
        return SanitizerResult(tool, "timeout", "timed out")
    summaries = _SUMMARY.findall(output)
    errors = sum(int(n) for n in summaries)
    if returncode == ERROR_EXIT or errors:
        first = [line.strip() for line in output.splitlines() if line.startswith("========= ") and
                 ("Invalid" in line or "hazard" in line.lower() or "Uninitialized" in line or "Race" in line
                  or "Barrier" in line or "error" in line.lower())][:3]
        return SanitizerResult(tool, "errors", f"{errors} errors: " + " | ".join(first))
    if returncode != 0:
        tail = " ".join(output.strip().splitlines()[-3:])[:300]
        return SanitizerResult(tool, "inconclusive", f"exit status {returncode}: {tail}")
    return SanitizerResult(tool, "clean", "0 errors")


def sanitize_candidate(target: Target, candidate: Candidate, binary: bytes, tools: tuple[str, ...],
                       timeout: float, runner: Runner | None = None,
                       timeouts: dict[str, float] | None = None, kernels: Sequence[str] = (),
                       launches: int | None = None) -> tuple[SanitizerResult, ...]:
    """Each tool once, on ``verify.sanitize_run`` (default: ``run``), each in a fresh directory;
    ``timeouts`` per tool override ``timeout``; ``kernels`` and ``launches`` bound what it checks."""
    sanitizer = node_platform().sanitizer
    if shutil.which(sanitizer) is None:
        return tuple(SanitizerResult(t, "inconclusive", f"{sanitizer} not found") for t in tools)
    runner = runner or ProcessRunner()
    results = []
    for tool in tools:
        budget = (timeouts or {}).get(tool, timeout)
        with runner.stage(target, dict(candidate.params), candidate.arch, binary, prefix="san-") as staged:
            run = staged.run(Invocation("sanitize_run", wrapper=tuple(sanitizer_prefix(tool, kernels, launches)),
                                        env={"WARPFLEET_PROFILE": "1"}, timeout=budget))
            result = interpret(tool, run.returncode, run.timed_out, run.stdout + "\n" + run.stderr)
            results.append(dataclasses.replace(result, seconds=run.seconds))
    return tuple(results)
