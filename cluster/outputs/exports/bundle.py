"""A per-architecture bundle: every export of a run's selected configurations in one folder.

    <folder>/
        warpfleet.json, warpfleet.yaml   the configurations as records (exports/text.py)
        warpfleet_tuned.h                the defines, in #if __CUDA_ARCH__ == ... blocks per arch
        warpfleet.cmake                  flags and defines per arch, and warpfleet_tuned()
        flags/<target>/<arch>.txt        the compiler flags and -D defines of one arch, one line
        t4/<target>@<device>.json        each study's results in Kernel Tuner's T4 format

Two device types of one arch (H100 and H200 are both sm_90) get ``<arch>-<device>.txt`` for the
second; the header and the CMake snippet, which select by arch, use the first.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cluster.core.types import BestConfig
from cluster.outputs.exports._base import ExportError, ExportRequest
from cluster.outputs.exports.cmake import _cmake
from cluster.outputs.exports.t4 import t4_document
from cluster.outputs.exports.text import _header, _json, _yaml

FILES = {"warpfleet.json": _json, "warpfleet.yaml": _yaml, "warpfleet_tuned.h": _header, "warpfleet.cmake": _cmake}


def slug(text: str) -> str:
    """A file name part: ``NVIDIA H100 80GB HBM3 (sm_90)`` -> ``NVIDIA-H100-80GB-HBM3-sm_90``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-") or "_"


def write_bundle(best: Sequence[BestConfig], rows: pd.DataFrame, folder: Path) -> list[Path]:
    """Write the bundle of ``best`` (and the T4 documents of its studies' ``rows``) into
    ``folder``; returns the files written. Other files in the folder are left alone."""
    ordered = sorted(best, key=lambda c: (c.target, c.arch, c.device_type))
    texts = {name: render(ordered) for name, render in FILES.items()}  # every ValueError before any write
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        written.append(_write(folder / name, text))
    used: set[Path] = set()
    for config in ordered:
        path = folder / "flags" / slug(config.target) / f"{slug(config.arch)}.txt"
        if path in used:
            path = path.with_name(f"{slug(config.arch)}-{slug(config.device_type)}.txt")
        used.add(path)
        written.append(_write(path, shlex.join([*config.flag_argv, *config.defines]) + "\n"))
    for config in ordered:
        study = rows[(rows["target"] == config.target) & (rows["device_type"] == config.device_type)]
        if len(study):
            document = json.dumps(t4_document(study), indent=1, allow_nan=False) + "\n"
            written.append(_write(folder / "t4" / f"{slug(config.target)}@{slug(config.device_type)}.json", document))
    return written


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def bundle(request: ExportRequest) -> str:
    """Every format per arch into ``request.output``; returns the summary line."""
    output = request.output
    if output is None:
        raise ExportError("a bundle needs a folder to go to", option="--output")
    if output.exists() and not output.is_dir():
        raise ExportError(f"{output} exists and is not a folder", option="--output")
    try:
        written = write_bundle(request.best, request.rows, output)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    except OSError as exc:  # a folder that cannot be made or written
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != output else ""
        raise ExportError(f"cannot be written{where}: {exc.strerror or exc}", option="--output") from None
    return f"wrote {len(written)} files to {output}"
