"""``patch``: the unified diff (``git apply``-able) of each winner built from an agent's variant."""

from __future__ import annotations

from cluster.outputs.exports._base import ExportRequest, NothingToExport
from cluster.store.variants import NO_SOURCE_CHANGE, winner_patches


def patch(request: ExportRequest) -> str:
    """Raises NothingToExport when no winner changes a source: an empty patch would look like one."""
    text = winner_patches(request.run_dir, list(request.best))
    if not text:
        raise NothingToExport(f"{NO_SOURCE_CHANGE}: the winners build the targets' own sources; their flags and "
                              "defines are what to export (--format flags, header, cmake)")
    return text
