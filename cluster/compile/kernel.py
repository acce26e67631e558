"""The Builder for kernel targets: one kernel to a cubin, with NVRTC (``cuda.bindings.nvrtc``, in a
compile host of this process's: a Python kept running inside the sandbox) or ``nvcc -cubin`` (a
command in the sandbox), and the launch that goes with it.

    Target (kind: kernel) + Candidate ─► compile_kernel ─► BuildArtifact(binary = KernelBinary bytes)

The candidate's flags (search_spaces/nvcc.yaml: ``-maxrregcount``, fast math, ``-Xptxas`` options)
are passed to either compiler as they are: NVRTC takes nvcc's spelling of each. ptxas reports its
resources (``-Xptxas -v``) in the compile log, read by the nvcc toolchain's ``parse_resources``.

The candidate's source is untrusted (an agent's variant): it is compiled inside the node's sandbox,
like a program's build, so that an ``#include`` of a file outside its folder reads nothing the
sandbox hides. The compile host (``cluster.sandbox.host``, its ``nvrtc`` loader) keeps NVRTC's
speed: one Python start per worker process, not one per compile.

A compile cache keyed by content (the sources, the name expression, every option, the arch and the
compiler's version) keeps each cubin in ``<scratch root>/warpfleet-kernel-cache/``, so that a repeated
sweep or a resume compiles nothing twice on a node. NVRTC was chosen as the default by compile time
per candidate (BENCHMARKS.md: about 5x faster than ``nvcc -cubin`` on the comparison kernels).
"""

from __future__ import annotations

import atexit
import base64
import functools
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.config import Target
from cluster.config.kernel import LaunchPlan, launch_problem
from cluster.core.limits import Limits
from cluster.core.types import BuildArtifact, Candidate, Status
from cluster.sandbox.host import STDERR_FILE, STDOUT_FILE, HostProcess, read_result
from cluster.sandbox.isolation import node_sandbox
from cluster.sandbox.sandbox import Sandbox, owned_suffix, read_output, run_command, scratch_dir, write_bundle
from cluster.sandbox.untrusted_dir import UntrustedDir
from cluster.toolchains import get_toolchain

MAGIC = b"WFKERNEL1\n"
CACHE_DIR = "warpfleet-kernel-cache"
REPORT_OPTIONS = ("-Xptxas", "-v")  # ptxas's resource report, in either compiler's log


@dataclass(frozen=True)
class KernelBinary:
    """What a kernel candidate's build gives the runner: the cubin, the kernel's lowered (mangled)
    name, the launch, and which compiler made it. Packed as MAGIC, a length, a JSON header, the cubin."""

    cubin: bytes
    lowered_name: str
    plan: LaunchPlan
    compiler: str  # "nvrtc 13.0" or "nvcc 13.0.88"

    def pack(self) -> bytes:
        header = json.dumps({"lowered_name": self.lowered_name, "compiler": self.compiler,
                             "plan": self.plan.to_dict()}, sort_keys=True).encode()
        return MAGIC + struct.pack("<I", len(header)) + header + self.cubin

    @classmethod
    def unpack(cls, data: bytes) -> KernelBinary:
        if not data.startswith(MAGIC):
            raise ValueError("not a warpfleet kernel binary")
        (size,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        header = json.loads(data[start:start + size])
        plan = LaunchPlan.from_dict(header["plan"])
        return cls(data[start + size:], header["lowered_name"], plan, header["compiler"])


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    lowered_name: str
    log: str  # the compiler's messages: ptxas's report, warnings


class CompileError(Exception):
    """A candidate that does not compile: the compiler's log (a row's compile_error, never a raise)."""


class CompileTimeout(CompileError):
    """nvcc ran past the target's build timeout."""


# -- the two compilers -------------------------------------------------------------------------

@functools.cache
def nvrtc_version() -> str | None:
    """``nvrtc 13.0``, or None where NVRTC cannot be loaded (no cuda-bindings, no libnvrtc)."""
    try:
        from cuda.bindings import nvrtc

        status, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # ImportError, or the library missing: RuntimeError from cuda-pathfinder
        return None
    return f"nvrtc {major}.{minor}" if int(status) == 0 else None


@functools.cache
def nvcc_version() -> str | None:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"V(\d+\.\d+\.\d+)", out)
    return f"nvcc {found.group(1)}" if found else None


