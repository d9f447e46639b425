"""The sm90s family's default catalog: the compiled identities ``mixed-gemm build --all``
precompiles (and ``generated/`` shows). One binary serves every decomposition of its tile (the
split factor is a launch-time choice) and every zero mode (the sm90a layout's additive zero)."""
from __future__ import annotations

import functools
from typing import FrozenSet, List

from ..common import DTYPES
from .config import Sm90sConfig, double_buffered

# (tile (TM, TN tokens, TK), CTAs per SM, cluster, phased), from small M to large M. Every group
# size the sm90a layout holds (powers of two >= 32, per-channel) runs with TK = 128: a k-tile loads
# one scale row per group it touches.
C1, C2, C4 = (1, 1), (2, 1), (4, 1)
K2, K4 = (1, 2), (1, 4)   # the K slices of a tile as one cluster, summed in shared memory
SHAPES = (
    ((128, 16, 128), 1, C1, False),
    ((128, 16, 128), 2, C1, False),   # two CTAs per SM: four converting warpgroups for the memory-bound
                                      # range (double-buffered fragments: 104 registers a consumer thread)
    ((128, 32, 128), 1, C1, False),
    ((128, 64, 128), 1, C1, False),
    # Two CTAs per SM at TN = 32 and 64 with one fragment buffer (two spill at 104 registers): 4.5
    # warps a scheduler instead of 2.25 hide the conversion chains' latency, which ncu found binding
    # at TN = 64 (docs/notes/serving-mainloop.md); 6 and 4 stages.
    ((128, 32, 128), 2, C1, False),
    ((128, 64, 128), 2, C1, False),
    ((128, 128, 128), 1, C1, False),
    ((128, 256, 128), 1, C1, False),
    # From TN = 64 on, x from L2 costs as much as the weight from HBM per CTA (docs/notes/
    # serving-mainloop.md, cycle budget): a 2x1 cluster multicasts each x tile to two row tiles,
    # with and without the warpgroups' phase offset (tensor-bound at TN >= 128).
    ((128, 64, 128), 1, C2, False),
    ((128, 64, 128), 1, C2, True),
    ((128, 128, 128), 1, C2, False),
    ((128, 128, 128), 1, C2, True),
    ((128, 256, 128), 1, C2, False),
    ((128, 256, 128), 1, C2, True),
    # A 4x1 cluster quarters the x bytes L2 sends per weight byte again (each CTA loads TN/4 token
    # rows): profile candidates beside c1x1 and c2x1. The ring is the same (each CTA still holds the
    # whole x tile): 3 stages at TN = 256.
    ((128, 64, 128), 1, C4, False),
    ((128, 128, 128), 1, C4, False),
    ((128, 256, 128), 1, C4, False),
    # Four consumer warpgroups of 64 rows behind one producer (TM = 256): the warps a scheduler of
    # two CTAs per SM with one ring, half the x bytes from L2 per weight byte and half the tiles,
    # so fewer split-K slices fill the SMs (docs/notes/serving-mainloop.md, "four consumer warpgroups").
    ((256, 16, 128), 1, C1, False),
    ((256, 32, 128), 1, C1, False),
    ((256, 64, 128), 1, C1, False),
    ((256, 128, 64), 1, C1, False),   # TK = 64: 64 accumulators + 16 fragment registers fit 112 (TK = 128 spills)
    # Three consumer warpgroups (TM = 192) for 6144-row weights (8B q|k|v), whose 128- and 256-row
    # tiles quantize badly from M = 256 on (48 x 4 tiles of 128 tokens are 1.45 waves at M = 512,
    # 24 x 2 of 256 leave 36 SMs idle): 32 x 4 fill 132 SMs. Two fragment sets fit 160 registers at
    # TN/2 + TK/2 <= 96 (t192x128x128 keeps one). The 1x2 K cluster for M = 256 (64 tiles), at
    # TK = 64 for its 96 KB reduce region.
    ((192, 64, 128), 1, C1, False),
    ((192, 128, 64), 1, C1, False),
    ((192, 128, 128), 1, C1, False),
    ((192, 128, 64), 1, K2, False),
    ((192, 64, 128), 1, C2, False),    # x multicast over two row tiles: 28 KB from L2 a k-tile, not 44
    ((192, 128, 128), 1, C2, False),
    # One consumer warpgroup a 64-row tile (TM = 64), for M = 129-256 on the shapes of 64-96 128-row
    # tiles (8B q|k|v and o): 128 tiles fill the SMs without a K split, whose L2 sum cost ~1.4 of
    # 22 µs at 4096x4096 M = 256. It ties CUTLASS's ping-pong tile there and at 6144x4096 M = 128
    # (19.8 / 20.0 µs, fp16 and bf16). Two CTAs a SM (measured at TN = 128 with the registers to
    # spare) lost 8-20% everywhere (docs/notes/serving-mainloop.md).
    ((64, 128, 128), 1, C1, False),
    # Split-K as a 1xS cluster for the shapes whose tiles fill a quarter or half of the SMs (8B o,
    # q|k|v and down, 70B o and down): the slices' partials meet in shared memory (st.async), not
    # through a workspace, a fence and an atomic in L2 (ncu at 4096x4096, M = 16: 17% of the warps'
    # samples on that path, docs/notes/serving-mainloop.md).
    ((128, 16, 128), 1, K2, False),
    ((128, 16, 128), 1, K4, False),
    ((128, 16, 128), 2, K4, False),
    ((128, 32, 128), 1, K2, False),
    ((128, 32, 128), 1, K4, False),
    ((128, 32, 128), 2, K4, False),
    ((128, 64, 128), 1, K2, False),
    # TN = 128 at M = 129-256 where 2 slices of every tile fit one wave (8B o and down, 70B o at
    # 128): auto's L2 sum cost 4096x4096 M = 256 ~1.4 µs of 22.3 (a split-free TN = 64 tile ran 20.9,
    # docs/notes/serving-mainloop.md). The 64 KB reduce region leaves a 3-stage ring.
    ((128, 128, 128), 1, K2, False),
    ((256, 16, 128), 1, K4, False),
)
# 8-bit weights: the same kernel with the 64-bit atom slices (AtomConvert<., 8>), on fewer tiles.
SHAPES_U8 = (
    ((128, 16, 128), 1, C1, False),
    ((128, 16, 128), 2, C1, False),   # two CTAs per SM, as int4's 16-token o2 (the decode-batch range)
    ((128, 64, 128), 1, C1, False),
    ((128, 256, 64), 1, C1, False),   # TK = 128 would leave room for 2 stages of 82 KB
    ((128, 64, 128), 1, C2, False),
    ((128, 256, 64), 1, C2, False),
    ((256, 16, 128), 1, C1, False),
    ((256, 64, 128), 1, C1, False),
    ((128, 16, 128), 1, K4, False),
    # int4's 8B q|k|v winner at M = 16 (c1x4 at two CTAs per SM: 62 clusters of 4 fit a wave, where
    # 30 do at one, docs/notes/serving-mainloop.md) and the 1x2 cluster, for int8's small shapes.
    ((128, 16, 128), 2, K4, False),
    ((128, 16, 128), 1, K2, False),
)
BITS = (4, 8)
# In flight (`_ov`): each k-tile's wgmmas issued before the previous k-tile's are waited for, on the
# double-buffered int4 tiles at one CTA per SM whose two fragment sets and accumulators leave
# registers for it (t128x128 at 168 registers spilled 380 bytes; t64x128 takes 254 of its 255,
# t128x64 168). Measured on an H200 (2026-11-28, docs/notes/serving-mainloop.md): 1-6% faster
# than their bases at M = 16-256; at two CTAs per SM (t128x16 o2, 80 registers) 8-20% slower, so
# none is built there.
# t128x128 at TK = 64 (no spills there) lost 5-24% to the t128x128x128 bases on every one of the
# 29 entries it was timed on (H200, bench/data/sm90s-ov-tk64-ab-*.txt), so it is not built.
IN_FLIGHT = (((64, 128, 128), 1, C1), ((128, 64, 128), 1, C1), ((128, 64, 128), 1, C2), ((128, 32, 128), 1, C1),
             ((128, 16, 128), 1, C1), ((128, 32, 128), 1, K2), ((128, 32, 128), 1, K4), ((128, 64, 128), 1, K2))
