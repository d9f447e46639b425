"""Layers import one way: formats -> codegen -> compile -> runtime -> kernels -> select -> ops ->
profiler/benchmark -> nn/integrations -> command line; nothing imports the package root from below;
no two modules import each other, directly or around a circle.

Walks every module's imports (static, with ast: lazy imports inside functions count too) and fails
on any import of a higher layer and on any import cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mixed_gemm"

# Top-level module or sub-package -> rank; an import may only go to the same or a lower rank.
RANKS = {
    "_paths": 0, "version": 0,
    "formats": 1, "reference": 1,
    "codegen": 2,
    "compile": 3,
    "runtime": 4, "_versions": 4,
    "kernels": 5,
    "select": 6,
    "ops": 7,
    "profiler": 8, "benchmark": 8,
    "nn": 9, "integrations": 9,
    "cli": 10,
    "": 11,  # mixed_gemm/__init__.py: the package root
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    base = PKG.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _layer(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path, name: str | None = None):
    """(line, imported module) for every import of a mixed_gemm module in ``path`` (module ``name``)."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mixed_gemm":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "mixed_gemm":
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else target


MODULES = sorted(PKG.rglob("*.py"))


def test_every_layer_is_ranked():
    layers = {_layer(_module_name(p)) for p in MODULES}
    assert layers <= set(RANKS), f"give these a rank in RANKS: {sorted(layers - set(RANKS))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(PKG).as_posix())
def test_imports_go_down(path):
    here = _layer(_module_name(path))
    bad = [f"line {line}: {target} (layer {_layer(target) or 'the package root'})"
           for line, target in _imports(path) if RANKS[_layer(target)] > RANKS[here]]
    assert not bad, f"{path.relative_to(PKG)} (layer {here or 'root'}) imports upward: " + "; ".join(bad)


def test_the_check_catches_an_upward_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from .. import __version__\nfrom ..ops import matmul\nfrom ..runtime import get_module\n"
                     "def f():\n    import mixed_gemm.nn\n")
    found = [(line, t) for line, t in _imports(probe, "mixed_gemm.kernels.probe")]
    assert found == [(1, "mixed_gemm"), (2, "mixed_gemm.ops.matmul"), (3, "mixed_gemm.runtime"), (5, "mixed_gemm.nn")]
    assert [RANKS[_layer(t)] > RANKS["kernels"] for _, t in found] == [True, True, False, True]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle ``[a, b, ..., a]`` per strongly connected group of ``graph`` (module ->
    modules it imports), found with Tarjan's algorithm; a module importing itself counts."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while not group or v not in group:
                group.add(stack.pop())
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    def circle(group: set[str]) -> list[str]:
        # Shortest way back to the group's first module, breadth first inside the group.
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:
            v = queue.pop(0)
            for w in sorted(graph.get(v, ())):
                if w == start:
                    return paths[v] + [start]
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        raise AssertionError(f"no circle through {start} in {sorted(group)}")

    return sorted(circle(g) for g in groups)


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module name -> the modules among ``modules`` it imports."""
    return {name: {t for _, t in _imports(path, name) if t in modules} for name, path in modules.items()}


def test_no_import_cycles():
    cycles = _cycles(_import_graph({_module_name(p): p for p in MODULES}))
    assert not cycles, "import cycles (make the imports go one way): " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_check_catches_a_cycle(tmp_path):
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"e"}, "f": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # A lazy import inside a function closes a circle too.
    (tmp_path / "one.py").write_text("import mixed_gemm.probe.two\n")
    (tmp_path / "two.py").write_text("def f():\n    import mixed_gemm.probe.one\n")
    graph = _import_graph({f"mixed_gemm.probe.{n}": tmp_path / f"{n}.py" for n in ("one", "two")})
    assert _cycles(graph) == [["mixed_gemm.probe.one", "mixed_gemm.probe.two", "mixed_gemm.probe.one"]]