def choose_compiler(wanted: str) -> tuple[str, str]:
    """(compiler, version) for the spec's ``compiler``: auto is NVRTC where it loads, else nvcc."""
    if wanted in ("auto", "nvrtc") and (version := nvrtc_version()):
        return "nvrtc", version
    if wanted == "nvrtc":
        raise CompileError("NVRTC cannot be loaded here: pip install 'warpfleet[kernels]' (cuda-bindings and "
                           "nvidia-cuda-nvrtc), or set kernel.compiler: nvcc")
    version = nvcc_version()
    if version is None:
        raise CompileError("neither NVRTC nor nvcc is available on this node")
    return "nvcc", version


def compile_nvrtc(source: Path, name: str, options: list[str], include_dir: Path) -> Compiled:
    """One translation unit through NVRTC, the kernel found by its name expression."""
    from cuda.bindings import nvrtc

    def check(result: tuple, what: str) -> tuple:
        if int(result[0]) != 0:
            raise CompileError(f"{what}: {nvrtc.nvrtcGetErrorString(result[0])[1].decode()}")
        return result

    _, program = check(nvrtc.nvrtcCreateProgram(source.read_bytes(), source.name.encode(), 0, [], []),
                       "nvrtcCreateProgram")
    try:
        check(nvrtc.nvrtcAddNameExpression(program, name.encode()), "nvrtcAddNameExpression")
        argv = [o.encode() for o in (*options, f"-I{include_dir}")]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(argv), argv)
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.rstrip(b"\0").decode(errors="replace")
        if int(status) != 0:
            raise CompileError(text or nvrtc.nvrtcGetErrorString(status)[1].decode())
        _, lowered = check(nvrtc.nvrtcGetLoweredName(program, name.encode()), "nvrtcGetLoweredName")
        _, size = check(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
        return Compiled(cubin, lowered.decode(), text)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def call_nvrtc(request: dict) -> int:
    """In a compile host (the ``nvrtc`` loader): one compile, its cubin and its name to the request's
    files; a compile error is the exit status 1 and the log on stderr."""
    try:
        compiled = compile_nvrtc(Path(request["source"]), request["name"], list(request["options"]),
                                 Path(request["include_dir"]))
    except CompileError as exc:
        sys.stderr.write(str(exc))
        return 1
    Path(request["cubin"]).write_bytes(compiled.cubin)
    Path(request["result"]).write_text(json.dumps({"lowered_name": compiled.lowered_name, "log": compiled.log}))
    return 0


class _CompileHosts:
    """This process's compile hosts, one per (sandbox, limits): each a Python kept running in the
    sandbox with a folder of its own (under the first scratch root it was asked for), where each
    compile gets a directory. One compile at a time per host; a host whose folder was removed is
    replaced; stopped, and their folders removed, when the process ends."""

    def __init__(self) -> None:
        self.hosts: dict[tuple, tuple[HostProcess, threading.Lock, Path]] = {}
        self.lock = threading.Lock()
        atexit.register(self.close)

    def get(self, sandbox: Sandbox, limits: Limits | None, scratch_root: Path | None
            ) -> tuple[HostProcess, threading.Lock, Path]:
        key = (id(sandbox), limits)
        with self.lock:
            if key in self.hosts and not self.hosts[key][2].is_dir():
                self.hosts.pop(key)[0].stop()
            if key not in self.hosts:
                if scratch_root is not None:
                    scratch_root.mkdir(parents=True, exist_ok=True)
                root = Path(tempfile.mkdtemp(prefix="host-nvrtc-", suffix=owned_suffix(), dir=scratch_root))
                self.hosts[key] = (HostProcess(False, sandbox, root, limits), threading.Lock(), root)
            return self.hosts[key]

    def close(self) -> None:
        with self.lock:
            for host, _, root in self.hosts.values():
                host.stop()
                shutil.rmtree(root, ignore_errors=True)
            self.hosts.clear()


COMPILE_HOSTS = _CompileHosts()


def compile_nvrtc_sandboxed(target: Target, name: str, options: list[str], scratch_root: Path | None, key: str,
                            sandbox: Sandbox) -> Compiled:
    """``compile_nvrtc`` in this process's compile host for ``sandbox``: the target's files staged
    in a directory of the host's, the result read back from files."""
    limits = target.spec.limits.for_build()
    host, lock, root = COMPILE_HOSTS.get(sandbox, limits, scratch_root)
    timeout = target.spec.timeouts.build
    with lock, scratch_dir(root, f"kbuild-{key}-") as workdir:
        write_bundle(target.bundle.files, workdir)  # the kernel's own #includes resolve here
        sandbox.hand_over(workdir)  # the host, running as the sandbox's uid, writes there
        request = {"loader": "nvrtc", "source": str(workdir / target.spec.sources[0]), "name": name,
                   "options": options, "include_dir": str(workdir), "cubin": str(workdir / "wf_kernel.cubin"),
                   "result": str(workdir / "wf_kernel.json"), "cwd": str(workdir),
                   "stdout": str(workdir / STDOUT_FILE), "stderr": str(workdir / STDERR_FILE)}
        with UntrustedDir(workdir) as files:
            result = read_result(files, host.call(request, timeout), limits)  # as a runner's host reads a run
            if result.timed_out:
                raise CompileTimeout(result.tail())
            if not result.ok:
                raise CompileError(result.tail())
            compiled = json.loads(files.read("wf_kernel.json"))
            return Compiled(files.read("wf_kernel.cubin"), compiled["lowered_name"], compiled["log"])


def compile_nvcc(source: str, name: str, options: list[str], workdir: Path, timeout: float,
                 sandbox: Sandbox | None = None, limits: Limits | None = None) -> Compiled:
    """``nvcc -cubin`` of a unit that includes ``source`` (a path in ``workdir``) and, for a template,
    instantiates the kernel (by taking its address); the kernel is the ptxas report's entry of that name."""
    unit = workdir / "wf_kernel_unit.cu"
    instance = f"\nstatic void* const wf_kernel_instance = (void*)&{name};\n" if "<" in name else "\n"
    unit.write_text(f'#include "{source}"{instance}')
    cubin = workdir / "wf_kernel.cubin"
    result = run_command(["nvcc", "-cubin", *options, f"-I{workdir}", "-o", str(cubin), str(unit)], workdir,
                         timeout=timeout, limits=limits, sandbox=sandbox)
    log = result.stderr + result.stdout
    if result.timed_out:
        raise CompileTimeout(result.tail())
    binary = None
    if result.ok:
        with UntrustedDir(workdir) as files:
            binary = read_output(files, cubin.name)
    if binary is None:
        raise CompileError(result.tail() if not result.ok else "nvcc wrote no cubin")
    base = name.partition("<")[0].split("::")[-1]
    entries = list(dict.fromkeys(_ENTRY.findall(log)))
    matching = [e for e in entries if e == base or e.startswith(f"_Z{len(base)}{base}") or f"{len(base)}{base}" in e]
    if len(matching) != 1:
        raise CompileError(f"nvcc -cubin: cannot tell kernel {name!r} among the entries {entries} "
                           f"(kernel.compiler: nvrtc finds it by its name expression)")
    return Compiled(binary, matching[0], log)


# -- the compile cache -------------------------------------------------------------------------

def cache_key(compiler: str, sources: list[tuple[str, bytes]], name: str, options: list[str]) -> str:
    digest = hashlib.sha256()
    for part in (compiler, name, *options):
        digest.update(part.encode() + b"\0")
    for path, content in sorted(sources):
        digest.update(path.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


def cache_dir(scratch_root: Path | None) -> Path:
    return (scratch_root or Path(tempfile.gettempdir())) / CACHE_DIR


def cache_get(folder: Path, key: str) -> Compiled | None:
    try:
        entry = json.loads((folder / f"{key}.json").read_text())
        return Compiled(base64.b64decode(entry["cubin"]), entry["lowered_name"], entry["log"])
    except (OSError, ValueError, KeyError):
        return None


def cache_put(folder: Path, key: str, compiled: Compiled) -> None:
    """Written whole or not at all (a rename), so that a compile task killed midway leaves no half entry."""
    folder.mkdir(parents=True, exist_ok=True)
    entry = {"cubin": base64.b64encode(compiled.cubin).decode(), "lowered_name": compiled.lowered_name,
             "log": compiled.log}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}-")
    with os.fdopen(fd, "w") as fh:
        json.dump(entry, fh)
    os.replace(tmp, folder / f"{key}.json")


# -- the compile stage -------------------------------------------------------------------------

def kernel_options(target: Target, candidate: Candidate, plan: LaunchPlan) -> list[str]:
    """Every option of one candidate's compile: the arch, the flags chosen, the target's own options,
    the params' defines and the launch's (block_size_x, grid_size_x, ...), and the ptxas report."""
    kernel = target.spec.kernel
    assert kernel is not None
    return [f"-arch={candidate.arch}", *candidate.flag_argv, *kernel.compiler_options, *candidate.defines,
            *plan.defines, *REPORT_OPTIONS]


def compile_kernel(target: Target, candidate: Candidate, scratch_root: Path | None = None,
                   sandbox: Sandbox | None = None) -> BuildArtifact:
    """Build one kernel candidate (cached by content) inside ``sandbox`` (default: the node's);
    failures come back as a status."""
    start = time.perf_counter()
    kernel = target.spec.kernel
    assert kernel is not None, "compile_kernel needs a kernel target"

    def failed(status: Status, error: str) -> BuildArtifact:
        return BuildArtifact(candidate.key, status, compile_s=time.perf_counter() - start, error_tail=error[-4000:])

    try:
        plan = kernel.plan(dict(candidate.params))
    except (ValueError, ArithmeticError, TypeError) as exc:
        return failed(Status.COMPILE_ERROR, f"the launch cannot be resolved: {exc}")
    if problem := launch_problem(plan):
        return failed(Status.COMPILE_ERROR, f"the launch cannot run: {problem}")
    try:
        compiler, version = choose_compiler(kernel.compiler)
        options = kernel_options(target, candidate, plan)
        key = cache_key(version, list(target.bundle.files), plan.kernel, options)
        folder = cache_dir(scratch_root)
        compiled = cache_get(folder, key)
        if compiled is None:
            compiled = _compile(target, compiler, plan.kernel, options, scratch_root, candidate.key,
                                sandbox or node_sandbox(gpu=False))
            cache_put(folder, key, compiled)
    except CompileError as exc:
        return failed(Status.COMPILE_TIMEOUT if isinstance(exc, CompileTimeout) else Status.COMPILE_ERROR, str(exc))
    report = get_toolchain(target.spec.toolchain).parse_resources(compiled.log)
    binary = KernelBinary(compiled.cubin, compiled.lowered_name, plan, version).pack()
    return BuildArtifact(candidate.key, Status.OK, binary, time.perf_counter() - start,
                         kernels=tuple(k for k in report if k.kernel == compiled.lowered_name) or report,
                         binary_hash=BuildArtifact.hash_binary(binary))


def _compile(target: Target, compiler: str, name: str, options: list[str], scratch_root: Path | None,
             key: str, sandbox: Sandbox) -> Compiled:
    if compiler == "nvrtc":
        return compile_nvrtc_sandboxed(target, name, options, scratch_root, key, sandbox)
    with scratch_dir(scratch_root, f"kbuild-{key}-") as workdir:
        write_bundle(target.bundle.files, workdir)  # the kernel's own #includes resolve here
        return compile_nvcc(target.spec.sources[0], name, options, workdir, target.spec.timeouts.build, sandbox,
                            target.spec.limits.for_build())
