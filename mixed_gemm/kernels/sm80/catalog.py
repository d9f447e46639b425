"""The sm80 family's default catalog: tile shapes from decode to prefill, for every weight kind.

Its rendered sources are checked into ``generated/`` (one ``<name>.cu`` each)."""
from __future__ import annotations

from typing import List

from ..common import DTYPES, ZERO_MODES
from .config import LAYOUT_BITS, Sm80Config

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
# The decode tiles again on the sm90a layout (the Hopper one copy): 9-32 tokens, where the gemv
# kernels re-read x per warp and the wgmma tiles pay their TMA prologue on small shapes.
SHAPES_SM90A = SHAPES[:7]
WEIGHT_KINDS = tuple((dtype, bits, zero) for dtype in DTYPES for bits in LAYOUT_BITS["sm80"] for zero in ZERO_MODES)
# The same tiles on the lowbit layout (1-3 bits; not 1:2-sparse: config.LAYOUT_BITS): batches of 9-32 tokens, where
# the gemv kernels lose a third of their M=1 speedup (docs/notes/sm80.md).
SHAPES_LOWBIT = SHAPES_SM90A
# The atom layouts fold every zero mode into their additive zero: one kernel per dtype and width.
WEIGHT_KINDS_SM90A = tuple((dtype, bits, "int") for dtype in DTYPES for bits in LAYOUT_BITS["sm90a"])
WEIGHT_KINDS_LOWBIT = tuple((dtype, bits, "int") for dtype in DTYPES for bits in LAYOUT_BITS["lowbit"])
_BY_LAYOUT = {"sm80": (SHAPES, WEIGHT_KINDS), "sm90a": (SHAPES_SM90A, WEIGHT_KINDS_SM90A),
              "lowbit": (SHAPES_LOWBIT, WEIGHT_KINDS_LOWBIT)}


def catalog_shapes(layout: str):
    """The (tile, warps, stages) the catalog compiles for weights of ``layout``."""
    return _BY_LAYOUT[layout][0]


def default_catalog() -> List[Sm80Config]:
    return [
        Sm80Config(dtype=dtype, bits=bits, zero_mode=zero, tile=tile, warps=warps, stages=stages, layout=layout)
        for layout, (shapes, kinds) in _BY_LAYOUT.items()
        for dtype, bits, zero in kinds
        for tile, warps, stages in shapes
    ]
