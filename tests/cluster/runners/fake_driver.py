"""A stand-in for ``cuda.bindings.driver`` on the CPU, for the kernel runner's tests: device memory
in bytearrays, modules whose "cubin" names a Python function, events that report 1 ms (or
``elapsed_ms()``). Only the calls
cluster/runners/kernel.py makes, with the same signatures and (status, value...) returns."""

from __future__ import annotations

import ctypes
import types
from collections.abc import Callable
from typing import Any

import numpy as np

ILLEGAL_ADDRESS = 700
ERRORS = {ILLEGAL_ADDRESS: b"CUDA_ERROR_ILLEGAL_ADDRESS", 500: b"CUDA_ERROR_NOT_FOUND"}


class FakeDriver(types.ModuleType):
    """``kernels`` maps a cubin's bytes to {lowered name: fn(memory, grid, block, args)}."""

    CUdevice_attribute = types.SimpleNamespace(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE=1,
                                               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT=2)
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self, kernels: dict[bytes, dict[str, Callable[..., int]]]) -> None:
        super().__init__("cuda.bindings.driver")
        self.kernels = kernels
        self.memory: dict[int, bytearray] = {}
        self.next_pointer = 1 << 20
        self.calls: list[str] = []
        self.launches: list[tuple] = []
        self.broken = False
        self.elapsed_ms: Callable[[], float] = lambda: 1.0  # what each timed launch reports

    def _ok(self, name: str, *values: Any) -> tuple:
        self.calls.append(name)
        return (ILLEGAL_ADDRESS if self.broken else 0, *values)

    def cuGetErrorName(self, status: int) -> tuple:
        return 0, ERRORS.get(int(status), b"CUDA_ERROR_UNKNOWN")

    def cuInit(self, flags: int) -> tuple:
        return self._ok("cuInit")

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return self._ok("cuDeviceGet", 0)

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple:
        return self._ok("cuDevicePrimaryCtxRetain", "context")

    def cuCtxSetCurrent(self, context: Any) -> tuple:
        return self._ok("cuCtxSetCurrent")

    def cuStreamCreate(self, flags: int) -> tuple:
        return self._ok("cuStreamCreate", "stream")

    def cuEventCreate(self, flags: int) -> tuple:
        return self._ok("cuEventCreate", "event")

    def cuDeviceGetAttribute(self, attribute: int, device: int) -> tuple:
        return self._ok("cuDeviceGetAttribute", {1: 1 << 20, 2: 4}[attribute])

    def cuMemAlloc(self, size: int) -> tuple:
        pointer = self.next_pointer
        self.next_pointer += (size + 4095) // 4096 * 4096 + 4096
        self.memory[pointer] = bytearray(size)
        return self._ok("cuMemAlloc", pointer)

    def cuMemFree(self, pointer: int) -> tuple:
        del self.memory[pointer]
        return self._ok("cuMemFree")

    def cuMemsetD8(self, pointer: int, value: int, count: int) -> tuple:
        self.memory[pointer][:count] = bytes([value]) * count
        return self._ok("cuMemsetD8")

    def cuMemsetD8Async(self, pointer: int, value: int, count: int, stream: Any) -> tuple:
        self.memory[pointer][:count] = bytes([value]) * count
        return self._ok("cuMemsetD8Async")

    def cuMemcpyHtoDAsync(self, pointer: int, host: int, count: int, stream: Any) -> tuple:
        self.memory[pointer][:count] = ctypes.string_at(host, count)
        return self._ok("cuMemcpyHtoD")

    def cuMemcpyDtoH(self, host: int, pointer: int, count: int) -> tuple:
        ctypes.memmove(host, bytes(self.memory[pointer][:count]), count)
        return self._ok("cuMemcpyDtoH")

    def cuModuleLoadData(self, image: bytes) -> tuple:
        key = bytes(image).rstrip(b"\0")
        module = {"wf_l2_flush": lambda *a: 0} if key.lstrip().startswith(b".version") else self.kernels[key]
        return self._ok("cuModuleLoadData", module)

    def cuModuleUnload(self, module: Any) -> tuple:
        return self._ok("cuModuleUnload")

    def cuModuleGetFunction(self, module: dict, name: bytes) -> tuple:
        if name.decode() not in module:
            return (500, None)
        return self._ok("cuModuleGetFunction", module[name.decode()])

    def cuModuleGetGlobal(self, module: dict, name: bytes) -> tuple:
        pointer = self.cuMemAlloc(64)[1]
        return self._ok("cuModuleGetGlobal", pointer, 64)

    def cuFuncSetAttribute(self, function: Any, attribute: int, value: int) -> tuple:
        return self._ok("cuFuncSetAttribute")

    def cuLaunchKernel(self, function: Callable[..., int], gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                       shared: int, stream: Any, params: int, extra: int) -> tuple:
        self.launches.append(((gx, gy, gz), (bx, by, bz), shared))
        result = self._ok("cuLaunchKernel")  # the launch itself succeeds; its fault shows at the next sync
        if function(self, (gx, gy, gz), (bx, by, bz), params):
            self.broken = True  # sticky, as an illegal address is
        return result

    def cuEventRecord(self, event: Any, stream: Any) -> tuple:
        return self._ok("cuEventRecord")

    def cuEventSynchronize(self, event: Any) -> tuple:
        return self._ok("cuEventSynchronize")

    def cuStreamSynchronize(self, stream: Any) -> tuple:
        return self._ok("cuStreamSynchronize")

    def cuEventElapsedTime(self, start: Any, stop: Any) -> tuple:
        return self._ok("cuEventElapsedTime", self.elapsed_ms())

    # -- for the fake kernels: their arguments from the kernelParams array ----------------------

    def array(self, params: int, index: int, dtype: str, count: int) -> np.ndarray:
        """Argument ``index`` (a device pointer) as a NumPy view of the fake device memory."""
        slot = ctypes.c_uint64.from_address(params + 8 * index).value
        pointer = ctypes.c_uint64.from_address(slot).value
        return np.frombuffer(self.memory[pointer], dtype=dtype, count=count)

    @staticmethod
    def scalar(params: int, index: int, ctype: type) -> Any:
        slot = ctypes.c_uint64.from_address(params + 8 * index).value
        return ctype.from_address(slot).value
