"""The layout's rules, read from the sources: no import cycles among warpfleet's modules (imports
inside functions and under TYPE_CHECKING count), and each floor imports only the floors below it
(the layers contract: ``FLOORS``), every module of ours on a floor."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("cluster", "agents", "search_spaces")

# The floors of a sweep's run time, bottom first: each may import those before it. Building, running
# and measuring a candidate, and storing what came of it, know nothing of the agents.
RUNTIME = ("cluster.core", "cluster.platform", "cluster.toolchains", "search_spaces", "cluster.config",
           "cluster.sandbox", "cluster.compile", "cluster.runners", "cluster.measure", "cluster.store")
# Each floor may import itself and the floors listed; nothing above.
FLOORS: dict[str, set[str]] = {floor: set(RUNTIME[:i]) for i, floor in enumerate(RUNTIME)}
# The agents propose variants from the config and the sources alone, beside the run time, not on it.
FLOORS["agents"] = {"cluster.core", "cluster.toolchains", "search_spaces", "cluster.config"}
# The engine's own floors, bottom first: the jobs and their queues, the time plan, a study's state,
# the verification tiers, then the flows and the driver that move the studies along.
ENGINE = ("cluster.engine.scheduling", "cluster.engine.plan", "cluster.engine.study", "cluster.engine.verification")
for i, floor in enumerate(ENGINE):
    FLOORS[floor] = {*RUNTIME, "agents", *ENGINE[:i]}
FLOORS["cluster.engine"] = {*RUNTIME, "agents", *ENGINE}  # where the agents and the run time meet: the sweep
FLOORS["cluster.outputs"] = {*RUNTIME}  # what a run's tables say: reports, exports, compare
FLOORS["cluster.api"] = {*RUNTIME, "agents", "cluster.engine", *ENGINE, "cluster.outputs"}  # the scripts' face
FLOORS["cluster.cli"] = {*RUNTIME, "agents", "cluster.engine", *ENGINE, "cluster.outputs", "cluster.api"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours that ``name`` imports, anywhere in it, with the packages that importing
    it initializes on the way (``a.b.c`` runs ``a`` and ``a.b`` first)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            pieces = target.split(".")
            for i in range(1, len(pieces) + 1):
                prefix = ".".join(pieces[:i])
                if prefix in known and prefix != name and not name.startswith(prefix + "."):
                    out.add(prefix)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def floor_of(name: str) -> str | None:
    return next((f for f in sorted(FLOORS, key=len, reverse=True) if name == f or name.startswith(f + ".")), None)


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import of ``edges`` from a floor to one it may not import."""
    wrong = []
    for name, targets in edges.items():
        floor = floor_of(name)
        if floor is None:
            continue
        for target in targets:
            other = floor_of(target)
            if other is None and target in PACKAGES:
                continue  # a top package's own __init__ (empty), run on the way to a floor
            if other != floor and other not in FLOORS[floor]:
                wrong.append(f"{name} -> {target}")
    return sorted(wrong)


def test_each_floor_imports_only_the_floors_below_it():
    assert upward(graph()) == []


def test_every_module_is_on_a_floor():
    assert [name for name in graph() if floor_of(name) is None and name not in PACKAGES] == []


def test_the_floor_check_finds_a_planted_upward_import():
    """The contract's own check: a module of a lower floor importing a higher one is named."""
    assert upward({"cluster.store.results": {"cluster.engine.flow"}, "cluster.engine.flow": {"cluster.store"}}) == \
        ["cluster.store.results -> cluster.engine.flow"]


def test_the_engine_keeps_its_folders_small():
    """A folder of the engine holds at most 12 modules: a concern that grows past that is a floor of its own."""
    folders = {p.parent for p in (REPO / "cluster" / "engine").rglob("*.py")}
    crowded = {str(f.relative_to(REPO)): n for f in folders if (n := len([m for m in f.glob("*.py")
                                                                              if m.name != "__init__.py"])) > 12}
    assert crowded == {}
