"""The independent timer: one way of timing every configuration that is neither tool's.

Each configuration's kernel text (the one Kernel Tuner compiles, ``spaces.kernel_text``) is built by
nvcc into a cubin with its params as ``-D`` defines (compiles run in parallel, overlapped with the
timing), loaded through CuPy and launched with the geometry of the space definition on the inputs
both tools get. Per sample: an L2 flush (a read of twice the L2), a CUDA event before and after one
launch; the median of the samples. Before timing, the output of one launch must pass the same check
as in the tools (``outputs_match`` against the baseline configuration's output): a configuration
that computes a wrong result is never the optimum.

Used twice: every configuration of every space once (the exhaustive optimum, and the set of
configurations within 1% of it), and at the end each tool's winners again (``remeasure``).
"""

from __future__ import annotations

import os
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scripts.kt_compare.spaces import KernelSpace, config_key, kernel_text

FLUSH_SOURCE = """
extern "C" __global__ void wf_ref_flush(const int4* __restrict__ data, size_t n, int* sink) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const int4 v = data[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc != 0) *sink = acc;
}
"""


def cubin_functions(path: Path) -> list[str]:
    """The function symbols of a cubin (an ELF64 file), read from its symbol table."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 2 or not entsize:  # SHT_SYMTAB
            continue
        strtab_offset = sections[link][4]
        for s in range(size // entsize):
            st_name, st_info = struct.unpack_from("<IB", data, offset + s * entsize)
            if st_info & 0xF == 2:  # STT_FUNC
                end = data.index(b"\0", strtab_offset + st_name)
                names.append(data[strtab_offset + st_name:end].decode())
    return names


def kernel_symbol(path: Path, kernel_name: str) -> str:
    """The kernel's symbol: its name (extern "C") or its C++ mangling, ``_Z<len><name>...``."""
    mangled = f"_Z{len(kernel_name)}{kernel_name}"
    for symbol in cubin_functions(path):
        if symbol == kernel_name or symbol.startswith(mangled):
            return symbol
    raise KeyError(f"{kernel_name} not among the functions of {path.name}")


