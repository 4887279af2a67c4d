"""The package's modules import one another without cycles at import time (docs/architecture.md
"Layers"): walking every module-level `import` / `from ... import` of `simulator/` (blocks
under `if TYPE_CHECKING:` excluded) finds no strongly connected component of two or more
modules. Imports inside functions (done lazily, where they are used) are not counted here."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simulator"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package modules a module-level import statement loads."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    found = set()
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        if submodule in modules:  # `from . import figures` loads the submodule
            found.add(submodule)
        elif source in modules:
            found.add(source)
    return found


def _module_level(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, ast.If):
            test = node.test
            guarded = isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            guarded |= isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
            if not guarded:
                yield from _module_level(node.body)
                yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body)
        else:
            yield node


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for node in _module_level(tree.body):
            edges |= _targets(node, module, path.name == "__init__.py", modules)
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycles():
    graph = import_graph()
    assert len(graph) > 80  # the walk saw the package
    assert cycles(graph) == []
