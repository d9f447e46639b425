"""The sm90a family's default catalog: the compiled identities ``mixed-gemm build --all`` precompiles.

Its rendered sources are checked into ``generated/``. Cooperative kernels are compiled with the
stream-K tile scheduler, which also runs data-parallel and split-K (a launch-time choice), so one
binary serves every decomposition of its tile; ping-pong kernels take the persistent scheduler
(CUTLASS has no stream-K ping-pong)."""
from __future__ import annotations

from typing import List

from ..common import DTYPES
from .config import Sm90aConfig

# (tile (TM weight rows, TN tokens, TK), kind, cluster, stages), from small M to large M.
SHAPES = (
    ((128, 32, 128), "coop", (1, 1), 0),    # M <= 32 rows of tokens, with split-K
    ((128, 64, 128), "coop", (1, 1), 0),    # M = 64: the weight streams once
    ((128, 64, 64), "coop", (1, 1), 0),     # group 64 needs TK = 64
    ((64, 64, 128), "pp", (1, 1), 0),       # twice the weight tiles of 128 x 64: fills 132 SMs
    ((64, 32, 128), "pp", (1, 1), 0),       # M = 33..64 on small N: two token tiles double the CTAs
    ((64, 128, 64), "pp", (1, 1), 0),
    ((128, 128, 64), "coop", (1, 1), 0),
    ((128, 128, 128), "coop", (1, 1), 0),
    ((128, 256, 64), "coop", (1, 1), 0),    # prefill
    ((256, 128, 64), "coop", (1, 1), 0),
)
# Clusters of two CTAs along the weight rows share (TMA-multicast) each activation tile, halving
# its L2 -> SM traffic; compiled for the int4 weights the targets are measured on.
CLUSTER_SHAPES = (
    ((128, 64, 128), "coop", (2, 1), 0),
    ((64, 64, 128), "pp", (2, 1), 0),
    ((128, 128, 128), "coop", (2, 1), 0),
    ((128, 256, 64), "coop", (2, 1), 0),
    ((128, 128, 64), "coop", (1, 2), 0),    # weight tile multicast to two token tiles (M >= 256)
)
# Explicit pipeline depths beside the automatic one (as many stages as fit), for the int4 tiles
# the decode-adjacent Ms pick: fewer stages shorten the prologue of short K loops.
STAGE_SHAPES = (
    ((128, 64, 128), "coop", (1, 1), 4),
    ((64, 64, 128), "pp", (1, 1), 4),
)
BITS = (4, 8)


def kernel_of(tile, kind, cluster, stages, *, dtype: str, bits: int) -> Sm90aConfig:
    return Sm90aConfig(dtype=dtype, bits=bits, tile=tile, kind=kind, cluster=cluster, stages=stages,
                       decomposition="sk" if kind == "coop" else "persistent").kernel


def shapes_for(bits: int):
    return SHAPES + (CLUSTER_SHAPES + STAGE_SHAPES if bits == 4 else ())


def default_catalog() -> List[Sm90aConfig]:
    return [kernel_of(*shape, dtype=dtype, bits=bits) for dtype in DTYPES for bits in BITS for shape in shapes_for(bits)]
