"""Toolchains by name: a target's ``toolchain:`` names one registered in
``cluster.core.registry.TOOLCHAINS``."""

from __future__ import annotations

from cluster.core.registry import TOOLCHAINS
from cluster.toolchains._base import Toolchain
from cluster.toolchains.cc import Cc
from cluster.toolchains.nvcc import Nvcc

__all__ = ["Cc", "Nvcc", "Toolchain", "available_toolchains", "get_toolchain", "register"]


def register(toolchain_cls: type[Toolchain]) -> type[Toolchain]:
    """Make ``toolchain_cls`` available under its ``name``; returns it, so it works as a decorator.

    Registering the same class again is a no-op; another class under a taken name is an error.
    """
    if not (isinstance(toolchain_cls, type) and issubclass(toolchain_cls, Toolchain)):
        raise TypeError(f"{toolchain_cls!r} is not a Toolchain subclass")
    TOOLCHAINS.register(toolchain_cls.name, toolchain_cls)
    return toolchain_cls


def get_toolchain(name: str) -> Toolchain:
    """A new instance of the toolchain registered as ``name``; KeyError naming the known ones."""
    if name not in TOOLCHAINS:
        known = ", ".join(available_toolchains())
        raise KeyError(f"unknown toolchain {name!r} (known: {known})")
    return TOOLCHAINS.load(name)()


def available_toolchains() -> list[str]:
    """Names of the registered toolchains, sorted."""
    return sorted(TOOLCHAINS)
