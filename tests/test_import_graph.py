"""The house's import graph, read from the source (every ``import``, also inside functions; not those under
``if TYPE_CHECKING:``, which never run): no circles in ``langgraph_art`` or between it and its integrations, the
layers of the design (docs: design) hold, and core imports none of its integrations or their tools."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "langgraph_art", *sorted((ROOT / "integrations").glob("*/langgraph_art_*"))]
BOTTOM = {"types", "errors", "config", "sync", "progress", "cache", "store", "runlog", "sinks"}
# what each lower layer may import (other layers are the top: backends, loop, evaluation, model, cli, demos, testing)
ALLOWED = {
    **dict.fromkeys(BOTTOM, BOTTOM),
    "models": BOTTOM | {"models"},
    "capture": BOTTOM | {"capture"},
    "rewards": BOTTOM | {"rewards"},
    "train": BOTTOM | {"train", "models"},
    "serve": BOTTOM | {"serve", "models", "capture"},
}
NOT_IN_CORE = ("langgraph_art_langfuse", "langgraph_art_wandb", "langfuse", "wandb")


def module_name(path: Path) -> str:
    """``langgraph_art/serve/app.py`` -> ``langgraph_art.serve.app``; ``integrations/x/pkg/a.py`` -> ``pkg.a``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[2:] if parts[0] == "integrations" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, name: str) -> set[str]:
    """Every module name ``path`` imports at run time, as written (``a.b`` and, for ``from a import b``, ``a.b``)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between our modules, every name each module imports)."""
    files = {module_name(f): f for package in PACKAGES for f in package.rglob("*.py")}
    everything = {name: imported_names(path, name) for name, path in files.items()}
    edges = {}
    for name, imported in everything.items():
        targets = set()
        for target in imported:
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        edges[name] = targets
    return edges, everything


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "langgraph_art" and len(parts) > 1 else parts[0]


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_house() -> None:
    edges, _ = graph()
    assert len(edges) > 90  # the whole house was read
    assert circles(edges) == []


def test_layers_import_only_downwards() -> None:
    edges, _ = graph()
    wrong = [
        (module, target)
        for module, targets in edges.items()
        if module.startswith("langgraph_art.") and layer(module) in ALLOWED
        for target in targets
        if target.startswith("langgraph_art.") and layer(target) not in ALLOWED[layer(module)]
    ]
    assert wrong == []


def test_core_imports_none_of_its_integrations_or_their_tools() -> None:
    _, everything = graph()
    core = {name: imported for name, imported in everything.items() if name.split(".")[0] == "langgraph_art"}
    assert len(core) > 80
    wrong = {
        name: sorted(i for i in imported if i.split(".")[0] in NOT_IN_CORE)
        for name, imported in core.items()
        if any(i.split(".")[0] in NOT_IN_CORE for i in imported)
    }
    assert wrong == {}
