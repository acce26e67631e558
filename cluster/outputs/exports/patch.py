"""``patch``: the unified diff (``git apply``-able) of each winner built from an agent's variant."""

from __future__ import annotations

from cluster.outputs.exports._base import ExportRequest
from cluster.store.variants import winner_patches


def patch(request: ExportRequest) -> str:
    return winner_patches(request.run_dir, list(request.best))
