"""The default catalog: tile shapes from decode to prefill, for every weight kind, plus the
standalone dequantize kernels.

Its rendered sources are checked into ``generated/`` (one ``<name>.cu`` each); a test re-renders
them and fails on any difference, so the repository always shows what the templates produce.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from .config import DTYPES, ZERO_MODES, DequantConfig, KernelConfig
from .render import render

# (tile, warps, stages), small M to large M; the heuristics pick among these (a test checks).
SHAPES = (
    ((16, 64, 128), (1, 1, 4), 4),     # decode: one m16 row tile, K split over 4 warps
    ((16, 64, 128), (1, 1, 4), 6),     # decode, deeper pipeline: more bytes in flight per block
    ((16, 64, 128), (1, 1, 8), 4),     # decode, one k16 step per warp: more warps to hide latency
    ((16, 128, 128), (1, 1, 4), 4),    # decode, 128 columns per warp: twice the bytes per block
    ((16, 128, 128), (1, 2, 2), 4),
    ((32, 64, 128), (1, 1, 4), 4),
    ((32, 128, 128), (1, 2, 2), 4),
    ((64, 64, 128), (2, 1, 2), 4),     # small batches: twice the blocks of 64x128
    ((64, 128, 64), (2, 2, 1), 4),
    ((64, 256, 64), (1, 4, 1), 3),
    ((128, 128, 64), (2, 2, 1), 4),
    ((128, 256, 64), (2, 4, 1), 3),    # prefill: 256 threads, 64x64 warp tiles
    ((256, 128, 64), (4, 2, 1), 3),
)
WEIGHT_KINDS = tuple((dtype, bits, zero) for dtype in DTYPES for bits in (4, 8) for zero in ZERO_MODES)


def default_catalog() -> List[KernelConfig]:
    return [
        KernelConfig(dtype=dtype, bits=bits, zero_mode=zero, tile=tile, warps=warps, stages=stages)
        for dtype, bits, zero in WEIGHT_KINDS
        for tile, warps, stages in SHAPES
    ]


def dequant_catalog() -> List[DequantConfig]:
    return [DequantConfig(dtype=dtype, bits=bits, zero_mode=zero) for dtype, bits, zero in WEIGHT_KINDS]


def write_generated(directory: Path, configs=None) -> List[Path]:
    """Write ``<name>.cu`` for each config into ``directory``, touching only files whose text changed,
    and remove stale ``mg_*.cu`` files no config produces. Returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    configs = default_catalog() + dequant_catalog() if configs is None else configs
    wanted = {f"{c.kernel_name}.cu": render(c) for c in configs}
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