def compile_cubin(source: Path, out: Path, defines: Mapping[str, int], arch: str) -> str | None:
    """nvcc -cubin; None when it worked, else the end of its output."""
    argv = ["nvcc", "-cubin", f"-arch={arch}", "-std=c++17", *(f"-D{k}={v}" for k, v in defines.items()),
            "-o", str(out), str(source)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return None if result.returncode == 0 else (result.stdout + result.stderr)[-2000:]


@dataclass
class Measured:
    kernel: str
    key: str
    config: dict[str, int]
    status: str  # ok, compile_error, launch_error, wrong_output
    samples: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


class Timer:
    """Times configurations of one space on the current CUDA device (CuPy), one at a time."""

    def __init__(self, space: KernelSpace, workdir: Path, jobs: int) -> None:
        import cupy as cp

        self.cp, self.space, self.workdir = cp, space, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.pool = ThreadPoolExecutor(max(1, jobs))
        device = cp.cuda.Device()
        major, minor = device.compute_capability[:-1], device.compute_capability[-1]
        self.arch = f"sm_{major}{minor}"
        self.source = workdir / f"{space.name}.cu"
        self.source.write_text(kernel_text(space))
        inputs = space.make_inputs(0)
        self.output_index = inputs.output
        self.host_args = inputs.arguments
        self.args = [cp.asarray(a) if hasattr(a, "shape") and a.shape else a for a in inputs.arguments]
        self.cmem = inputs.cmem
        self.reference: Any = None  # the baseline configuration's output
        # A blocking stream: it waits for the copies and fills CuPy makes on the default stream.
        self.stream = cp.cuda.Stream(non_blocking=False)
        self._flush_setup()
        cp.cuda.Device().synchronize()

    def _flush_setup(self) -> None:
        cp = self.cp
        source = self.workdir / "flush.cu"
        source.write_text(FLUSH_SOURCE)
        error = compile_cubin(source, self.workdir / "flush.cubin", {}, self.arch)
        if error:
            raise RuntimeError(f"the L2 flush kernel does not compile: {error}")
        self.flush_fn = cp.RawModule(path=str(self.workdir / "flush.cubin")).get_function("wf_ref_flush")
        l2 = cp.cuda.Device().attributes.get("L2CacheSize", 50 << 20)
        self.flush_n = 2 * max(l2, 1 << 20) // 16
        self.flush_buf = cp.zeros(self.flush_n * 4, dtype=cp.int32)
        self.sink = cp.zeros(1, dtype=cp.int32)
        self.flush_blocks = 8 * cp.cuda.Device().attributes["MultiProcessorCount"]

    def compile_all(self, configs: Sequence[Mapping[str, int]]) -> Iterator[tuple[dict[str, int], Future]]:
        """Start every compile now; yield (config, future of (cubin or None, error)) in order."""
        jobs = []
        for config in configs:
            cubin = self.workdir / f"{config_key(config, self.space.names).replace(',', '_').replace('=', '')}.cubin"
            jobs.append((dict(config), self.pool.submit(self._compile, cubin, dict(config))))
        yield from jobs

    def _compile(self, cubin: Path, config: dict[str, int]) -> tuple[Path | None, str]:
        if cubin.is_file():
            return cubin, ""
        error = compile_cubin(self.source, cubin, config, self.arch)
        return (None, error) if error else (cubin, "")

    def measure(self, config: Mapping[str, int], cubin: Path, samples: int) -> Measured:
        """Check the configuration's output, then time ``samples`` launches."""
        cp, space = self.cp, self.space
        key = config_key(config, space.names)
        try:
            module = cp.RawModule(path=str(cubin))
            fn = module.get_function(kernel_symbol(cubin, space.kernel_name))
            for name, values in self.cmem.items():
                symbol = module.get_global(name)
                cp.ndarray(values.shape, values.dtype, symbol)[...] = cp.asarray(values)
            grid, block = space.grid(config), space.threads(config)
            output = self.args[self.output_index]
            output[...] = 0
            cp.cuda.Device().synchronize()  # the constant memory and the zeroed output are in place
            fn(grid, block, tuple(self.args), stream=self.stream)
            self.stream.synchronize()
            got = cp.asnumpy(output)
        except Exception as exc:  # a launch or load failure is a status, never the end of the block
            return Measured(space.name, key, dict(config), "launch_error", error=str(exc)[-2000:])
        if self.reference is None:
            self.reference = got  # the first configuration measured is the baseline
        elif not space.outputs_match(got, self.reference):
            return Measured(space.name, key, dict(config), "wrong_output")
        return Measured(space.name, key, dict(config), "ok", self._time(fn, grid, block, samples))

    def _time(self, fn: Any, grid: tuple[int, ...], block: tuple[int, ...], samples: int) -> list[float]:
        cp = self.cp
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        fn(grid, block, tuple(self.args), stream=self.stream)  # warm-up
        times = []
        for _ in range(samples):
            flush_args = (self.flush_buf, np.uint64(self.flush_n), self.sink)
            self.flush_fn((self.flush_blocks,), (256,), flush_args, stream=self.stream)
            start.record(self.stream)
            fn(grid, block, tuple(self.args), stream=self.stream)
            stop.record(self.stream)
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        return times

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def exhaustive(space: KernelSpace, workdir: Path, jobs: int, samples: int, refine_top: int,
               refine_samples: int, log: Any = print) -> list[Measured]:
    """Every valid configuration, the baseline first; then the ``refine_top`` fastest again with
    more samples (their samples pooled), since the optimum and the 1% line come from those."""
    configs = space.configs()
    configs.sort(key=lambda c: c != space.defaults)
    timer = Timer(space, workdir, jobs)
    results: dict[str, Measured] = {}
    cubins: dict[str, Path] = {}
    t0 = time.time()
    try:
        for config, future in timer.compile_all(configs):
            cubin, error = future.result()
            key = config_key(config, space.names)
            if cubin is None:
                results[key] = Measured(space.name, key, config, "compile_error", error=error)
                if config == space.defaults:
                    break  # no baseline output: nothing can be checked
                continue
            cubins[key] = cubin
            results[key] = timer.measure(config, cubin, samples)
            if config == space.defaults and results[key].status != "ok":
                break
        ok = sorted((m for m in results.values() if m.status == "ok"), key=lambda m: m.median or 0)
        for m in ok[:refine_top]:
            m.samples += timer.measure(m.config, cubins[m.key], refine_samples).samples
    finally:
        timer.close()
    log(f"reference {space.name}: {len(results)} of {len(configs)} configurations in {time.time() - t0:.1f} s, "
        f"{sum(m.status == 'ok' for m in results.values())} ok")
    return list(results.values())


def remeasure(space: KernelSpace, configs: Sequence[Mapping[str, int]], workdir: Path, jobs: int, rounds: int,
              samples: int) -> list[Measured]:
    """The given configurations again, the baseline first (for the check), in ``rounds`` rounds that
    visit every configuration once each (so a slow drift of the card is shared), samples pooled."""
    wanted = {config_key(c, space.names): dict(c) for c in [space.defaults, *configs]}
    timer = Timer(space, workdir, jobs)
    results: dict[str, Measured] = {}
    try:
        compiled = {config_key(c, space.names): f.result() for c, f in timer.compile_all(list(wanted.values()))}
        for _ in range(rounds):
            for key, config in wanted.items():
                cubin, error = compiled[key]
                if cubin is None:
                    results[key] = Measured(space.name, key, config, "compile_error", error=error)
                    continue
                m = timer.measure(config, cubin, samples)
                if key in results and results[key].status == "ok" and m.status == "ok":
                    results[key].samples += m.samples
                else:
                    results[key] = m
    finally:
        timer.close()
    return list(results.values())


def default_jobs() -> int:
    return max(1, (os.cpu_count() or 2) // 4)


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
