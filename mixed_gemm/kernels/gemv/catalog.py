"""The gemv family's default catalog: the compiled identities ``mixed-gemm build --all`` precompiles."""
from __future__ import annotations

from typing import List

from ..common import DTYPES, ZERO_MODES
from .config import LOWBIT_BITS, GemvConfig

# (tokens, strips per warp, (warps along N, warps along K), unroll, stage x in shared memory) for
# int4; int8 halves the unroll (the same bytes in flight per warp).
SHAPES = (
    (8, 2, (4, 2), 8, False),    # 128 rows x 16 atoms per CTA step: 16 KB in flight per CTA
    (8, 1, (2, 4), 16, False),   # 32-row tiles: many CTAs for the 4096-row shapes
    (8, 4, (2, 2), 4, False),    # 128 rows, fewer x loads per weight byte
    (8, 2, (8, 1), 8, False),    # 256 rows, no cross-warp reduction
    (8, 1, (4, 4), 8, False),
    (16, 2, (4, 2), 8, False),
    (16, 1, (2, 4), 8, False),
    (16, 2, (8, 1), 4, False),
    (32, 1, (4, 2), 4, False),
    (32, 2, (4, 2), 4, False),
    # x staged in shared memory (the M = 8..32 limit: see templates/gemv/gemv.cuh, kStageX)
    (8, 2, (4, 2), 8, True),
    (8, 4, (2, 2), 4, True),
    (16, 2, (4, 2), 8, True),
    (16, 1, (2, 4), 8, True),
    (16, 2, (8, 1), 4, True),
    (32, 1, (4, 2), 4, True),
    # More strips per warp: one x fragment feeds 4 or 8 weight atoms, so at 16-32 tokens the x
    # traffic through L1 stays below the weight's (2 strips: 16 tokens read 2x the weight's bytes).
    (16, 4, (2, 2), 4, True),
    (16, 8, (1, 4), 4, True),
    (16, 4, (2, 2), 4, False),
    (32, 4, (2, 2), 2, True),
    # A CTA per 16 or 32 rows with 8 K-warps of 16 atoms: an 8B-sized K (4096) is two steps and its
    # 4096-row shapes get 128-256 CTAs without split-K, so no fp32 planes and no last-CTA pass (the
    # latency the small shapes pay).
    (8, 1, (1, 8), 16, False),
    (8, 1, (2, 8), 8, False),
    # The same at 16 tokens, x staged: 4096x4096 at M=16 10.1 vs 10.6 µs for the best sm80 tile
    # (docs/notes/gemv.md).
    (16, 1, (1, 8), 8, True),
    # Twice the step (int8: u8, int4: u16 with x stages above 48 KB in dynamic shared memory):
    # int8 on 4096x4096 at M=16 11.6 -> 11.3 µs (docs/notes/gemv.md).
    (16, 1, (1, 8), 16, True),
    # CUDA-core FMA variant (1-4 tokens): no n8 padding, fp32 FMAs; timed beside the mma kernels.
    (1, 1, (1, 8), 16, False),
    (1, 1, (2, 8), 8, False),
    (1, 2, (4, 2), 8, False),
    (1, 4, (2, 2), 4, False),
    (2, 2, (4, 2), 8, False),
    (4, 2, (4, 2), 4, False),
)


# The sm80-layout kernel (16 tokens, strips of 64 columns, x staged), per zero mode: the one copy
# of Ampere/Ada read at decode.
SM80_SHAPES = (
    (16, 1, (4, 2), 4, True),
    (16, 1, (2, 4), 4, True),
)


