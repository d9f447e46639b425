"""The default catalog: every config the heuristics can pick, for every weight kind.

Its rendered sources are checked into ``generated/`` (one ``<name>.cu`` each); a test re-renders
them and fails on any difference, so the repository always shows what the templates produce.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from .config import KernelConfig
from .render import render

# (tile, warps, stages) shapes; kept in step with mixed_gemm/select/heuristics.py by a test.
SHAPES = (
    ((16, 64, 128), (1, 1, 4), 4),
    ((64, 128, 64), (2, 2, 1), 4),
    ((128, 128, 64), (2, 2, 1), 4),
)
WEIGHT_KINDS = ((4, "int"), (4, "sym"), (8, "int"), (8, "sym"))


def default_catalog() -> List[KernelConfig]:
    return [
        KernelConfig(dtype="f16", bits=bits, zero_mode=zero, tile=tile, warps=warps, stages=stages)
        for bits, zero in WEIGHT_KINDS
        for tile, warps, stages in SHAPES
    ]


def write_generated(directory: Path, configs=None) -> List[Path]:
    """Write ``<name>.cu`` for each config into ``directory``, touching only files whose text changed,
    and remove stale ``mg_*.cu`` files no config produces. Returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    configs = default_catalog() if configs is None else configs
    wanted = {f"{c.name}.cu": render(c) for c in configs}
    written = []
    for fname, text in wanted.items():
        path = directory / fname
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    for stale in directory.glob("mg_*.cu"):
        if stale.name not in wanted:
            stale.unlink()
    return written
