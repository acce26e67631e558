"""``warpfleet doctor``: whether the sandbox works on this node, and why not.

Each check is one line: bubblewrap (found? its version), user namespaces, the uid commands run as,
the process and memory limits (cgroups or rlimits), a trivial command with every flag, what that
command can see and do, warpfleet's own Python inside it, the toolchains inside the sandbox, and the
GPU (device nodes, a CUDA query inside, whether Nsight Compute may read the counters as a user other
than root).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cluster.config import SandboxSpec
from cluster.platform import node_platform
from cluster.sandbox.bwrap import Bubblewrap, Program, sandbox_uid
from cluster.sandbox.cgroups import Cgroups
from cluster.sandbox.host import host_python
from cluster.sandbox.isolation import ENV_BWRAP, trial
from cluster.sandbox.sandbox import SandboxError

# What a sandboxed command must not manage: each line prints a word only if it got through.
_ESCAPES = r"""
[ "$(id -u)" = 0 ] && echo root
touch /warpfleet-doctor 2>/dev/null && echo write-root
touch "$WF_OUTSIDE" 2>/dev/null && echo write-home
[ "$(ls /proc | grep -c '^[0-9]')" -gt 6 ] && echo host-processes
cat /proc/1/environ 2>/dev/null | tr '\0' '\n' | grep -qiE 'key|token|secret|password' && echo secrets
[ -z "$WF_NETWORK" ] && [ "$(grep -c ':' /proc/net/dev)" -gt 1 ] && echo network
true
"""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: worth knowing, not a failure
    detail: str

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "note"}[self.ok]
        return f"{mark} {self.name}: {self.detail}"


def diagnose(spec: SandboxSpec, header: Path, gpu: bool | None = None) -> list[Check]:
    """Every check, in order; the sandbox works when none failed. ``header``: a file that builds
    include by the worker's path (the timing harness, ``cluster.compile``), to be read inside."""
    try:
        program = Program.find(spec.bwrap or os.environ.get(ENV_BWRAP))
    except SandboxError as exc:
        return [Check("bwrap", False, str(exc)), _user_namespaces(None)]
    version = ".".join(map(str, program.version))
    checks = [Check("bwrap", True, f"{program.path} (bubblewrap {version})")]
    uid = sandbox_uid()
    if uid is None:
        checks += [_user_namespaces(program), Check("uid", True, f"not root: commands run as uid {os.getuid()}, "
                                                    "yours (credentials under ~ are hidden)")]
    else:
        checks.append(Check("uid", True, f"commands run as uid {uid} (this worker's own), through setpriv; "
                            "as root, bubblewrap needs no user namespace"))
    gpu = node_platform().present() if gpu is None else gpu
    try:
        sandbox = Bubblewrap(program, spec, gpu, Cgroups.detect(), uid)
    except SandboxError as exc:
        return [*checks, Check("setpriv", False, str(exc))]
    checks.append(Check("limits", True, sandbox.describe()))
    result = trial(sandbox, ["true"])
    checks.append(Check("trial", result.ok, "a command starts with every flag" if result.ok else result.tail()))
    if not result.ok:
        return checks
    setup = f"WF_OUTSIDE={Path.home() / '.warpfleet-doctor'}; WF_NETWORK={'1' if spec.network else ''}"
    escaped = trial(sandbox, ["sh", "-c", f"{setup}\n{_ESCAPES}"])
    got = escaped.stdout.split()
    checks.append(Check("isolation", not got and escaped.ok,
                        "not root, root read-only, home out of reach, no host process, no secret"
                        + ("" if spec.network else ", no network")
                        if not got else f"got through: {', '.join(got)}"))
    checks.append(_warpfleet(sandbox, header))
    checks += _toolchains(sandbox)
    if gpu:
        checks += _gpu(sandbox)
    return checks


def _user_namespaces(program: Program | None) -> Check:
    """Unprivileged user namespaces (bubblewrap needs them unless it is setuid root)."""
    if program is not None and os.stat(program.path).st_mode & 0o4000:
        return Check("user namespaces", True, "bwrap is setuid root: not needed")
    settings = {"user.max_user_namespaces": "/proc/sys/user/max_user_namespaces",
                "kernel.unprivileged_userns_clone": "/proc/sys/kernel/unprivileged_userns_clone",
                "kernel.apparmor_restrict_unprivileged_userns":
                    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"}
    values = {name: Path(path).read_text().strip() for name, path in settings.items() if Path(path).exists()}
    said = ", ".join(f"{name}={value}" for name, value in values.items()) or "no settings found"
    blocked = (values.get("user.max_user_namespaces") == "0" or values.get("kernel.unprivileged_userns_clone") == "0"
               or values.get("kernel.apparmor_restrict_unprivileged_userns") == "1")
    hint = (" (an AppArmor profile for bwrap, or the sysctl at 0/1, lets bubblewrap make them)" if blocked else "")
    return Check("user namespaces", not blocked, said + hint)


# What the runners' hosts and launchers need inside: this Python, this warpfleet (not another one
# its search path might find) and its packages, and the harness headers that builds include by the
# worker's path, all as the command's uid.
_WARPFLEET = ("import sys, pathlib, cluster, cluster.sandbox.host, cluster.measure.profile; "
              "sys.exit(0 if cluster.__file__ == sys.argv[1] and pathlib.Path(sys.argv[2]).is_file() else 3)")


def _warpfleet(sandbox: Bubblewrap, header: Path) -> Check:
    import cluster

    result = trial(sandbox, host_python("-c", _WARPFLEET, str(cluster.__file__), str(header)))
    if result.ok:
        return Check("warpfleet", True, f"its Python, packages and harness headers are readable inside "
                                        f"({Path(cluster.__file__).parents[1]})")
    lines = [line for line in result.tail().splitlines() if line.strip()]
    why = "; ".join(lines[-2:]) if len(lines) > 1 else f"{Path(cluster.__file__).parents[1]} or {header} not seen"
    return Check("warpfleet", False, f"the runners' Python cannot run it inside: {why}")


def _toolchains(sandbox: Bubblewrap) -> list[Check]:
    out = []
    for tool in ("cc", "nvcc"):
        if shutil.which(tool) is None:
            continue
        result = trial(sandbox, [tool, "--version"])
        first = (result.stdout.strip().splitlines() or [""])[0]
        out.append(Check(tool, result.ok, f"runs in the sandbox ({first})" if result.ok else result.tail()))
    return out


def _gpu(sandbox: Bubblewrap) -> list[Check]:
    platform = node_platform()
    nodes = platform.device_paths()
    out = [Check("GPU nodes", bool(nodes), ", ".join(nodes) or f"no /dev/{platform.name}*")]
    if shutil.which(platform.query[0]):
        result = trial(sandbox, list(platform.query), gpu=True)
        out.append(Check("GPU in the sandbox", result.ok, result.stdout.strip().splitlines()[0] if result.ok
                         else result.tail()))
    note = platform.counters_note()
    if note:
        out.append(Check(platform.profiler, None, note))
    return out
