"""Export formats, one module each, registered in ``cluster.core.registry.EXPORT_FORMATS``:
flags, json, yaml, header (text), cmake, t4 (Kernel Tuner's results format), patch (a variant
winner's diff) and bundle (all of them per arch, in a folder)."""

from cluster.outputs.exports._base import (
    WHOLE_STUDIES,
    WRITES_FOLDER,
    ExportError,
    ExportRequest,
    NothingToExport,
    render,
)

__all__ = ["WHOLE_STUDIES", "WRITES_FOLDER", "ExportError", "ExportRequest", "NothingToExport", "render"]
