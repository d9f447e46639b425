"""The moe_sm90a family's default catalog, per activation dtype and width:

- ``TILES``: four tile widths along the routed rows (32 to 256 rows of an expert per CTA) with TK =
  64, so that groups 64 and 128 (and per-channel weights) all run, and the 64- and 128-row tiles
  again with TK = 128 (group 128 and per-channel: half the k-iterations, one scale load per k-tile).
- ``MANY_TOKEN_KERNELS``, int4 only (the weights the targets are measured on, as the dense
  family's clusters): for many tokens on many small experts (profile candidates from
  ``MANY_TOKENS``, docs/notes/moe.md "Next candidates"): the 128- and 256-row tiles in clusters of
  two CTAs along the weight rows (the routed rows' tile read from L2 once for two weight tiles), and
  a 256-weight-row tile (the same halving inside one CTA); and ping-pong kernels (each consumer
  warpgroup a tile of its own, 64 or 128 weight rows, its epilogue beside the other's main loop) for
  the down projections of small experts, whose tiles have few k-tiles (docs/notes/moe.md).

38 kernels; the raster order of the scheduler's walk is a launch-time choice (no kernel of its own).
"""
from __future__ import annotations

from typing import List, Tuple

from ..common import DTYPES
from .config import MoeSm90aConfig

TILES = ((128, 32, 64), (128, 64, 64), (128, 128, 64), (128, 256, 64), (128, 64, 128), (128, 128, 128))
# (tile, cluster, ping-pong)
MANY_TOKEN_KERNELS = (((128, 128, 64), 2, False), ((128, 128, 128), 2, False), ((128, 256, 64), 2, False),
                      ((256, 128, 64), 1, False), ((64, 128, 64), 1, True), ((64, 256, 64), 1, True),
                      ((128, 128, 64), 1, True))
BITS = (4, 8)


def kernels_for(bits: int) -> Tuple[Tuple[Tuple[int, int, int], int, bool], ...]:
    """``(tile, cluster, pingpong)`` of the catalog's kernels for weights of ``bits``."""
    return tuple((t, 1, False) for t in TILES) + (MANY_TOKEN_KERNELS if bits == 4 else ())


def default_catalog() -> List[MoeSm90aConfig]:
    return [MoeSm90aConfig(dtype=d, bits=b, tile=t, cluster=c, pingpong=p) for d in DTYPES for b in BITS
            for t, c, p in kernels_for(b)]
