"""warpfleet's device clock: what the GPU did in a run, recorded by CUPTI, whatever the program prints.

    GPU worker ─► DeviceClock.on_node() (builds wf_device_clock.c against the node's CUPTI, once)
        process run:    CUDA_INJECTION64_PATH=lib, WARPFLEET_DEVICE_RECORD=SCRATCH/.warpfleet.device
        persistent run: the host loads lib at its start; after each candidate it writes the record
    ─► read(files) ─► DeviceRecord (busy_s: the union of the intervals; kernel_s: of the kernels')
    ─► Clock.device_s, Clock.kernel_s ─► clock.py

A program's own timer can be made to time nothing (the work on a ``cudaStreamNonBlocking`` stream
that its events on the legacy stream do not wait for) or its words can lie; the device's record of
its kernels, copies and memsets cannot be changed by either. The busy time is the union of their
intervals, not their sum, so that work really overlapped on streams still shows as a saving.

What it cannot see: a program that attacks the record in its own process (the injected library
runs there: writing the record file itself, or tampering with the library's memory); GPU work by a
process that does not initialise CUDA through the driver it injects into. Where the node has no
CUPTI, or the build fails, there is no device record and the wall clock judges alone
(``on_node`` logs why, once).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.core.types import DeviceRecord
from cluster.sandbox.untrusted_dir import UntrustedDir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("wf_device_clock.c")
INJECTION_ENV = "CUDA_INJECTION64_PATH"  # the driver loads this library at cuInit
RECORD_ENV = "WARPFLEET_DEVICE_RECORD"  # where the library writes a process's record at exit
RECORD_FILE = ".warpfleet.device"  # in the run's scratch directory
HEADER = "wf-device-record 1"
KINDS = {"K": "kernel", "C": "copy", "S": "memset"}


def busy_seconds(intervals: Iterable[tuple[int, int]]) -> float:
    """Seconds covered by the union of ``[start, end)`` intervals in ns: overlapping work counts once."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total * 1e-9


def parse_record(text: str) -> DeviceRecord:
    """The record file's content (``wf_device_clock.c``'s format) as a ``DeviceRecord``; a record
    begun and never ended (the process skipped its exit handlers) is ``complete=False``. Raises
    ``ValueError`` on anything else: it is not the library's."""
    lines = text.splitlines()
    if not lines or lines[0] != HEADER:
        raise ValueError("not a device record (no header)")
    intervals: list[tuple[int, int]] = []
    kernels: list[tuple[int, int]] = []
    ended = None
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if len(fields) == 2 and fields[0] == "end" and ended is None:
            ended = int(fields[1])
        elif len(fields) == 3 and fields[0] in KINDS and ended is None:
            intervals.append((int(fields[1]), int(fields[2])))
            if fields[0] == "K":
                kernels.append(intervals[-1])
        else:
            raise ValueError(f"line {number} of the device record is not the library's: {line[:80]!r}")
    if ended is not None and ended != len(intervals):
        raise ValueError(f"the device record says {ended} records and holds {len(intervals)}")
    span = (max(end for _, end in kernels) - min(start for start, _ in kernels)) * 1e-9 if kernels else None
    return DeviceRecord(busy_seconds(intervals), len(intervals), complete=ended is not None,
                        kernel_s=busy_seconds(kernels), span_s=span)


