"""The sm80 family's default catalog: tile shapes from decode to prefill, for every weight kind.

Its rendered sources are checked into ``generated/`` (one ``<name>.cu`` each)."""
from __future__ import annotations

from typing import List

from ..common import DTYPES, ZERO_MODES
from .config import Sm80Config

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
WEIGHT_KINDS = tuple((dtype, bits, zero) for dtype in DTYPES for bits in (4, 8) for zero in ZERO_MODES)
# The sm90a layout folds every zero mode into its additive zero: one kernel per dtype and width.
WEIGHT_KINDS_SM90A = tuple((dtype, bits, "int") for dtype in DTYPES for bits in (4, 8))


def catalog_shapes(layout: str):
    """The (tile, warps, stages) the catalog compiles for weights of ``layout``."""
    return SHAPES_SM90A if layout == "sm90a" else SHAPES


def default_catalog() -> List[Sm80Config]:
    return [
        Sm80Config(dtype=dtype, bits=bits, zero_mode=zero, tile=tile, warps=warps, stages=stages)
        for dtype, bits, zero in WEIGHT_KINDS
        for tile, warps, stages in SHAPES
    ] + [
        Sm80Config(dtype=dtype, bits=bits, zero_mode=zero, tile=tile, warps=warps, stages=stages, layout="sm90a")
        for dtype, bits, zero in WEIGHT_KINDS_SM90A
        for tile, warps, stages in SHAPES_SM90A
    ]
