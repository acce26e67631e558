"""The scripts drive sweeps and read runs through cluster/api.py (issue 28, item 5): none imports
the engine or the store, but for the few that measure or rehearse an engine internal that has no
user-facing form, each named here with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

INTERNAL = ("cluster.engine", "cluster.store")

# (script, module): why it may import that module.
ALLOWED = {
    ("scripts/bench_sim.py", "cluster.engine.scheduling.simulate"):
        "the measurement is of the engine itself, on simulate's fake fleet and compiles",
    ("scripts/bench_driver_loop.py", "cluster.engine.scheduling.simulate"):
        "the measurement is of the driver's loop itself, on simulate's fake fleet and compiles",
    ("scripts/bench_driver_loop.py", "cluster.engine.scheduling.scheduler"):
        "the loop's iterations, timed between the scheduler's polls",
    ("scripts/bench_driver_loop.py", "cluster.engine.verification.verify"):
        "--no-lock: the static checks without the agents' COMPUTING lock, to show what it saves",
    ("scripts/kt_compare/lanes.py", "cluster.engine.scheduling.workers"):
        "KeptFleet keeps a lane's measuring actors across its runs, as Kernel Tuner keeps its process",
    ("scripts/llm_rehearsal.py", "cluster.engine.verification.verify"):
        "the verifier's static checks, rehearsed with no sweep",
    ("scripts/llm_rehearsal.py", "cluster.engine.agent_stage"):
        "the LLM agents' build tool, as a sweep hands it to them",
    ("scripts/bench_parquet_gil.py", "cluster.store.parts"):
        "the measurement is of the part writer itself, beside threads that compute",
    ("scripts/bench_portability.py", "cluster.engine.evaluate"):
        "`warpfleet evaluate`'s steps apart (its configurations checked before the sweep): the API has no evaluation",
}


def internal_imports(source: str) -> set[str]:
    """The engine and store modules ``source`` imports, wherever in it (a function's body too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for module in modules:
            if any(module == floor or module.startswith(floor + ".") for floor in INTERNAL):
                found.add(module)
                break
    return found


def scripts() -> list[Path]:
    return sorted(p for p in (REPO / "scripts").rglob("*.py") if "results" not in p.relative_to(REPO).parts)


def test_internal_imports_sees_every_form_of_import():
    source = """
import cluster.api
from cluster.config import load_run
from cluster.store.rundir import RunDir
import cluster.engine.driver as driver
def f():
    from cluster import store
"""
    assert internal_imports(source) == {"cluster.store.rundir", "cluster.engine.driver", "cluster.store"}


def test_scripts_import_no_engine_or_store_module_but_those_allowed():
    used = set()
    for path in scripts():
        name = str(path.relative_to(REPO))
        for module in internal_imports(path.read_text()):
            assert (name, module) in ALLOWED, f"{name} imports {module}: use cluster.api (or allow it here, with why)"
            used.add((name, module))
    assert used == set(ALLOWED), f"allowed but no longer imported: {set(ALLOWED) - used}"
