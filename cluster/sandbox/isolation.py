"""Which sandbox a node runs candidates in: the one place that reads how warpfleet was told to
isolate them, and what keeps secrets out of the processes that run candidates.

    warpfleet sweep [--unsandboxed] ─► Policy (mode + the run config's ``sandbox:`` section)
        ─► WARPFLEET_SANDBOX, in the driver's environment and every Ray worker's (``ray_env_vars``)
        ─► node_sandbox(), wherever a candidate is built or run

Modes: ``bwrap``, what a sweep uses (a node where bubblewrap cannot start fails every command, with
the reason); ``off``, what ``--unsandboxed`` asks for; ``auto``, where nothing was said (library
use, tests, scripts): bubblewrap where it works, else none.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cluster.config import SandboxSpec
from cluster.core.limits import Limits
from cluster.platform import node_platform
from cluster.sandbox.bwrap import Bubblewrap, Program, sandbox_uid
from cluster.sandbox.cgroups import Cgroups
from cluster.sandbox.sandbox import (
    Prepared,
    ProcessResult,
    Sandbox,
    SandboxError,
    Unsandboxed,
    run_command,
    scratch_dir,
    scrubbed_env,
)

ENV_POLICY = "WARPFLEET_SANDBOX"  # the policy, JSON, set by the driver for every process of a sweep
ENV_BWRAP = "WARPFLEET_BWRAP"  # the bwrap program, where the config does not name one
ENV_SCRATCH = "WARPFLEET_SCRATCH"  # where a node's scratch directories go
Mode = Literal["auto", "bwrap", "off"]


@dataclass(frozen=True)
class Policy:
    """How candidates are isolated in a sweep."""

    mode: Mode = "auto"
    spec: SandboxSpec = field(default_factory=SandboxSpec)
    # Folders no candidate may see (the runs' output directory): an empty tmpfs over each in the sandbox.
    out_of_sight: tuple[str, ...] = ()

    def encode(self) -> str:
        return json.dumps({"mode": self.mode, "spec": self.spec.model_dump(), "out_of_sight": list(self.out_of_sight)},
                          sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> Policy:
        data = json.loads(text)
        return cls(data["mode"], SandboxSpec.model_validate(data["spec"]), tuple(data.get("out_of_sight", ())))

    @classmethod
    def current(cls) -> Policy:
        """What this process was told (``WARPFLEET_SANDBOX``), else ``auto`` with the defaults."""
        text = os.environ.get(ENV_POLICY)
        return cls.decode(text) if text else cls()

    def install(self) -> None:
        """Make this the policy of this process and of the Ray workers it starts."""
        os.environ[ENV_POLICY] = self.encode()


class Refused(Sandbox):
    """Where the sandbox was required and cannot start: every command fails, saying why."""

    name = "refused"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def prepare(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], limits: Limits | None,
                gpu: bool = False, writable: Sequence[Path] = ()) -> Prepared:
        raise SandboxError(f"the sandbox cannot start on this node: {self.reason} "
                           "(`warpfleet doctor` says more; --unsandboxed runs without it)")


def node_sandbox(gpu: bool | None = None) -> Sandbox:
    """The sandbox of this process's commands. ``gpu``: bind the GPU platform's device nodes (None:
    where the node has them). Made once per process and policy."""
    if gpu is None:
        gpu = node_platform().present()
    return _sandbox_for(os.environ.get(ENV_POLICY, ""), os.environ.get(ENV_BWRAP), gpu)


@functools.cache
def _sandbox_for(encoded: str, bwrap: str | None, gpu: bool) -> Sandbox:
    policy = Policy.decode(encoded) if encoded else Policy()
    if policy.mode == "off":
        return Unsandboxed(policy.spec.env)
    try:
        return start_bubblewrap(policy.spec, gpu, bwrap, policy.out_of_sight)
    except SandboxError as exc:
        return Unsandboxed(policy.spec.env) if policy.mode == "auto" else Refused(str(exc))


def start_bubblewrap(spec: SandboxSpec, gpu: bool = False, bwrap: str | None = None,
                     out_of_sight: Sequence[str | Path] = ()) -> Bubblewrap:
    """This node's bubblewrap sandbox, tried on a trivial command; ``SandboxError`` says why not.
    ``out_of_sight``: folders its commands must not see (``Policy.out_of_sight``)."""
    program = Program.find(spec.bwrap or bwrap or os.environ.get(ENV_BWRAP))
    token = os.environ.get("RAY_AUTH_TOKEN_PATH")
    sandbox = Bubblewrap(program, spec, gpu, Cgroups.detect(), sandbox_uid(), hidden=[Path(token)] if token else [],
                         out_of_sight=[Path(p) for p in out_of_sight])
    result = trial(sandbox, ["true"])
    if not result.ok:
        lines = [line for line in result.tail().splitlines() if line.strip()]
        raise SandboxError(f"bubblewrap cannot start a command here ({'; '.join(lines[-2:])})")
    return sandbox


def trial(sandbox: Sandbox, argv: Sequence[str], timeout: float = 30, gpu: bool = False) -> ProcessResult:
    """``argv`` in ``sandbox``, in a scratch directory of this node's."""
    with scratch_dir(scratch_root(), "sandbox-trial-") as workdir:
        return run_command(argv, workdir, timeout, limits=Limits(file_mb=64, disk_mb=64), sandbox=sandbox, gpu=gpu)


def scratch_root() -> Path | None:
    """Where scratch directories go on this node (``WARPFLEET_SCRATCH``; default: the temporary directory)."""
    root = os.environ.get(ENV_SCRATCH)
    return Path(root) if root else None


# -- secrets out of the processes that run candidates --------------------------------------------

def _secret_names(env: Mapping[str, str]) -> list[str]:
    """The variables that look like secrets, but Ray's own (``RAY_AUTH_TOKEN``: Ray needs it, and
    no command in the sandbox can read a worker's environment)."""
    kept = scrubbed_env(env)
    return [name for name in env if name not in kept and not name.startswith("RAY_")]


def ray_env_vars() -> dict[str, str]:
    """Variables for the runtime environment of a sweep's Ray workers: the sandbox policy, and
    every secret-looking variable of the driver blanked (on nodes that have them too)."""
    return {**dict.fromkeys(_secret_names(os.environ), ""), ENV_POLICY: Policy.current().encode()}


@contextlib.contextmanager
def secrets_withheld() -> Iterator[None]:
    """This process's secret-looking variables out of its environment for a while: the processes
    of a local Ray instance started meanwhile never hold them (the LLM key stays in the driver)."""
    held = {name: os.environ.pop(name) for name in _secret_names(os.environ)}
    try:
        yield
    finally:
        os.environ.update(held)


def protect_ray_token() -> list[Path]:
    """Ray writes ``~/.ray/auth_token`` readable by all (0644): make it, and the token file that
    ``RAY_AUTH_TOKEN_PATH`` names, the owner's only. Returns the files changed."""
    changed = []
    token_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    for path in (Path.home() / ".ray" / "auth_token", *([Path(token_path)] if token_path else [])):
        with contextlib.suppress(OSError):
            if path.is_file() and path.stat().st_mode & 0o077:
                path.chmod(0o600)
                changed.append(path)
    with contextlib.suppress(OSError):
        (Path.home() / ".ray").chmod(0o700)
    return changed