# The lowbit layout (1-3 bits, 1:2-sparse 7 bits): unroll in whole 4-atom blocks; a 2-bit atom is
# half an int4 one, so the same unroll keeps half the bytes in flight: 16 and 32 atoms per step give
# a warp the int4 kernels' 1-2 KB (the u8 steps left the H100's 2-bit decode at ~1.1 TB/s).
LOWBIT_SHAPES = (
    (8, 2, (4, 2), 8, False),
    (8, 4, (2, 2), 8, False),
    (8, 2, (4, 2), 16, False),
    (8, 4, (2, 2), 16, False),
    (8, 2, (4, 2), 32, False),
    (8, 1, (2, 4), 32, False),   # 32-row tiles: CTAs for the 4096-row shapes
    (16, 4, (2, 2), 4, True),
    (16, 4, (2, 2), 8, True),
    (16, 4, (2, 2), 16, True),
    (32, 4, (2, 2), 4, True),
    (1, 2, (4, 2), 8, False),
    # int4's M=1 winners on the 8B and 70B qkv/o shapes (latency, not bytes: docs/notes/lowbit.md):
    # 256-row CTAs with no cross-warp reduction, and CTAs of 8 or 16 K-warps.
    (8, 2, (8, 1), 8, False),
    (8, 1, (1, 8), 16, False),
    (8, 1, (2, 8), 8, False),
    # The one-strip 16-token kernel int4 runs on 4096x4096: 8B o at M=16, 2-bit 11.3 -> 10.5 µs
    # against the sm80 tile (docs/notes/lowbit.md).
    (16, 1, (1, 8), 8, True),
    # The same with x stages above 48 KB (dynamic shared memory): a warp's share of a 4096-long K in
    # one step (8 tokens, 32 atoms) or two (16 tokens). 2-bit 4096x4096 at M=8 8.2 -> 7.8 µs, M=16
    # 10.5 -> 10.1; sparse 6144x4096 at M=8 14.5 -> 13.8 (docs/notes/lowbit.md).
    (8, 1, (1, 8), 32, True),
    (16, 1, (1, 8), 16, True),
)


# With a cp.async ring (templates/gemv/gemv_pipe.cuh): (tokens, strips per warp, warps, unroll,
# stages). Each warp keeps stages - 1 steps of weight (and x) in flight while it converts one, so a
# step need not hold a warp's whole share of the bytes in flight: fewer registers, more warps.
RING_SHAPES = (
    (8, 2, (4, 2), 8, 3),
    (8, 4, (2, 2), 8, 3),
    (8, 1, (1, 8), 16, 2),
    (8, 2, (4, 2), 4, 4),
    (16, 4, (2, 2), 4, 3),
    (16, 2, (4, 2), 4, 3),
    (32, 4, (2, 2), 2, 4),
)
LOWBIT_RING_SHAPES = (
    (8, 4, (2, 2), 8, 3),
    (8, 2, (4, 2), 8, 3),
    (8, 4, (2, 2), 16, 2),
    (8, 1, (2, 4), 32, 2),
    (16, 4, (2, 2), 4, 3),
    (16, 4, (2, 2), 4, 4),
    (16, 2, (4, 2), 4, 3),
    (16, 4, (4, 1), 8, 3),
    (32, 4, (2, 2), 4, 3),
    (32, 2, (4, 2), 4, 3),
)


# 1:2-sparse only (mma.sp, which the sm80 tiles cannot run: gemv serves it up to 32 tokens): 32-token
# rings whose x stage 8 N-warps share, (tokens, strips, warps, unroll, stages). They won 70B gate_up
# at M=32 (175 -> 161 µs) and bf16 8B o; the same at 16 tokens never won (docs/notes/lowbit.md).
SPARSE_RING_SHAPES = (
    (32, 1, (8, 1), 4, 3),
    (32, 2, (8, 1), 4, 2),
)


# Compiled for more CTAs per SM than ptxas would give them (``_o<N>``: __launch_bounds__(threads, N),
# the registers capped at 64K / (N x threads)): (tokens, strips, warps, unroll, stage x, N). More
# warps per SM keep more weight loads in flight at M=1 on the 8B-sized shapes (docs/notes/gemv.md:
# 6144x4096 11.1 -> 10.0 µs, 8192x8192 20.4 -> 19.1 µs).
OCCUPANCY_SHAPES = (
    (8, 1, (1, 8), 16, False, 3),
    (8, 2, (8, 1), 8, False, 3),
    (8, 1, (1, 8), 16, True, 4),
)


# Deferred group scaling (``_ds``, templates/atoms/deferred.cuh): the mma takes the codes in their
# offset encoding and each group's scale and zero are applied to the fp32 sums, 8-10 instructions
# per atom fewer: (tokens, strips, warps, unroll, stage x, occupancy). The A/B (docs/notes/gemv.md):
# 4096x4096 at M=1 8.0 -> 6.7 µs, 28672x4096 29.8 -> 25.2, 57344x8192 99 -> 91.
DEFERRED_SHAPES = (
    (8, 1, (1, 8), 16, False, 0),
    (8, 1, (1, 8), 16, True, 0),
    (8, 1, (2, 8), 8, False, 0),
    (8, 2, (4, 2), 8, False, 0),
    (8, 2, (4, 2), 8, True, 0),
    (8, 2, (8, 1), 8, False, 0),
    (8, 2, (8, 1), 8, False, 3),
    (16, 2, (4, 2), 8, True, 0),
    (16, 4, (2, 2), 4, True, 0),
    (32, 1, (4, 2), 4, True, 0),
)


