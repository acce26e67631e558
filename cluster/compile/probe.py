"""``warpfleet validate --build``: does each tunable param reach the program?

A param is passed as ``-DNAME=value``. A source that defines NAME itself without an ``#ifndef NAME``
guard overrides it (the compiler warns about a redefinition, or says nothing when it is defined
after use), and a search over it measures one program many times. Here the baseline is built, then
for each param the build with one other value; a param whose build is byte-identical to the
baseline's is reported.

nvcc names its temporary files ``tmpxft_<pid>_<counter>`` and that name lands in the host object,
so two builds of one source differ there: it is masked before comparing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from cluster.compile.build import compile_candidate
from cluster.config import Target
from cluster.core.types import BuildArtifact, Candidate, Phase, Scalar, Status
from cluster.toolchains import get_toolchain

NVCC_TEMP_NAME = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}")


def masked(binary: bytes) -> bytes:
    """The binary with what differs between two builds of one source (nvcc's temp names) masked."""
    return NVCC_TEMP_NAME.sub(b"tmpxft_", binary)


def _candidate(target: Target, arch: str, params: dict[str, Scalar]) -> Candidate:
    return Candidate(target.name, target.spec.toolchain, "validate --build", arch, target.bundle.hash,
                     tuple(target.baseline_flags.items()), tuple(params.items()), Phase.BASELINE)


def _other_value(target: Target, name: str) -> Scalar | None:
    """A value of ``name`` other than the baseline's, within the constraints if one is."""
    base = target.baseline_params
    others = [v for v in target.spec.params[name] if v != base[name]]
    return next((v for v in others if target.satisfies({**base, name: v})), others[0] if others else None)


def _failure(artifact: BuildArtifact) -> str:
    """The status and the compiler's own error line (``tiny.c:8:45: error: expected expression``),
    not the tail's last line, which for gcc and nvcc is the caret under the source line quoted."""
    lines = [line.strip() for line in artifact.error_tail.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    shown = errors[0] if errors else next((line for line in reversed(lines) if re.search(r"\w", line)), "")
    return f"{artifact.status.value}" + (f": {shown[:200]}" if shown else "")


_ERROR_LINE = re.compile(r"\b(error|fatal error)\b", re.IGNORECASE)


def probe_params(target: Target, arch: str = "sm_90") -> Iterator[str]:
    """One line per param (a ``warning:`` line for one that does not change the binary), after the
    baseline's build; one warning line when the baseline does not build."""
    arch = arch if get_toolchain(target.spec.toolchain).device_kind == "gpu" else "host"
    others = {name: value for name in target.spec.params if (value := _other_value(target, name)) is not None}
    builds = [target.baseline_params] + [{**target.baseline_params, name: v} for name, v in others.items()]
    with ThreadPoolExecutor(max_workers=4) as pool:
        artifacts = list(pool.map(lambda params: compile_candidate(target, _candidate(target, arch, params)), builds))
    baseline, *rest = artifacts
    if baseline.status is not Status.OK or baseline.binary is None:
        yield f"warning: the baseline does not build ({_failure(baseline)})"
        return
    yield f"the baseline builds ({arch})"
    reference = masked(baseline.binary)
    for (name, value), artifact in zip(others.items(), rest, strict=True):
        base = target.baseline_params[name]
        if artifact.status is not Status.OK or artifact.binary is None:
            yield f"warning: {name}={value} does not build ({_failure(artifact)})"
        elif masked(artifact.binary) == reference:
            yield (f"warning: param {name} does not change the binary (-D{name}={value} builds the same bytes as "
                   f"-D{name}={base}): guard its default with #ifndef {name}, or the search over it measures "
                   "one program")
        else:
            yield f"{name}: changes the binary"
