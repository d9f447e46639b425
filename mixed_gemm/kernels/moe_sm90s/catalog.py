"""The moe_sm90s family's default catalog: the decode-range token tiles (16, 32 and 64 routed
rows of an expert per CTA) with 128 weight rows, and 16 to 128 in steps of 16 (but 32) with 256
(four consumer warpgroups: half the work items and x read once per 256 weight rows, for the many
small experts' per-item costs and the large experts' x traffic; the rows between powers of two hold
a ragged expert's rows in one tile, as 80 does ~64 +- 8), TK = 128 (64 for 112 and 128 rows, whose
accumulators and fragments fit 112 registers only so), and 64, 96 and 128 with 192 (three consumer
warpgroups with 160 registers each: TK = 128 at 128 rows, the dense family's prefill tile, for the
1024-4096-token layers whose experts get 64-400 rows); fp16 and bf16, int4, and four of them for
int8. The stage, the split factor and the persistent grid are launch-time choices (no kernel of
their own). The 256-row int4 tiles again with the gather (``_g``: the gate|up stage reading x's
routed rows by index, no gathered copy), and four prefill tiles with the staged epilogue (``_se``)."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from ..sm90s.config import double_buffered
from .config import MoeSm90sConfig

TILES = ((128, 16, 128), (128, 32, 128), (128, 64, 128), (256, 16, 128), (256, 32, 128), (256, 48, 128), (256, 64, 128),
         (256, 80, 128), (256, 96, 128), (256, 112, 64), (256, 128, 64), (192, 64, 128), (192, 96, 128),
         (192, 128, 128))
# 8-bit experts: the same kernel with the 64-bit atom slices, on fewer tiles (as the dense family's).
TILES_U8 = ((128, 16, 128), (128, 64, 128), (256, 16, 128), (256, 32, 128))
BITS = (4, 8)


# The staged epilogue (``_se``): the prefill tiles whose items are short in K (Qwen3's and
# DeepSeek's down GEMM: 12-22 k-tiles), where the tile's stores are a fifth of the item. int4.
STAGED_TILES = ((256, 128, 64), (256, 96, 128), (256, 64, 128), (192, 128, 128))


def staged_tiles(bits: int):
    """The tiles compiled again with the staged epilogue (``_se``): profile candidates."""
    return STAGED_TILES if bits == 4 else ()


def tiles_for(bits: int):
    return TILES if bits == 4 else TILES_U8


def half_issue_tiles(bits: int):
    """The tiles with one fragment set (TM = 256 from TN = 32), compiled again with half issue
    (``_hi``): profile candidates, unmeasured; a kernel package holds them only where a profile
    names them (``MoeSm90sFamily.packaged``)."""
    return tuple(t for t in tiles_for(bits) if not double_buffered(t, 1))


def gather_tiles(bits: int):
    """The tiles compiled again with the gather (``_g``): int4 with 256 weight rows, the tiles the
    profiles name from 16 tokens up."""
    return tuple(t for t in tiles_for(bits) if bits == 4 and t[0] == 256)


def default_catalog() -> List[MoeSm90sConfig]:
    return ([MoeSm90sConfig(dtype=d, bits=b, tile=t) for d in DTYPES for b in BITS for t in tiles_for(b)]
            + [MoeSm90sConfig(dtype=d, bits=b, tile=t, half_issue=True) for d in DTYPES for b in BITS
               for t in half_issue_tiles(b)]
            + [MoeSm90sConfig(dtype=d, bits=b, tile=t, gather=True) for d in DTYPES for b in BITS
               for t in gather_tiles(b)]
            + [MoeSm90sConfig(dtype=d, bits=b, tile=t, staged=True) for d in DTYPES for b in BITS
               for t in staged_tiles(b)])
