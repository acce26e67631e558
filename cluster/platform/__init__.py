"""The machine a worker runs on: its GPU platform (``_base.Platform``, NVIDIA's in ``nvidia``) and its
devices (``devices``).

    node_platform() ─► the registered platform (cluster.core.registry.PLATFORMS) whose devices this
                       node has; else the first registered, whose answers on a node without a GPU are empty
"""

from __future__ import annotations

import functools

from cluster.core.registry import PLATFORMS
from cluster.platform._base import Platform

__all__ = ["Platform", "node_platform"]


@functools.cache
def node_platform() -> Platform:
    """This node's GPU platform, made once per process."""
    platforms = [PLATFORMS.load(name)() for name in PLATFORMS]
    return next((p for p in platforms if p.present()), platforms[0])