@dataclass(frozen=True)
class DeviceClock:
    """The built injection library of a GPU node, and how runs use it."""

    library: Path

    def process_env(self, workdir: Path) -> dict[str, str]:
        """A process run's variables: the library injected, its record written in the scratch directory."""
        return {INJECTION_ENV: str(self.library), RECORD_ENV: str(workdir / RECORD_FILE)}

    def host_env(self) -> dict[str, str]:
        """A persistent host's: the library injected; the host writes each candidate's record."""
        return {INJECTION_ENV: str(self.library)}

    @staticmethod
    def forget(files: UntrustedDir) -> None:
        """Remove an earlier run's record before a run, so that a run without one is seen as such."""
        files.remove(RECORD_FILE)

    @staticmethod
    def read(files: UntrustedDir) -> DeviceRecord | None:
        """The run's record from its scratch directory (never through a link); None where the run
        made none (it never initialised CUDA). A record that is not the library's reads as
        incomplete: a run that tampered with it has no record to be judged by."""
        try:
            text = files.read(RECORD_FILE, limit=256 * 1024 * 1024).decode(errors="replace")
        except FileNotFoundError:
            return None
        except OSError:
            return DeviceRecord(0.0, 0, complete=False)
        try:
            return parse_record(text)
        except ValueError:
            return DeviceRecord(0.0, 0, complete=False)

    @staticmethod
    @functools.cache
    def on_node() -> DeviceClock | None:
        """This node's device clock, built on first use; None (logged once) where it cannot be."""
        library, why = build_library()
        if library is None:
            log.warning("no device clock on this node (%s): GPU runs are judged by the wall clock alone", why)
            return None
        return DeviceClock(library)


def cupti_places(roots: Sequence[Path] | None = None) -> tuple[list[Path], Path | None]:
    """Include folders (CUPTI's and the CUDA driver API's headers) and the libcupti to link, found
    in the CUDA toolkit (``CUDA_HOME``, ``CUDA_PATH``, nvcc's, ``/usr/local/cuda``: ``include``,
    ``extras/CUPTI``) and in NVIDIA's pip packages on the search path (``nvidia/cu13``,
    ``nvidia/cuda_cupti``, ...)."""
    roots = list(roots) if roots is not None else _roots()
    includes: list[Path] = []
    library = None
    for root in roots:
        for sub in ("include", "extras/CUPTI/include"):
            folder = root / sub
            if ((folder / "cupti.h").is_file() or (folder / "cuda.h").is_file()) and folder not in includes:
                includes.append(folder)
        for sub in ("lib64", "lib", "extras/CUPTI/lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            found = sorted((root / sub).glob("libcupti.so*")) if (root / sub).is_dir() else []
            if found and library is None:
                library = found[0]
    if not any((i / "cupti.h").is_file() for i in includes) or not any((i / "cuda.h").is_file() for i in includes):
        return includes, None
    return includes, library


def _roots() -> list[Path]:
    roots = [Path(os.environ[name]) for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parents[1])
    roots += [Path("/usr/local/cuda")]
    for entry in sys.path:
        nvidia = Path(entry or ".") / "nvidia"
        if nvidia.is_dir():
            roots += sorted(p for p in nvidia.iterdir() if p.is_dir() and p.name.startswith(("cu", "cuda_cupti")))
    return list(dict.fromkeys(r.resolve() for r in roots if r.is_dir()))


def build_library(into: Path | None = None) -> tuple[Path | None, str]:
    """``wf_device_clock.c`` built against the node's CUPTI (cached by the source and the CUPTI it
    links): the library's path, or None and why not."""
    includes, cupti = cupti_places()
    if cupti is None:
        return None, "CUPTI's headers or libcupti not found in the CUDA toolkit nor NVIDIA's pip packages"
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc) to build the injection library"
    into = into or SOURCE.parent / ".build"
    key = hashlib.sha256(SOURCE.read_bytes() + str(cupti).encode() + str(includes).encode()).hexdigest()[:16]
    library = into / f"libwf_device_clock-{key}.so"
    if library.is_file():
        return library, ""
    try:
        into.mkdir(parents=True, exist_ok=True)
        partial = into / f".{library.name}.{os.getpid()}"
        argv = [compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE),
                *(f"-I{i}" for i in includes), str(cupti), f"-Wl,-rpath,{cupti.parent}", "-lpthread"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return None, f"the injection library did not build: {done.stderr.strip()[-400:]}"
        partial.chmod(0o755)
        os.replace(partial, library)  # whole or not at all, whichever worker builds it first
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"the injection library could not be built in {into}: {exc}"
    return library, ""
