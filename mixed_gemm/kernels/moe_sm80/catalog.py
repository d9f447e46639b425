"""The moe_sm80 family's default catalog: per activation dtype and width, the sm80 family's prefill
tiles on the one copy (64 to 128 routed rows per CTA); 12 kernels."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from .config import MoeSm80Config

SHAPES = (
    ((64, 128, 64), (2, 2, 1), 4),     # a few dozen rows per expert: half-height tiles
    ((128, 128, 64), (2, 2, 1), 4),
    ((128, 256, 64), (2, 4, 1), 3),    # hundreds of rows per expert: 64x64 warp tiles
)
BITS = (4, 8)


def default_catalog() -> List[MoeSm80Config]:
    return [MoeSm80Config(dtype=d, bits=b, tile=t, warps=w, stages=s) for d in DTYPES for b in BITS
            for t, w, s in SHAPES]