# 8-bit weights: the double-buffered one-CTA tiles of SHAPES_U8 (the profiles' int8 picks at M = 16-64);
# on an H200 within 3% of their bases in fp16 (one entry 2.7% faster), 1-5% slower in bf16.
IN_FLIGHT_U8 = (((128, 16, 128), 1, C1), ((128, 16, 128), 1, K2), ((128, 64, 128), 1, C1))


def shapes_for(bits: int):
    return SHAPES if bits == 4 else SHAPES_U8


def in_flight_for(bits: int):
    return IN_FLIGHT if bits == 4 else IN_FLIGHT_U8


def catalog_shapes(bits: int):
    """``(tile, CTAs per SM, cluster, phased, half issue, in flight)`` of every catalog kernel: the
    shapes above, then again with half issue (``_hi``) those with one fragment set, no phase offset
    and no cluster (TN >= 32 at two CTAs per SM or TM = 256, and TN = 256), then the in-flight ones
    (``_ov``: IN_FLIGHT, IN_FLIGHT_U8). Both are profile candidates: at one fragment set a warpgroup
    converts a whole k-tile before its first wgmma (docs/notes/serving-mainloop.md, "Half issue");
    the in-flight ones were timed against their bases ("One batch in flight")."""
    plain = [shape + (False, False) for shape in shapes_for(bits)]
    half = [shape[:4] + (True, False) for shape in plain
            if shape[2] == C1 and not shape[3] and not double_buffered(shape[0], shape[1])]
    ahead = [(tile, ctas, cluster, False, False, True) for tile, ctas, cluster in in_flight_for(bits)]
    return plain + half + ahead


def kernel_of(tile, ctas_per_sm, cluster=C1, phased=False, half_issue=False, in_flight=False, *, dtype: str,
              bits: int) -> Sm90sConfig:
    return Sm90sConfig(dtype=dtype, bits=bits, tile=tile, ctas_per_sm=ctas_per_sm, cluster=cluster,
                       phased=phased, half_issue=half_issue, in_flight=in_flight).kernel


def default_catalog() -> List[Sm90sConfig]:
    return [kernel_of(*shape, dtype=dtype, bits=bits) for dtype in DTYPES for bits in BITS
            for shape in catalog_shapes(bits)]


@functools.lru_cache(maxsize=None)
def catalog_kernels() -> FrozenSet[Sm90sConfig]:
    """The catalog's compiled identities as a set (selection's refit asks it for every borrowed
    entry: built once)."""
    return frozenset(default_catalog())
