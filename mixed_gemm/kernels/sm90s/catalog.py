"""The sm90s family's default catalog: the compiled identities ``mixed-gemm build --all``
precompiles (and ``generated/`` shows). One binary serves every decomposition of its tile (the
split factor is a launch-time choice) and every zero mode (the sm90a layout's additive zero)."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from .config import Sm90sConfig

# (tile (TM, TN tokens, TK), CTAs per SM), from small M to large M. Every group size the sm90a
# layout holds (powers of two >= 32, per-channel) runs with TK = 128: a k-tile loads one scale
# row per group it touches.
SHAPES = (
    ((128, 16, 128), 1),
    ((128, 16, 128), 2),    # two CTAs per SM: four converting warpgroups for the memory-bound range
                            # (not at TN = 32: 104 registers per consumer thread spill there)
    ((128, 32, 128), 1),
    ((128, 64, 128), 1),
    ((128, 128, 128), 1),
    ((128, 256, 128), 1),
)
# 8-bit weights: the same kernel with the 64-bit atom slices (AtomConvert<., 8>), on fewer tiles.
SHAPES_U8 = (
    ((128, 16, 128), 1),
    ((128, 64, 128), 1),
    ((128, 256, 64), 1),    # TK = 128 would leave room for 2 stages of 82 KB
)
BITS = (4, 8)


def shapes_for(bits: int):
    return SHAPES if bits == 4 else SHAPES_U8


def kernel_of(tile, ctas_per_sm, *, dtype: str, bits: int) -> Sm90sConfig:
    return Sm90sConfig(dtype=dtype, bits=bits, tile=tile, ctas_per_sm=ctas_per_sm).kernel


def default_catalog() -> List[Sm90sConfig]:
    return [kernel_of(*shape, dtype=dtype, bits=bits) for dtype in DTYPES for bits in BITS for shape in shapes_for(bits)]
