"""The plug-in registries: one per family, each a dict from a name to where its class lives.

A registry names ``"module:attribute"`` rather than holding the class, so that the config (which
sits below the agents and the engine) can validate names without importing the plug-ins: adding
a toolchain, an expert, an export format, a sampler, a runner or a GPU platform is one new module
and one line here. ``Registry.register`` adds one at run time (a class of a user's own).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any


class Registry(Mapping[str, Any]):
    """Names of one plug-in family, resolved to their objects on first use: each entry a
    ``"module:attribute"`` string, or (registered at run time) the object itself."""

    def __init__(self, kind: str, entries: Mapping[str, Any]) -> None:
        self.kind = kind
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Any:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, name: str) -> str:
        """``name`` if registered, else a ValueError naming the known ones (a config's one line)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r} (known: {', '.join(self._entries)})")
        return name

    def load(self, name: str) -> Any:
        """The registered object (a class, usually) of ``name``."""
        return _resolve(self[self.check(name)])

    def register(self, name: str, entry: Any) -> None:
        """Add ``entry`` (a ``"module:attribute"`` string or the object) as ``name``. The same object
        again is a no-op; another under a taken name is a ValueError."""
        taken = self._entries.get(name)
        if taken is not None and _resolve(taken) is not _resolve(entry):
            owner = _resolve(taken)
            raise ValueError(f"{self.kind} name {name!r} is already taken by {getattr(owner, '__qualname__', owner)}")
        self._entries[name] = entry


def _resolve(entry: Any) -> Any:
    if not isinstance(entry, str):
        return entry
    module, _, attribute = entry.partition(":")
    return getattr(importlib.import_module(module), attribute)


# The compilers (cluster/toolchains/): a target's `toolchain:` names one (cluster.toolchains.get_toolchain).
TOOLCHAINS = Registry("toolchain", {
    "nvcc": "cluster.toolchains.nvcc:Nvcc",
    "cc": "cluster.toolchains.cc:Cc",
})


# The rule-based experts of the optimization workflow (agents/experts/), in the order they run.
EXPERTS = Registry("expert", {
    "registers": "agents.experts.registers:RegisterExpert",
    "unroll": "agents.experts.unroll:UnrollExpert",
    "padding": "agents.experts.padding:PaddingExpert",
    "streamify": "agents.experts.streamify:StreamifyExpert",
    "launch_bounds": "agents.experts.launch_bounds:LaunchBoundsExpert",
    "restrict": "agents.experts.restrict:RestrictExpert",
    "vectorize": "agents.experts.vectorize:VectorizeExpert",
    "constant": "agents.experts.constant:ConstantExpert",
    "shared_stage": "agents.experts.shared_stage:SharedStageExpert",
})

# `warpfleet export --format NAME`: each a function (best configs, rows, run dir) -> text (cluster/outputs/exports/).
EXPORT_FORMATS = Registry("export format", {
    "flags": "cluster.outputs.exports.text:flags",
    "json": "cluster.outputs.exports.text:json_text",
    "yaml": "cluster.outputs.exports.text:yaml_text",
    "header": "cluster.outputs.exports.text:header",
    "cmake": "cluster.outputs.exports.cmake:cmake",
    "t4": "cluster.outputs.exports.t4:t4",
    "patch": "cluster.outputs.exports.patch:patch",
    "bundle": "cluster.outputs.exports.bundle:bundle",
    "launch": "cluster.outputs.exports.launch:launch",  # kernel targets: grid, block, shared memory
    "launch-json": "cluster.outputs.exports.launch:launch_json",
})

# search.sampler: each a function (SearchSpec) -> optuna sampler (search_spaces/samplers.py), given
# search.sampler_options.
SAMPLERS = Registry("sampler", {
    "tpe": "search_spaces.samplers:tpe",
    "random": "search_spaces.samplers:random",
    "grid": "search_spaces.samplers:grid",
})

# How a measuring worker runs a target's candidates (cluster/runners/): a target's `runner:` names one
# (the kernel runner: a kernel target's own); each made by ``Runner.for_worker``, with the options it takes.
RUNNERS = Registry("runner", {
    "process": "cluster.runners._base:ProcessRunner",
    "persistent": "cluster.runners.persistent:PersistentRunner",
    "kernel": "cluster.runners.kernel:KernelRunner",  # kind: kernel targets (cluster/runners/kernel.py)
})

# The GPU platforms (cluster/platform/): a vendor's device discovery, telemetry, sandbox device nodes,
# profiler and sanitizer. cluster.platform.node_platform picks the one whose devices a node has.
PLATFORMS = Registry("platform", {
    "nvidia": "cluster.platform.nvidia:Nvidia",
})
