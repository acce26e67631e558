"""The kernel runner: a kernel target's candidates measured inside the device's host process.

    KernelRunner.execute ─► HostProcess.call({"loader": "kernel", ...}) ═══► call_kernel(request):
        cuModuleLoadData(cubin) ─► arguments (allocated once per layout, filled from the seed)
        ─► warm-up ─► batches of samples (each: L2 flush, event, launch, event), one wait a batch
        ─► the stopping rule, racing against the study's best (kernel_harness.bench) ─► the protocol lines
        ─► outputs checked against the baseline's in the host (KernelRunner), else to <name>.bin
        ─► cuModuleUnload

The host (cluster/sandbox/host.py) keeps the CUDA context and this module's device state between
candidates: the stream, the events, the L2-flush buffer and the argument buffers. A launch that
breaks the context (an illegal address) fails its request; the host then finds the context broken
and exits, and the client starts a fresh one for the next candidate (the row says crashed).
ncu and compute-sanitizer run the same code as a process of its own:
``python -m cluster.sandbox.host once request.json``, the request written to the staged directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cluster.compile.kernel import KernelBinary
from cluster.config.kernel import BenchOptions, LaunchPlan
from cluster.core.compare import compare
from cluster.core.types import RunOutputs
from cluster.runners._base import BINARY_FILE, POISON_ENV, HostRunner, Invocation, Staged
from cluster.runners.kernel_harness import bench, capped_options, host_values, profile_options, write_output
from cluster.sandbox.host import STDERR_FILE, STDOUT_FILE, host_python
from cluster.sandbox.sandbox import ProcessResult, run_command

REQUEST_FILE = "request.json"
PROFILE_ENV = "WARPFLEET_PROFILE"
_HOST_ENV = {POISON_ENV, PROFILE_ENV}  # variables the host run takes as request fields
LAYOUTS_KEPT = 2  # argument buffer sets kept allocated (one per problem shape)
INPUTS_KEPT = 8  # host-side uniform input arrays kept (per dtype, shape, bounds, seed and place in the stream)
REFERENCES_KEPT = 8  # baseline outputs kept for comparing in the host (one set per study and seed)
VERIFIED_FILE = ".warpfleet.verified"  # {output file: reference token} of the outputs that matched in the host
REFERENCE_PREFIX = ".warpfleet.reference."  # a reference's bytes, handed to the host once

# The harness's L2 flush (harness.cuh: a read of 2x the L2) as PTX, so that the host needs no
# compiler: nvcc -ptx of wf_l2_flush, set to PTX ISA 7.0 / sm_70 so that any recent driver JITs it.
FLUSH_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry wf_l2_flush(.param .u64 p0, .param .u64 p1, .param .u64 p2)
{
  .reg .pred %p<4>; .reg .b32 %r<23>; .reg .b64 %rd<17>;
  ld.param.u64 %rd7, [p0]; ld.param.u64 %rd8, [p1]; ld.param.u64 %rd9, [p2];
  mov.u32 %r5, %ctaid.x; mov.u32 %r6, %ntid.x; cvt.u64.u32 %rd1, %r6; mul.wide.u32 %rd10, %r5, %r6;
  mov.u32 %r7, %tid.x; cvt.u64.u32 %rd11, %r7; add.s64 %rd16, %rd10, %rd11;
  setp.ge.u64 %p1, %rd16, %rd8; mov.u32 %r22, 0;
  @%p1 bra DONE;
  mov.u32 %r9, %nctaid.x; cvt.u64.u32 %rd12, %r9; mul.lo.s64 %rd3, %rd12, %rd1; cvta.to.global.u64 %rd4, %rd7;
LOOP:
  shl.b64 %rd13, %rd16, 4; add.s64 %rd14, %rd4, %rd13;
  ld.global.nc.v4.u32 {%r10, %r11, %r12, %r13}, [%rd14];
  xor.b32 %r18, %r11, %r22; xor.b32 %r19, %r18, %r10; xor.b32 %r20, %r19, %r12; xor.b32 %r22, %r20, %r13;
  add.s64 %rd16, %rd16, %rd3; setp.lt.u64 %p2, %rd16, %rd8;
  @%p2 bra LOOP;
DONE:
  setp.eq.s32 %p3, %r22, 0;
  @%p3 bra END;
  cvta.to.global.u64 %rd15, %rd9; st.global.u32 [%rd15], %r22;
END:
  ret;
}
"""