# Deferred group scaling for 1-3 bits (``_ds``; not 1:2-sparse): (tokens, strips, warps, unroll,
# stages). The A/B (docs/notes/lowbit.md): 3-bit 57344x8192 at M=1 137 -> 126 µs, M=16
# 205 -> 197; 4096x4096 2- and 3-bit 4-5% faster; 2-bit's large shapes keep the plain ring.
LOWBIT_DEFERRED_SHAPES = (
    (8, 4, (2, 2), 8, 0),
    (8, 2, (8, 1), 8, 0),
    (8, 1, (1, 8), 16, 0),
    (8, 1, (2, 8), 8, 0),
    (8, 4, (2, 2), 8, 3),
    (8, 1, (2, 4), 32, 2),
    (16, 4, (2, 2), 4, 3),
    (32, 4, (2, 2), 4, 3),
)


# The low bits' 8-K-warp CTA compiled for 3 CTAs per SM (``_o3``, plain and ``_ds``; not
# 1:2-sparse's ``_ds``): (tokens, strips, warps, unroll). Without the per-pair fma the ``_ds`` u16
# loop needs ~100 registers, two 256-thread CTAs per SM; a third keeps more loads in flight. It won
# 6144x4096 at M 1-4 (15 entries, 1-4%); the same for the (8, 2, (8, 1), 8) CTA never won
# (docs/notes/lowbit.md).
LOWBIT_OCCUPANCY_SHAPES = (
    (8, 1, (1, 8), 16),
)


def _shape(tokens, strips, warps, unroll, stage_x=False, stages=0, occupancy=0, deferred=False) -> dict:
    return dict(tokens=tokens, strips=strips, warps=warps, unroll=unroll, stage_x=stage_x, stages=stages,
                occupancy=occupancy, deferred=deferred)


def shapes_for(bits: int, layout: str = "sm90a") -> List[dict]:
    """The catalog's kernel shapes for ``bits`` and ``layout``, as GemvConfig keyword arguments
    (tokens, strips, warps, unroll, stage_x, stages, occupancy, deferred); int8 halves the unroll of
    int4's (the same bytes per step)."""
    if layout == "lowbit" or bits in LOWBIT_BITS:
        deferred = [] if bits == 7 else [_shape(t, s, w, u, stages=st, deferred=True)
                                         for t, s, w, u, st in LOWBIT_DEFERRED_SHAPES]
        occupancy = [_shape(t, s, w, u, occupancy=3, deferred=ds) for t, s, w, u in LOWBIT_OCCUPANCY_SHAPES
                     for ds in ((False,) if bits == 7 else (False, True))]
        sparse = [_shape(t, s, w, u, stages=st) for t, s, w, u, st in SPARSE_RING_SHAPES] if bits == 7 else []
        return ([_shape(*shape) for shape in LOWBIT_SHAPES if bits != 7 or shape[0] >= 8]  # sparse: no FMA
                + [_shape(t, s, w, u, stages=st) for t, s, w, u, st in LOWBIT_RING_SHAPES] + deferred + occupancy
                + sparse)
    half = (lambda u: u) if bits == 4 else (lambda u: max(1, u // 2))
    if layout == "sm80":
        return [_shape(t, s, w, half(u), xs) for t, s, w, u, xs in SM80_SHAPES]
    return ([_shape(t, s, w, half(u), xs) for t, s, w, u, xs in SHAPES]
            + [_shape(t, s, w, half(u), stages=st) for t, s, w, u, st in RING_SHAPES]
            + [_shape(t, s, w, half(u), xs, occupancy=oc) for t, s, w, u, xs, oc in OCCUPANCY_SHAPES]
            + [_shape(t, s, w, half(u), xs, occupancy=oc, deferred=True) for t, s, w, u, xs, oc in DEFERRED_SHAPES])


def default_catalog() -> List[GemvConfig]:
    sm90a = [GemvConfig(dtype=d, bits=b, **shape) for d in DTYPES for b in (4, 8) for shape in shapes_for(b)]
    sm80 = [GemvConfig(dtype=d, bits=b, zero_mode=z, layout="sm80", **shape)
            for d in DTYPES for b in (4, 8) for z in ZERO_MODES for shape in shapes_for(b, "sm80")]
    lowbit = [GemvConfig(dtype=d, bits=b, layout="lowbit", **shape)
              for d in DTYPES for b in LOWBIT_BITS for shape in shapes_for(b, "lowbit")]
    return sm90a + sm80 + lowbit
