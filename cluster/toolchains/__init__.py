"""Toolchains by name: the registry that maps a target's ``toolchain:`` to its implementation."""

from __future__ import annotations

from cluster.toolchains._base import Toolchain
from cluster.toolchains.cc import Cc
from cluster.toolchains.nvcc import Nvcc

__all__ = ["Cc", "Nvcc", "Toolchain", "available_toolchains", "get_toolchain", "register"]

_REGISTRY: dict[str, type[Toolchain]] = {}


def register(toolchain_cls: type[Toolchain]) -> type[Toolchain]:
    """Make ``toolchain_cls`` available under its ``name``; returns it, so it works as a decorator.

    Registering the same class again is a no-op; another class under a taken name is an error.
    """
    if not (isinstance(toolchain_cls, type) and issubclass(toolchain_cls, Toolchain)):
        raise TypeError(f"{toolchain_cls!r} is not a Toolchain subclass")
    taken = _REGISTRY.get(toolchain_cls.name)
    if taken is not None and taken is not toolchain_cls:
        raise ValueError(f"toolchain name {toolchain_cls.name!r} is already taken by {taken.__qualname__}")
    _REGISTRY[toolchain_cls.name] = toolchain_cls
    return toolchain_cls


def get_toolchain(name: str) -> Toolchain:
    """A new instance of the toolchain registered as ``name``; KeyError naming the known ones."""
    try:
        toolchain_cls = _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_toolchains())
        raise KeyError(f"unknown toolchain {name!r} (known: {known})") from None
    return toolchain_cls()


def available_toolchains() -> list[str]:
    """Names of the registered toolchains, sorted."""
    return sorted(_REGISTRY)


register(Nvcc)
register(Cc)
