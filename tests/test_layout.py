"""The package's layout: no import cycles, and every import arrow points down the layers.

Every ``import`` counts, also one inside a function (a lazy import that dodges a cycle is still
one), and so does a module named as a string in a lazy-attribute table. The layers, top to
bottom: the package's front (``dpq_spark``), the pipeline, the Spark layer, the core's front
(``dpq_spark.core``), the mechanisms (quantile and interactive, which never import each other),
randomness and accounting, and the shared errors and validation.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dpq_spark"

# (prefix, layer): a module's layer is that of its longest matching prefix; arrows go from a
# higher layer to a lower or equal one, and within a layer only inside one prefix's folder.
LAYERS = [
    ("dpq_spark", 7),
    ("dpq_spark.pipeline", 6),
    ("dpq_spark.spark", 5),
    ("dpq_spark.core", 4),
    ("dpq_spark.core.quantiles", 3),
    ("dpq_spark.core.interactive", 3),
    ("dpq_spark.core.randomness", 2),
    ("dpq_spark.core.accounting", 2),
    ("dpq_spark.core.errors", 1),
    ("dpq_spark.core._validation", 1),
    ("dpq_spark._lazy", 0),
    ("dpq_spark._version", 0),
]


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in mods:
                return ".".join(parts[:i])
        return None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if is_package else mod.split(".")[:-1]
                    base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
                for alias in node.names:  # `from pkg import submodule` imports the submodule
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in mods else base)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in mods and node.value.startswith("dpq_spark."):
                    targets = [node.value]
            for target in targets:
                if target.startswith("dpq_spark"):
                    resolved = resolve(target)
                    if resolved is not None and resolved != mod:
                        graph[mod].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(mod: str) -> tuple[int, str]:
    prefix, layer = max(((p, lay) for p, lay in LAYERS if mod == p or mod.startswith(p + ".")),
                        key=lambda item: len(item[0]))
    return layer, prefix


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in graph.items():
        layer, prefix = layer_of(mod)
        for target in targets:
            target_layer, target_prefix = layer_of(target)
            if target_layer > layer:
                bad.append(f"{mod} (layer {layer}) -> {target} (layer {target_layer})")
            elif target_layer == layer and target_prefix != prefix:
                bad.append(f"{mod} -> {target}: two folders of one layer")
    return sorted(bad)


def test_the_package_has_no_import_cycle():
    graph = import_graph(modules())
    assert sum(map(len, graph.values())) > 100  # the walk sees the imports (not vacuous)
    assert cycles(graph) == []


def test_every_import_points_down_the_layers():
    assert upward_arrows(import_graph(modules())) == []


def test_the_checks_catch_a_cycle_and_an_upward_arrow():
    graph = import_graph(modules())
    graph["dpq_spark.core.randomness.grid"].add("dpq_spark.core.quantiles.joint_exp")
    assert cycles(graph)  # joint_exp already imports grid
    assert upward_arrows(graph) == [
        "dpq_spark.core.randomness.grid (layer 2) -> dpq_spark.core.quantiles.joint_exp (layer 3)"]
    graph = import_graph(modules())
    graph["dpq_spark.core.interactive.planner"].add("dpq_spark.core.quantiles.joint_exp")
    assert upward_arrows(graph) == ["dpq_spark.core.interactive.planner -> "
                                    "dpq_spark.core.quantiles.joint_exp: two folders of one layer"]


def test_a_function_level_import_is_an_arrow():
    """An import inside a function counts: ``guarantee`` imports the bounds module lazily."""
    source = (PACKAGE / "pipeline" / "job.py").read_text(encoding="utf-8")
    guarantee = next(node for node in ast.parse(source).body
                     if isinstance(node, ast.FunctionDef) and node.name == "guarantee")
    assert any(isinstance(node, ast.ImportFrom) and node.module == "dpq_spark.core.quantiles.bounds"
               for node in ast.walk(guarantee))
    assert "dpq_spark.core.quantiles.bounds" in import_graph(modules())["dpq_spark.pipeline.job"]