class CudaError(RuntimeError):
    """A driver call that failed: the call and the error's name (CUDA_ERROR_ILLEGAL_ADDRESS)."""


def _check(result: Any, call: str) -> Any:
    from cuda.bindings import driver

    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        name = driver.cuGetErrorName(status)[1]
        raise CudaError(f"{call}: {name.decode() if isinstance(name, bytes) else status}")
    return values[0] if len(values) == 1 else tuple(values)


class _Device:
    """The host's device state, made at the first request and kept for the host's life."""

    def __init__(self) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        _check(cu.cuInit(0), "cuInit")
        self.device = _check(cu.cuDeviceGet(0), "cuDeviceGet")
        self.context = _check(cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = _check(cu.cuStreamCreate(0), "cuStreamCreate")
        self.events: list[tuple[Any, Any]] = []  # (start, stop) per sample of a batch, made as batches grow
        attr = cu.CUdevice_attribute
        l2, sms = (_check(cu.cuDeviceGetAttribute(a, self.device), "cuDeviceGetAttribute") for a in
                   (attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT))
        flush_bytes = 2 * max(int(l2), 1 << 20)  # 2x: L2 is not a perfect LRU
        self.flush_data = _check(cu.cuMemAlloc(flush_bytes), "cuMemAlloc")
        self.flush_sink = _check(cu.cuMemAlloc(4), "cuMemAlloc")
        _check(cu.cuMemsetD8(self.flush_data, 0, flush_bytes), "cuMemsetD8")
        self.flush_module = _check(cu.cuModuleLoadData(FLUSH_PTX + b"\0"), "cuModuleLoadData(flush)")  # PTX: a C string
        self.flush_function = _check(cu.cuModuleGetFunction(self.flush_module, b"wf_l2_flush"), "cuModuleGetFunction")
        self.flush_args = np.array([int(self.flush_data), flush_bytes // 16, int(self.flush_sink)], dtype=np.uint64)
        self.flush_params = _params(self.flush_args[i:i + 1] for i in range(3))
        self.flush_blocks = 8 * int(sms)
        self.layouts: OrderedDict[tuple, dict[str, tuple[Any, int]]] = OrderedDict()
        self.inputs = _Kept(INPUTS_KEPT)
        self.references: OrderedDict[str, np.ndarray] = OrderedDict()  # (token, file) -> the values
        self.outputs: dict[tuple, np.ndarray] = {}  # host buffers the outputs are copied into, reused

    def reference(self, check: Mapping[str, Any], workdir: Path) -> np.ndarray | None:
        """The reference values a check names: kept from an earlier request, else read from the file
        the worker handed over (then kept); None when the host has neither (the worker compares)."""
        key = f"{check['token']}/{check['path']}"
        if key in self.references:
            self.references.move_to_end(key)
            return self.references[key]
        if not check.get("file"):
            return None
        values = np.fromfile(workdir / check["file"], dtype=check["dtype"])
        while len(self.references) >= REFERENCES_KEPT:
            self.references.popitem(last=False)
        self.references[key] = values
        return values

    def output_buffer(self, name: str, like: np.ndarray) -> np.ndarray:
        key = (name, like.dtype.str, like.shape)
        if key not in self.outputs:
            if len(self.outputs) >= 4 * LAYOUTS_KEPT:
                self.outputs.clear()
            self.outputs[key] = np.empty_like(like)
        return self.outputs[key]

    def buffers(self, plan: LaunchPlan, values: Mapping[str, np.ndarray]) -> dict[str, tuple[Any, int]]:
        """Device buffers for the plan's arrays, allocated once per layout (names, dtypes, shapes)."""
        layout = tuple((a.name, a.dtype, values[a.name].shape) for a in plan.arguments if a.fill != "scalar")
        if layout in self.layouts:
            self.layouts.move_to_end(layout)
            return self.layouts[layout]
        while len(self.layouts) >= LAYOUTS_KEPT:
            for pointer, _ in self.layouts.popitem(last=False)[1].values():
                self.cu.cuMemFree(pointer)
        made = {}
        for name, _, _ in layout:
            size = max(values[name].nbytes, 1)
            made[name] = (_check(self.cu.cuMemAlloc(size), "cuMemAlloc"), values[name].nbytes)
        self.layouts[layout] = made
        return made

    def host_values(self, plan: LaunchPlan, seed: int, workdir: Path) -> dict[str, np.ndarray]:
        """The run's initial values, its uniform arrays kept a few at a time: generating 2^24 floats
        (0.5 s) costs more than measuring most kernels, and a param that sizes only an output (a
        reduction's partial sums) must not generate the input again."""
        return host_values(plan, seed, workdir, self.inputs)

    def event_pairs(self, count: int) -> list[tuple[Any, Any]]:
        while len(self.events) < count:
            self.events.append((_check(self.cu.cuEventCreate(0), "cuEventCreate"),
                                _check(self.cu.cuEventCreate(0), "cuEventCreate")))
        return self.events[:count]

    def flush(self) -> None:
        _check(self.cu.cuLaunchKernel(self.flush_function, self.flush_blocks, 1, 1, 256, 1, 1, 0, self.stream,
                                      self.flush_params.ctypes.data, 0), "cuLaunchKernel(flush)")


def _params(storage: Any) -> np.ndarray:
    """The ``void**`` array cuLaunchKernel takes: one pointer to each argument's storage."""
    return np.array([s.ctypes.data for s in storage], dtype=np.uint64)


_DEVICE: _Device | None = None


def device() -> _Device:
    global _DEVICE
    if _DEVICE is None:
        _DEVICE = _Device()
    return _DEVICE


def call_kernel(request: Mapping[str, Any]) -> int:
    """In the host (or a process of its own): one run of a kernel candidate; the exit status."""
    try:
        return run_kernel(request)
    except (CudaError, ValueError) as exc:  # a driver call that failed, a binary that is not one
        sys.stdout.flush()
        sys.stderr.write(f"wf: {exc}\n")
        sys.stderr.flush()
        return 2  # as WF_CHECK exits


def run_kernel(request: Mapping[str, Any]) -> int:
    binary = KernelBinary.unpack(Path(request["binary"]).read_bytes())
    dev = device()
    cu = dev.cu
    workdir = Path(request.get("cwd") or os.getcwd())
    plan = binary.plan
    options = BenchOptions(**request.get("bench", {}))
    if request.get("profile"):
        options = profile_options(options)
    elif request.get("max_samples"):
        options = capped_options(options, int(request["max_samples"]))
    values = dev.host_values(plan, int(request.get("seed", 0)), workdir)
    module = _check(cu.cuModuleLoadData(binary.cubin), "cuModuleLoadData")
    try:
        function = _check(cu.cuModuleGetFunction(module, binary.lowered_name.encode()), "cuModuleGetFunction")
        if plan.shared_mem > 48 * 1024:  # above 48 KiB a kernel must opt in
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(cu.cuFuncSetAttribute(function, attr, plan.shared_mem), "cuFuncSetAttribute")
        buffers = dev.buffers(plan, values)
        for arg in plan.arguments:
            if arg.name in buffers:
                pointer, size = buffers[arg.name]
                _check(cu.cuMemcpyHtoDAsync(pointer, values[arg.name].ctypes.data, size, dev.stream), "cuMemcpyHtoD")
        for symbol in plan.constants:
            pointer, size = _check(cu.cuModuleGetGlobal(module, symbol.name.encode()), "cuModuleGetGlobal")
            data = values[symbol.name]
            if data.nbytes > size:
                raise CudaError(f"__constant__ {symbol.name}: {data.nbytes} bytes given, the symbol holds {size}")
            _check(cu.cuMemcpyHtoDAsync(pointer, data.ctypes.data, data.nbytes, dev.stream), "cuMemcpyHtoD")
        storage = [np.array([int(buffers[a.name][0])], dtype=np.uint64) if a.name in buffers else values[a.name]
                   for a in plan.arguments]
        params = _params(storage)
        poison = [buffers[a.name] for a in plan.arguments if a.output] if request.get("poison") else []

        def poison_outputs() -> None:  # the guardrails' check: outputs NaN before every launch, untimed
            for pointer, size in poison:
                _check(cu.cuMemsetD8Async(pointer, 0xFF, size, dev.stream), "cuMemsetD8Async")

        def launch() -> None:
            _check(cu.cuLaunchKernel(function, *plan.grid, *plan.block, plan.shared_mem, dev.stream,
                                     params.ctypes.data, 0), "cuLaunchKernel")

        def sample_batch(count: int) -> list[float]:
            """As wf::bench, ``count`` times back to back: poison, flush (which also covers the
            enqueue), events around one launch; then one wait, for the last."""
            pairs = dev.event_pairs(count)
            for start, stop in pairs:
                poison_outputs()
                if options.flush_l2:
                    dev.flush()
                _check(cu.cuEventRecord(start, dev.stream), "cuEventRecord")
                launch()
                _check(cu.cuEventRecord(stop, dev.stream), "cuEventRecord")
            _check(cu.cuEventSynchronize(pairs[-1][1]), "cuEventSynchronize")
            return [float(_check(cu.cuEventElapsedTime(start, stop), "cuEventElapsedTime")) for start, stop in pairs]

        for _ in range(options.warmup):
            poison_outputs()
            launch()
        _check(cu.cuStreamSynchronize(dev.stream), "cuStreamSynchronize")
        stop_above = None if request.get("profile") else request.get("stop_above_ms")
        bench(options, sample_batch, _write_stdout, stop_above)
        verified = {}
        checks = request.get("verify") or {}
        for arg in plan.arguments:
            if arg.output:
                out = dev.output_buffer(arg.name, values[arg.name])
                _check(cu.cuMemcpyDtoH(out.ctypes.data, buffers[arg.name][0], out.nbytes), "cuMemcpyDtoH")
                check = checks.get(arg.output_file)
                if check and _matches(dev, check, arg, out, workdir):
                    verified[arg.output_file] = check["token"]
                else:
                    write_output(workdir, arg, out)  # the baseline's, or one the worker compares itself
        (workdir / VERIFIED_FILE).write_text(json.dumps(verified))
        return 0
    finally:
        cu.cuModuleUnload(module)  # fails on a broken context: the host is about to end anyway


class _Kept(OrderedDict):
    """The last ``size`` entries used: an LRU mapping for ``kernel_harness.host_values``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


def _matches(dev: _Device, check: Mapping[str, Any], arg: Any, out: np.ndarray, workdir: Path) -> bool:
    """Whether an output matches the baseline's by the worker's own rule (core.compare), in
    the host: no file written and read back. False also where the host lacks the reference."""
    want = dev.reference(check, workdir)
    if want is None:
        return False
    got = np.array([np.sum(out, dtype=np.float64)]) if arg.compare == "sum" else out.reshape(-1)
    if got.dtype != want.dtype:
        return False
    return compare(arg.output_file, got, want, check["rtol"], check["atol"]) is None


def _write_stdout(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()  # a crash keeps the samples taken so far


class KernelRunner(HostRunner):
    """Runs kernel candidates in the worker's host process; a profiler or sanitizer in front, or
    variables the host run does not know, run them as a process of their own.

    A run given the baseline's outputs (``Invocation.reference``) is checked in the host: each
    reference goes to the host once (a file in the staged directory, named by its token) and stays
    there; an output that matches is written nowhere, and the host says so in ``VERIFIED_FILE``.
    The host runs no code of the candidate's on the CPU (the cubin runs on the GPU), so its verdict
    is the worker's own rule applied where the output already is."""

    name = "kernel"
    samples_are_warpfleets = True  # its host times the cubin's launches with its own events
    isolates_runs = False  # a cubin writes no file; the references handed to the host stay

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: set[str] = set()  # (token/file) the running host was given
        self.host_starts = self.host.starts

    def request(self, staged: Staged, invocation: Invocation) -> dict[str, Any]:
        kernel = staged.target.spec.kernel
        assert kernel is not None, "the kernel runner runs kernel targets"
        env = invocation.env
        request = {"loader": "kernel", "binary": str(staged.workdir / BINARY_FILE), "seed": invocation.seed,
                   "bench": kernel.bench.model_dump(), "poison": _on(env.get(POISON_ENV)),
                   "profile": _on(env.get(PROFILE_ENV)), "cwd": str(staged.workdir),
                   "stop_above_ms": invocation.stop_above, "max_samples": invocation.max_samples,
                   "stdout": str(staged.workdir / STDOUT_FILE), "stderr": str(staged.workdir / STDERR_FILE)}
        if invocation.reference is not None:
            request["verify"] = self._checks(staged, invocation.reference)
        return request

    def _checks(self, staged: Staged, reference: RunOutputs) -> dict[str, dict[str, Any]]:
        verify, files = staged.target.spec.verify, dict(reference.files)
        checks = {}
        for spec in verify.outputs:
            if spec.is_text or spec.path not in files:
                continue
            check = {"token": reference.token, "path": spec.path, "dtype": spec.dtype, "file": None,
                     "rtol": verify.rtol if spec.rtol is None else spec.rtol,
                     "atol": verify.atol if spec.atol is None else spec.atol}
            if f"{reference.token}/{spec.path}" not in self.handed:
                check["file"] = REFERENCE_PREFIX + spec.path
                staged.files.write(check["file"], files[spec.path])  # afresh: never through a link left there
            checks[spec.path] = check
        return checks

    def execute(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        if invocation.command == "test":
            return super().run_process(staged, invocation)  # the target's own test command
        if invocation.wrapper or set(invocation.env) - _HOST_ENV:
            return self.run_process(staged, invocation)
        spec = staged.target.spec
        timeout = invocation.timeout if invocation.timeout is not None else spec.timeouts.run
        staged.files.remove(VERIFIED_FILE)
        try:
            request = self.request(staged, invocation)
        except OSError as exc:  # a reference's name held a folder: the staged directory was tampered with
            return ProcessResult(None, "", "", 0.0, refused=str(exc))
        result = self.call(staged, request, timeout)
        if self.host.starts != self.host_starts:  # a fresh host: it keeps nothing it was given
            self.handed.clear()
            self.host_starts = self.host.starts
        if result.ok:
            self.handed.update(f"{c['token']}/{c['path']}" for c in request.get("verify", {}).values() if c["file"])
        return result

    def verified_outputs(self, staged: Staged, reference: RunOutputs) -> frozenset[str]:
        try:
            verdict = json.loads(staged.files.read(VERIFIED_FILE))
        except (OSError, ValueError):
            return frozenset()
        return frozenset(path for path, token in verdict.items() if token == reference.token)

    def binary_argv(self, workdir: Path) -> list[str]:
        return host_python("-m", "cluster.sandbox.host", "once", str(workdir / REQUEST_FILE))

    def run_process(self, staged: Staged, invocation: Invocation) -> ProcessResult:
        """The run as ``[wrapper...] python -m cluster.sandbox.host once request.json`` in the staged
        directory, under the target's limits and the sandbox."""
        if invocation.command == "test":
            return super().run_process(staged, invocation)
        request = self.request(staged, dataclasses.replace(invocation, reference=None))  # a process keeps nothing
        try:
            staged.files.write(REQUEST_FILE, json.dumps(request).encode())
        except OSError as exc:
            return ProcessResult(None, "", "", 0.0, refused=str(exc))
        spec = staged.target.spec
        timeout = invocation.timeout if invocation.timeout is not None else spec.timeouts.run
        return run_command([*invocation.wrapper, *self.binary_argv(staged.workdir)], staged.workdir, timeout,
                           own_env=invocation.env, limits=spec.limits.for_run(), sandbox=self.sandbox)


def _on(value: str | None) -> bool:
    return bool(value) and value != "0"

