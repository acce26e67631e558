"""A results part written beside threads that compute: the part writer (cluster.store.parts) against
pyarrow writing to a Python file, as it did before, with 0, 2 and 10 spinning threads in the process.

    python scripts/bench_parquet_gil.py --out DIR [--repeats 5]

A sweep's driver runs the agents' experts on threads of its own process (Python computing that holds
the GIL), and writes the results' parts on its main thread. Given a Python file, pyarrow calls back
into Python for each of its small writes, each call waiting for the GIL. The part is a results row of
79 columns, as a run's are. Prints and writes DIR/parquet_gil.json: the median and the largest
seconds a part, per way and number of spinners.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cluster.store.parts import write_atomically  # noqa: E402


def a_part() -> pa.Table:
    """One row of 79 columns, strings, numbers, a list and timestamps, like a results part's."""
    columns: dict[str, pa.Array] = {}
    for i in range(30):
        columns[f"s{i}"] = pa.array([f"value {i}"])
    for i in range(40):
        columns[f"n{i}"] = pa.array([float(i)])
    for i in range(7):
        columns[f"i{i}"] = pa.array([i], pa.int64())
    columns["samples"] = pa.array([[0.1] * 10], pa.list_(pa.float64()))
    columns["at"] = pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC"))
    return pa.table(columns)


def through_a_python_file(table: pa.Table, final: Path) -> None:
    """The writer before: pyarrow writing to an open Python file, then fsync and rename."""
    temp = final.with_suffix(".tmp")
    with open(temp, "wb") as out:
        pq.write_table(table, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, final)


def spin(stop: threading.Event) -> None:
    """Python computing, as an expert's tree walk is: it holds the GIL but for the switch interval."""
    while not stop.is_set():
        sum(range(1000))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    table, results = a_part(), []
    with tempfile.TemporaryDirectory() as folder:
        for spinners in (0, 2, 10):
            stop = threading.Event()
            threads = [threading.Thread(target=spin, args=(stop,)) for _ in range(spinners)]
            for thread in threads:
                thread.start()
            try:
                for name, write in (("python file (before)", through_a_python_file),
                                    ("write_atomically", write_atomically)):
                    times = []
                    for i in range(args.repeats):
                        started = time.perf_counter()
                        write(table, Path(folder) / f"part-{i:06d}-00000000.parquet")
                        times.append(time.perf_counter() - started)
                    results.append({"way": name, "spinners": spinners, "median_s": statistics.median(times),
                                    "max_s": max(times), "repeats": args.repeats})
                    print(f"{spinners:2d} spinners  {name:22s} median {1e3 * statistics.median(times):9.1f} ms  "
                          f"max {1e3 * max(times):9.1f} ms", flush=True)
            finally:
                stop.set()
                for thread in threads:
                    thread.join()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parquet_gil.json").write_text(json.dumps({
        "python": sys.version.split()[0], "pyarrow": pa.__version__, "columns": table.num_columns,
        "results": results}, indent=1))


if __name__ == "__main__":
    main()
