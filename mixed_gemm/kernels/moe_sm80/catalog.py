"""The moe_sm80 family's default catalog: per activation dtype and width, the sm80 family's prefill
tiles on the one copy (64 to 128 routed rows per CTA), and the two 128-row tiles again fused (A
rows read by index, the top-k sum in the down epilogue): 20 kernels."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from .config import MoeSm80Config

SHAPES = (
    ((64, 128, 64), (2, 2, 1), 4),     # a few dozen rows per expert: half-height tiles
    ((128, 128, 64), (2, 2, 1), 4),    # ~256 rows per expert (Qwen3 at 4096 tokens: 2 tiles x 12-16 N tiles)
    ((128, 256, 64), (2, 4, 1), 3),    # hundreds of rows per expert: 64x64 warp tiles
)
FUSED_SHAPES = SHAPES[1:]  # prefill: the gather and the combine are a pass each at 128-row tiles
BITS = (4, 8)


def default_catalog() -> List[MoeSm80Config]:
    return [MoeSm80Config(dtype=d, bits=b, tile=t, warps=w, stages=s, fused=f) for d in DTYPES for b in BITS
            for f, shapes in ((False, SHAPES), (True, FUSED_SHAPES)) for t, w, s in shapes]
