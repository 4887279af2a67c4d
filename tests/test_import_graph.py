"""The package is layered: its modules import one another without cycles (docs/architecture.md
"Layers"). Walking every `import` / `from ... import` of `simulator/`, inside functions and
classes too (blocks under `if TYPE_CHECKING:` excluded: they never run), finds no strongly
connected component of two or more modules. A lower layer that needs a higher one takes a
function or a value from its caller instead of importing it.

The command line (`simulator/cli/`) is held to more: only the entry point (`simulator.cli`)
imports the module that builds the app and registers the commands (`simulator.cli.commands`).
Resolving a deployment (`simulator.deployment`) and planning a fleet (`simulator.fleet_plan`)
never import the module that runs scenarios (`simulator.api`), and the views of a run never
import the `Result` that shows them."""

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


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, ast.If):
            if not _type_checking(node):
                yield from _module_level(node.body)
                yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body)
        else:
            yield node


def _every_level(node: ast.AST):
    """Every import statement under `node`, in functions and classes too (not those under
    `if TYPE_CHECKING:`, which never run)."""
    for child in ast.iter_child_nodes(node):
        skipped = isinstance(child, ast.If) and _type_checking(child)
        for part in child.orelse if skipped else [child]:
            if isinstance(part, ast.Import | ast.ImportFrom):
                yield part
            yield from _every_level(part)


def import_graph(every_level: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports: at module level, or, with `every_level`,
    anywhere in it (inside functions too)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = _every_level(tree) if every_level else _module_level(tree.body)
        edges: set[str] = set()
        for node in nodes:
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


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    """A cycle's modules and the imports between them, one edge a line."""
    members = set(component)
    edges = [f"  {m} -> {t}" for m in component for t in sorted(graph[m] & members)]
    return (
        f"{len(component)} modules import one another: "
        + ", ".join(component)
        + "\n"
        + ("\n".join(edges))
    )


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycles():
    graph = import_graph()
    assert len(graph) > 80  # the walk saw the package
    assert cycles(graph) == []


CLI = "simulator.cli"


def _cli_graph() -> dict[str, set[str]]:
    graph = import_graph(every_level=True)
    inside = {m for m in graph if m == CLI or m.startswith(CLI + ".")}
    return {m: graph[m] & inside for m in inside}


def test_the_every_level_walk_sees_imports_inside_functions():
    tree = ast.parse(
        "import a\n"
        "def f():\n    from b import c\n"
        "    class K:\n        def g(self):\n            import d\n"
        "if TYPE_CHECKING:\n    import e\nelse:\n    import f\n"
    )
    names = {a.name for n in _every_level(tree) for a in n.names if isinstance(n, ast.Import)}
    froms = {n.module for n in _every_level(tree) if isinstance(n, ast.ImportFrom)}
    assert names == {"a", "d", "f"} and froms == {"b"}


def test_a_cycle_is_described_by_its_modules_and_edges():
    graph = {"a": {"b", "x"}, "b": {"a"}, "x": set()}
    text = describe(graph, cycles(graph)[0])
    assert text.splitlines() == ["2 modules import one another: a, b", "  a -> b", "  b -> a"]


def test_no_import_cycles_at_any_level():
    graph = import_graph(every_level=True)
    assert len(graph) > 80
    found = cycles(graph)
    assert not found, "\n".join(describe(graph, c) for c in found)


def test_no_import_cycles_in_the_command_line_at_any_level():
    graph = _cli_graph()
    assert {f"{CLI}.commands", f"{CLI}.common", f"{CLI}.flags"} <= set(graph)
    assert cycles(graph) == []


def test_only_the_entry_point_imports_the_module_that_registers_the_commands():
    graph = _cli_graph()
    importers = {m for m, edges in graph.items() if f"{CLI}.commands" in edges}
    assert importers == {CLI}


def test_deployments_and_fleet_plans_never_import_the_runs():
    graph = import_graph(every_level=True)
    assert "simulator.api" not in graph["simulator.deployment"]
    assert "simulator.api" not in graph["simulator.fleet_plan"]
    assert "simulator.fleet_plan" not in graph["simulator.deployment"]


def test_the_views_of_a_run_never_import_its_result():
    graph = import_graph(every_level=True)
    below = [
        m
        for m in graph
        if m.startswith(("simulator.report", "simulator.metrics."))
        and m != "simulator.metrics.results"
    ]
    assert {"simulator.metrics.summary", "simulator.metrics.views.text"} <= set(below)
    assert [m for m in below if "simulator.metrics.results" in graph[m]] == []
