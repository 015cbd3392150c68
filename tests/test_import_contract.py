"""The import contract (issue 29): layers import downward only, and no new import cycle appears.

Layers, lowest first (a module may import its own layer and the ones below):
0. core: errors, the data-file schema, spec, parallel config, placement, run options, profile
   records, io, catalog, progress lines;
1. data: the hardware, framework and storage profile packages;
2. cost formulas and step terms: cost_models;
3. scoring and model sources: software, score, candidates, partition, the profilers, model readers;
4. the application: estimate, search, explain, plan documents, exports, report, executor;
5. commands: planner.commands, planner.cli, and the package's public front (planner/__init__).

The graph is read from the source with the AST (no project code runs), imports inside functions
included (the house measure counts them the same way). The cycles left are listed in KNOWN_CYCLES and may
only shrink; the count of project imports inside functions may only go down.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "planner",
    "cost_models",
    "frameworks",
    "hardware_profiles",
    "storage_profiles",
    "benchmarks",
)

CORE = (
    "planner.errors",
    "planner.data_schema",
    "planner.spec",
    "planner.parallel",
    "planner.placement",
    "planner.run_options",
    "planner.profile_records",
    "planner.io",
    "planner.catalog",
    "planner.progress",
)
DATA = ("hardware_profiles", "frameworks", "storage_profiles")
SCORING = (
    "planner.software",
    "planner.score",
    "planner.candidates",
    "planner.partition",
    "planner.hf_config",
    "planner.sources",
    "planner.profiler",
    "planner.module_profiler",
    "planner.usercode",
    "planner.goodput",
)
COMMANDS = ("planner.commands", "planner.cli", "planner.__main__")

KNOWN_CYCLES: list[set[str]] = []
"""Cycles that remain; a cycle may leave this list, never join it."""
MAX_INNER_IMPORTS = 25
"""Project imports inside functions (as house.py counts them, benchmarks included): may only fall."""


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def _imports(module: str, path: Path) -> tuple[set[str], int]:
    """(project modules `module` imports, anywhere in it; how many of those imports sit in functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    in_functions = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for sub in ast.walk(node)
        if isinstance(sub, (ast.Import, ast.ImportFrom))
    }
    found, inner = set(), 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            hits = {r for t in _targets(node, package) if (r := _resolve(t)) and r != module}
            found |= hits
            inner += bool(hits) and id(node) in in_functions
    return found, inner


GRAPH, INNER = {}, 0
for _name, _path in MODULES.items():
    GRAPH[_name], _count = _imports(_name, _path)
    INNER += _count


def layer(module: str) -> int:
    if module.startswith("benchmarks"):
        return 6
    if module in CORE:
        return 0
    if module.split(".")[0] in DATA:
        return 1
    if module.startswith("cost_models"):
        return 2
    if module in SCORING:
        return 3
    if module == "planner" or module.startswith(COMMANDS):
        return 5
    return 4


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_every_import_points_down_the_layers():
    upward = sorted(
        f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
        for m, targets in GRAPH.items()
        for t in targets
        if layer(t) > layer(m)
    )
    assert not upward, "\n".join(upward)


def test_the_core_imports_nothing_but_the_core():
    for module in CORE:
        assert GRAPH[module] <= set(CORE), f"{module} imports {sorted(GRAPH[module] - set(CORE))}"


def test_no_import_cycle_beyond_the_known_ones_and_those_only_shrink():
    for component in cycles(GRAPH):
        assert any(component <= known for known in KNOWN_CYCLES), (
            f"new import cycle: {sorted(component)}"
        )


def test_project_imports_inside_functions_do_not_grow():
    assert INNER <= MAX_INNER_IMPORTS, (
        f"{INNER} project imports inside functions (at most {MAX_INNER_IMPORTS})"
    )


def test_the_cycle_finder_sees_a_cycle_and_the_layer_rule_sees_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert layer("planner.parallel") < layer("cost_models.compute") < layer("planner.search")
    assert layer("planner.search") < layer("planner.commands.recommend")
