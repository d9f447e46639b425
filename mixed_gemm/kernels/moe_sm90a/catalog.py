"""The moe_sm90a family's default catalog, per activation dtype and width:

- ``TILES``: four tile widths along the routed rows (32 to 256 rows of an expert per CTA) with TK =
  64, so that groups 64 and 128 (and per-channel weights) all run, and the 64- and 128-row tiles
  again with TK = 128 (group 128 and per-channel: half the k-iterations, one scale load per k-tile).
- ``MANY_TOKEN_KERNELS``, int4 only (the weights the targets are measured on, as the dense
  family's clusters): for many tokens on many small experts (profile candidates from
  ``MANY_TOKENS``, docs/notes/moe.md "Next candidates"): the 128- and 256-row tiles in clusters of
  two CTAs along the weight rows (the routed rows' tile read from L2 once for two weight tiles), and
  a 256-weight-row tile (the same halving inside one CTA).

32 kernels; the raster order of the scheduler's walk is a launch-time choice (no kernel of its own).
"""
from __future__ import annotations

from typing import List, Tuple

from ..common import DTYPES
from .config import MoeSm90aConfig

TILES = ((128, 32, 64), (128, 64, 64), (128, 128, 64), (128, 256, 64), (128, 64, 128), (128, 128, 128))
# (tile, cluster)
MANY_TOKEN_KERNELS = (((128, 128, 64), 2), ((128, 128, 128), 2), ((128, 256, 64), 2), ((256, 128, 64), 1))
BITS = (4, 8)


def kernels_for(bits: int) -> Tuple[Tuple[Tuple[int, int, int], int], ...]:
    """``(tile, cluster)`` of the catalog's kernels for weights of ``bits``."""
    return tuple((t, 1) for t in TILES) + (MANY_TOKEN_KERNELS if bits == 4 else ())


def default_catalog() -> List[MoeSm90aConfig]:
    return [MoeSm90aConfig(dtype=d, bits=b, tile=t, cluster=c) for d in DTYPES for b in BITS
            for t, c in kernels_for(b)]
