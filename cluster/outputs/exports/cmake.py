"""``cmake``: ``WARPFLEET_<TARGET>_<ARCH>_FLAGS`` and ``_DEFINES`` lists per arch and a function
``warpfleet_tuned(<cmake target> <warpfleet target> <arch>)`` (README, "Exports")."""

from __future__ import annotations

import re

from cluster.core.types import BestConfig
from cluster.outputs.exports._base import ExportError, ExportRequest
from cluster.outputs.exports.text import _macro, _number, _plain, _sorted
from cluster.store.select import noisy_advice


def _cmake_string(value: str) -> str:
    """A quoted CMake argument. ``;`` would split it into a list, so it is refused like a newline."""
    if any(ch in value for ch in "\r\n\0;"):
        raise ValueError(f"{value!r} cannot be a CMake list element")
    return '"' + re.sub(r'([\\"$])', r"\\\1", value) + '"'


def _cmake_key(target: str, arch: str) -> str:
    """What CMake's ``string(MAKE_C_IDENTIFIER)`` and ``TOUPPER`` make of ``<target>_<arch>``."""
    key = _macro(f"{target}_{arch}")
    return f"_{key}" if key[0].isdigit() else key


_CMAKE_FUNCTION = """
# warpfleet_tuned(<cmake target> <warpfleet target> <arch>): one arch's tuned flags and defines.
function(warpfleet_tuned cmake_target warpfleet_target arch)
  string(MAKE_C_IDENTIFIER "${warpfleet_target}_${arch}" key)
  string(TOUPPER "${key}" key)
  if(NOT DEFINED WARPFLEET_${key}_DEFINES)
    message(FATAL_ERROR "warpfleet: no tuned configuration of ${warpfleet_target} for ${arch}")
  endif()
  if(arch MATCHES "^sm_([0-9]+[a-z]?)$")
    set(language CUDA)
    set_property(TARGET ${cmake_target} PROPERTY CUDA_ARCHITECTURES ${CMAKE_MATCH_1})
  else()
    set(language C,CXX)
  endif()
  foreach(option IN LISTS WARPFLEET_${key}_FLAGS)
    target_compile_options(${cmake_target} PRIVATE "$<$<COMPILE_LANGUAGE:${language}>:SHELL:${option}>")
  endforeach()
  target_compile_definitions(${cmake_target} PRIVATE ${WARPFLEET_${key}_DEFINES})
endfunction()
"""


def _cmake(best: list[BestConfig]) -> str:
    lines = ["# The configurations selected by warpfleet. Generated: edit the run, not this file."]
    seen: set[str] = set()
    for config in best:
        key = _cmake_key(config.target, config.arch)
        lines.append(f"# {config.target} on {config.device_type}: {_number(config.speedup)}x the baseline"
                     f" (candidate {config.candidate_key})")
        if config.noisy:
            lines.append(f"# noisy: {noisy_advice([config.arch])}")
        if key in seen:  # H100 and H200 are both sm_90: one configuration per arch
            lines.append(f"# not used: an earlier configuration of {config.target} has arch {config.arch}")
            continue
        seen.add(key)
        options = [option for option in config.flags.values() if option]
        defines = [f"{name}={_plain(value)}" for name, value in config.params.items()]
        lines.append(f"set({' '.join([f'WARPFLEET_{key}_FLAGS', *map(_cmake_string, options)])})")
        lines.append(f"set({' '.join([f'WARPFLEET_{key}_DEFINES', *map(_cmake_string, defines)])})")
    return "\n".join(lines) + "\n" + _CMAKE_FUNCTION


def cmake(request: ExportRequest) -> str:
    try:
        return _cmake(_sorted(request.best))
    except ValueError as exc:
        raise ExportError(str(exc)) from None
