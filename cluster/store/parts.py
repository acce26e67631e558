"""The part files of a run's tables (``results/``, ``profiles/``, ``variants/``, ``reviews/``):
``part-<NNNNNN>-<8 hex>.parquet``, each written whole or not at all, and all of one table's parts
of one schema.

A part is written to a temporary file whose name starts with ``.`` and does not end in
``.parquet`` (readers skip it), fsynced, then renamed into place. When a table's schema widens (an
agent's variant brings params of its own, a resume adds targets, parts of an older version), the
parts already written are rewritten to the wider schema, each the same way, first part first: a
crash midway loses no row, leaves the first parts widest (pandas and pyarrow.dataset take the
first part's schema for all of them), and the next writer (a resume) finishes the rewrite.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_PART = re.compile(r"^part-(\d{6})-[0-9a-f]{8}\.parquet$")
_TEMP_PREFIX = ".part-"  # readers skip names starting with "." and not ending in .parquet
_TEMP_SUFFIX = ".tmp"


def part_files(results_dir: Path) -> list[Path]:
    """The complete part files of a table's folder, in order (temporary files left out)."""
    return sorted(p for p in results_dir.glob("part-*.parquet") if _PART.match(p.name))


def write_atomically(table: pa.Table, final: Path) -> None:
    """Write ``table`` to a temporary file beside ``final`` (a name readers skip), fsync it, and
    rename it to ``final``: readers see the old file or the new one, never half of one.

    The part is encoded into pyarrow's own buffer and written in one call. Given a Python file,
    pyarrow calls back into Python, taking the GIL, for each of its hundreds of small writes; with
    threads computing in the process (a sweep's driver runs the agents' experts), each of those
    waits its turn: on an H100 host (Python 3.12) a results part took 1.3 s beside two spinning
    threads and 4.0 s beside ten, 94 ms and 377 ms this way, and in a sweep the driver's loop spent
    74 of 250 s writing parts (BENCHMARKS.md)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    encoded = sink.getvalue()
    temp = final.with_name(f"{_TEMP_PREFIX}{final.stem.removeprefix('part-')}{_TEMP_SUFFIX}")
    try:
        with open(temp, "wb") as out:
            out.write(encoded)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def fsync_dir(folder: Path) -> None:
    # Makes a rename itself durable; not every platform lets a directory be opened.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _common_type(kept: pa.DataType, other: pa.DataType) -> pa.DataType:
    """One type that holds the values of both (a param's column: int64, float64 or string)."""
    if kept.equals(other) or pa.types.is_null(other):
        return kept
    if pa.types.is_null(kept):
        return other
    if pa.types.is_integer(kept) and pa.types.is_floating(other):
        return other
    if pa.types.is_floating(kept) and pa.types.is_integer(other):
        return kept
    return pa.string()


def widened_schema(schema: pa.Schema, others: Sequence[pa.Schema]) -> pa.Schema:
    """``schema`` taking in ``others`` (the parts already written): a column only they have comes
    last, and a column whose types differ gets one that holds both (``_common_type``)."""
    types = {f.name: f.type for f in schema}
    for other in others:
        for f in other:
            types[f.name] = _common_type(types[f.name], f.type) if f.name in types else f.type
    return pa.schema(list(types.items()), metadata=schema.metadata)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s rows in ``schema``: missing columns null, differing types cast (int to string)."""
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
        else:
            column = table.column(f.name)
            columns.append(column if column.type.equals(f.type) else pc.cast(column, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def unify_parts(folder: Path, schema: pa.Schema) -> pa.Schema:
    """Give every part of ``folder`` one schema: ``schema`` widened by the parts' own
    (``widened_schema``), which is returned. A part of another schema is rewritten to it
    atomically (``write_atomically``), in part order: a crash midway loses no row, leaves the
    first parts widest (what pandas and pyarrow.dataset take for all), and the next call finishes
    the job. A part that does not read whole is left as it is, for ``warpfleet check``."""
    found = []
    for part in part_files(folder):
        with contextlib.suppress(OSError, pa.ArrowException):
            found.append((part, pq.read_schema(part)))
    schema = widened_schema(schema, [s for _, s in found])
    rewritten = False
    for part, own in found:
        if own.equals(schema, check_metadata=True):
            continue
        try:
            table = pq.read_table(part)
        except (OSError, pa.ArrowException):
            continue
        write_atomically(_conform(table, schema), part)
        rewritten = True
    if rewritten:
        fsync_dir(folder)
    return schema


def remove_temporary(folder: Path) -> None:
    """The temporary files that an interrupted write left in ``folder``."""
    for stale in folder.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}"):
        stale.unlink(missing_ok=True)
