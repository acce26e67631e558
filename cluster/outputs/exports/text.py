"""The selected configurations as text a build can use.

Formats:

- ``flags``: one line per configuration, the compiler flags then the ``-D`` defines, shell-quoted;
  with several configurations each line follows a ``# <target> on <device_type>`` comment.
- ``json`` / ``yaml``: a list of records, one per configuration.
- ``header``: a C header of ``#define NAME value`` lines. A value is written exactly as the
  ``-DNAME=value`` define that was measured expands (``-DT=float`` is ``#define T float``), so
  including the header reproduces the tuned build. Configurations of one target for different
  archs are chosen by ``__CUDA_ARCH__``; a host configuration is the fallback. With more than one
  target, each target's block is enabled by defining ``WARPFLEET_TARGET_<NAME>`` first, since
  targets may share macro names.
- ``cmake`` (exports/cmake.py): a CMake snippet: ``WARPFLEET_<TARGET>_<ARCH>_FLAGS`` and ``_DEFINES`` lists and a
  function ``warpfleet_tuned(<cmake target> <warpfleet target> <arch>)`` that adds one arch's
  flags (for its language only: CUDA for ``sm_*``, C and C++ for ``host``) and defines to a CMake
  target and, for a GPU arch, sets its ``CUDA_ARCHITECTURES``. A compiler flag applies to a whole
  compilation, so flags that differ per arch need one compilation (one CMake target) per arch.

Configurations are sorted by (target, arch, device_type), so the same input gives the same text.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Sequence
from itertools import groupby
from typing import Any

import yaml

from cluster.core.types import BestConfig
from cluster.outputs.exports._base import ExportError, ExportRequest
from cluster.store.select import noisy_advice


def _plain(value: Any) -> Any:
    """A Python scalar for numpy scalars (selection works on pandas), None for inf/nan."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _sorted(best: Sequence[BestConfig]) -> list[BestConfig]:
    return sorted(best, key=lambda c: (c.target, c.arch, c.device_type, c.candidate_key))


def best_record(config: BestConfig) -> dict[str, Any]:
    """A selected configuration as the json and yaml exports write it (and ``show --json``)."""
    return {
        "target": config.target,
        "device_type": config.device_type,
        "arch": config.arch,
        "toolchain": config.toolchain,
        "candidate_key": config.candidate_key,
        "flags": {name: str(option) for name, option in config.flags.items()},
        "flag_argv": config.flag_argv,
        "params": {name: _plain(value) for name, value in config.params.items()},
        "median": _plain(config.median),
        "iqr": _plain(config.iqr),
        "baseline_median": _plain(config.baseline_median),
        "speedup": _plain(config.speedup),
        "unit": config.unit,
        "reason": config.reason,
        "source_hash": config.source_hash,
        "variant": config.is_variant,  # built from an agent's variant: `warpfleet export --format patch`
        "noisy": config.noisy,  # its re-measurements spread past measure.max_noise: see "noisy_advice"
        **({"noisy_advice": noisy_advice([config.arch])} if config.noisy else {}),
    }


def _flags(best: list[BestConfig]) -> str:
    lines = []
    for config in best:
        if len(best) > 1:
            lines.append(f"# {config.target} on {config.device_type}")
        if config.noisy:
            lines.append(f"# noisy: {noisy_advice([config.arch])}")
        lines.append(shlex.join([*config.flag_argv, *config.defines]))
    return "".join(f"{line}\n" for line in lines)


def _json(best: list[BestConfig]) -> str:
    return json.dumps([best_record(c) for c in best], indent=2, allow_nan=False) + "\n"


def _yaml(best: list[BestConfig]) -> str:
    return yaml.safe_dump([best_record(c) for c in best], sort_keys=False, default_flow_style=False,
                          allow_unicode=True)


def _cuda_arch(arch: str) -> int | None:
    """``__CUDA_ARCH__`` for an arch name: sm_90 -> 900, sm_80 -> 800; None for the host."""
    match = re.fullmatch(r"(?:sm|compute)_(\d+)[a-z]?", arch)
    return int(match[1]) * 10 if match else None


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def _number(value: Any) -> str:
    value = _plain(value)
    return "?" if value is None else f"{value:.4g}"


def _macro(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


def _defines(config: BestConfig) -> list[str]:
    lines = [
        f"/* {_comment(config.target)} on {_comment(config.device_type)}: "
        f"{_number(config.speedup)}x the baseline ({_number(config.median)} vs "
        f"{_number(config.baseline_median)} {_comment(config.unit)})",
        f" * flags: {_comment(shlex.join(config.flag_argv)) or '(none)'}",
        *([f" * noisy: {_comment(noisy_advice([config.arch]))}"] if config.noisy else []),
        f" * candidate {config.candidate_key}{'; ' + _comment(config.reason) if config.reason else ''} */",
    ]
    for name, value in config.params.items():
        text = str(_plain(value))
        if any(ch in text for ch in "\r\n\0"):
            raise ValueError(f"param {name} of {config.target}: {text!r} cannot be a #define value")
        lines.append(f"#define {name} {text}".rstrip())
    return lines


def _target_block(configs: list[BestConfig]) -> list[str]:
    if len(configs) == 1:
        return _defines(configs[0])
    devices = [(arch, c) for c in configs if (arch := _cuda_arch(c.arch)) is not None]
    hosts = [c for c in configs if _cuda_arch(c.arch) is None]
    lines: list[str] = []
    seen: set[int] = set()
    for i, (arch, config) in enumerate(devices):
        keyword = "#if" if i == 0 else "#elif"
        lines.append(f"{keyword} defined(__CUDA_ARCH__) && __CUDA_ARCH__ == {arch}")
        if arch in seen:  # e.g. H100 and H200, both sm_90: the preprocessor cannot tell them apart
            lines.append(f"/* unreachable: an earlier configuration has __CUDA_ARCH__ {arch} */")
        seen.add(arch)
        lines.extend(_defines(config))
    if hosts:
        if devices:
            lines.append("#else")
        lines.extend(_defines(hosts[0]))
        for extra in hosts[1:]:
            lines.append(f"/* not used: {_comment(extra.device_type)} is also a host configuration */")
    if devices:
        lines.append("#endif")
    return lines


def _header(best: list[BestConfig]) -> str:
    targets = [(name, list(group)) for name, group in groupby(best, key=lambda c: c.target)]
    lines = [
        "/* The configurations selected by warpfleet. Generated: edit the run, not this file. */",
        "#ifndef WARPFLEET_TUNED_H",
        "#define WARPFLEET_TUNED_H",
    ]
    for name, configs in targets:
        lines.append("")
        if len(targets) > 1:
            lines.append(f"#ifdef WARPFLEET_TARGET_{_macro(name)}")
        lines.extend(_target_block(configs))
        if len(targets) > 1:
            lines.append(f"#endif /* WARPFLEET_TARGET_{_macro(name)} */")
    lines += ["", "#endif /* WARPFLEET_TUNED_H */"]
    return "\n".join(lines) + "\n"


def flags(request: ExportRequest) -> str:
    return _flags(_sorted(request.best))


def json_text(request: ExportRequest) -> str:
    return _json(_sorted(request.best))


def yaml_text(request: ExportRequest) -> str:
    return _yaml(_sorted(request.best))


def header(request: ExportRequest) -> str:
    """Raises ExportError for a param value a header cannot hold."""
    try:
        return _header(_sorted(request.best))
    except ValueError as exc:
        raise ExportError(str(exc)) from None
