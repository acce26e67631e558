"""Compile stage: a candidate's sources and flags become a binary (on any CPU of the cluster)."""

from __future__ import annotations

import time
from pathlib import Path

from cluster.compile.kernel import compile_kernel
from cluster.config import Target
from cluster.core.placeholders import expand
from cluster.core.types import BuildArtifact, Candidate, Status
from cluster.sandbox.isolation import node_sandbox
from cluster.sandbox.sandbox import Sandbox, read_output, run_command, scratch_dir, write_bundle
from cluster.sandbox.untrusted_dir import UntrustedDir
from cluster.toolchains import get_toolchain

BINARY_NAME = "candidate.bin"
HARNESS_INCLUDE = Path(__file__).parent / "include"  # warpfleet/harness.cuh, the timing harness
ENTRY_POINTS = HARNESS_INCLUDE / "warpfleet"  # wf_entry.cpp and wf_entry.c, for shared-library builds
FLUSH_KERNEL = "wf_l2_flush"  # the harness's L2-flush kernel: not the target's, kept out of reports and profiles


def build_command(target: Target, candidate: Candidate, workdir: Path) -> list[str]:
    toolchain = get_toolchain(target.spec.toolchain)
    template = target.spec.build or list(toolchain.default_build)
    shared = candidate.runner == "persistent"  # a shared library for the persistent runner's host
    values = {
        **{name: value for name, value in candidate.params},
        "flags": [*toolchain.report_flags, *candidate.flag_argv, *(toolchain.shared_flags if shared else ())],
        "defines": candidate.defines,
        "arch": candidate.arch,
        "binary": str(workdir / BINARY_NAME),
        "sources": [*target.compiled_sources, *([str(ENTRY_POINTS / toolchain.entry_source)] if shared else [])],
        "workdir": str(workdir),
        "harness_include": [f"-I{HARNESS_INCLUDE}"],
    }
    return expand(template, values)


def compile_candidate(target: Target, candidate: Candidate, scratch_root: Path | None = None,
                      sandbox: Sandbox | None = None) -> BuildArtifact:
    """Build one candidate in its own scratch directory, inside ``sandbox`` (default: the node's,
    ``cluster.sandbox.isolation.node_sandbox``): failures come back as a status."""
    if target.spec.kind == "kernel":  # one kernel to a cubin, with its launch (build/kernel.py)
        return compile_kernel(target, candidate, scratch_root, sandbox)
    start = time.perf_counter()
    with scratch_dir(scratch_root, f"build-{candidate.key}-") as workdir:
        write_bundle(target.bundle.files, workdir)
        argv = build_command(target, candidate, workdir)
        result = run_command(argv, workdir, timeout=target.spec.timeouts.build,
                             limits=target.spec.limits.for_build(), sandbox=sandbox or node_sandbox(gpu=False))
        seconds = time.perf_counter() - start
        if not result.ok:
            status = Status.COMPILE_TIMEOUT if result.timed_out else Status.COMPILE_ERROR
            return BuildArtifact(candidate.key, status, compile_s=seconds, error_tail=result.tail())
        with UntrustedDir(workdir) as files:
            content = read_output(files, BINARY_NAME)  # never through a link to a file of the worker's
        if content is None:
            return BuildArtifact(candidate.key, Status.COMPILE_ERROR, compile_s=seconds,
                                 error_tail=f"the build command wrote no {{binary}}: {' '.join(argv)}")
        kernels = get_toolchain(target.spec.toolchain).parse_resources(result.stderr + "\n" + result.stdout)
        # The timing harness's L2-flush kernel is not the target's: keep it out of the report.
        kernels = tuple(k for k in kernels if FLUSH_KERNEL not in k.kernel)
        return BuildArtifact(candidate.key, Status.OK, content, seconds, kernels=kernels,
                             binary_hash=BuildArtifact.hash_binary(content))
