"""Layers import one way: formats -> codegen -> compile -> runtime -> kernels -> select -> ops ->
profiler/benchmark -> nn/integrations -> command line; nothing imports the package root from below.

Walks every module's imports (static, with ast: lazy imports inside functions count too) and fails
on any import of a higher layer."""
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
