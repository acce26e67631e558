"""The agents package imports without cycles: a module's imports (at the top, under
TYPE_CHECKING or inside a function alike) never lead back to it."""

from __future__ import annotations

import ast
from pathlib import Path

AGENTS = Path(__file__).resolve().parents[2] / "agents"


def _modules() -> dict[str, Path]:
    out = {}
    for path in AGENTS.rglob("*.py"):
        parts = path.relative_to(AGENTS.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agents"):
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found & set(modules)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for other in sorted(graph[module] - {module}):
            if state.get(other) == 1:
                return [*path[path.index(other):], other]
            if other not in state and (found := visit(other, [*path, other])):
                return found
        state[module] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_agents_has_no_import_cycle() -> None:
    modules = _modules()
    assert "agents.experts.streamify" in modules and "agents.llm.client" in modules
    assert _cycle({name: _imports(path, modules) for name, path in modules.items()}) is None


def test_the_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
