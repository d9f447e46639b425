"""The moe_sm90a family's default catalog: per activation dtype and width, four tile widths along
the routed rows (32 to 256 rows of an expert per CTA) with TK = 64, so that groups 64 and 128 (and
per-channel weights) all run, and the 64- and 128-row tiles again with TK = 128 (group 128 and
per-channel: half the k-iterations, one scale load per k-tile); 24 kernels."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from .config import MoeSm90aConfig

TILES = ((128, 32, 64), (128, 64, 64), (128, 128, 64), (128, 256, 64), (128, 64, 128), (128, 128, 128))
BITS = (4, 8)


def default_catalog() -> List[MoeSm90aConfig]:
    return [MoeSm90aConfig(dtype=d, bits=b, tile=t) for d in DTYPES for b in BITS for t in TILES]
