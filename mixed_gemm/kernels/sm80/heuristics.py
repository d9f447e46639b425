"""The sm80 family's choice when no profile covers a problem, kept as data.

Small M is memory-bound: stream B once with as many bytes in flight as possible, so thin tiles
with K split over warps, and split-K across blocks until the grid covers the GPU
``SPLIT_K_TARGET_WAVES`` times. The split-K mode is "fused" (the last slice of a tile sums the
others): on the H100 parallel split-K beat no split by 15-50% on every decode shape with
N <= 10240 (docs/notes/sm80.md), and the fused variant drops its second launch. Serial split-K lost
to its slice-by-slice epilogue beyond 2 slices. Mid M is math-bound on mma.sync: square tiles
amortize the dequantization over 64 rows per warp. Above ``ROWS[-1]`` the family passes (the
dequant_mm family takes large M: cuBLAS's Hopper kernels outrun mma.sync there).
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..common import split_for_fill, split_for_waves
from .config import Sm80Config

# (max M, schedule); schedules name catalog kernels (tests/kernels/test_sm80_heuristics.py checks).
ROWS: Tuple[Tuple[int, str], ...] = (
    (16, "t16x64x128_w1x1x4_s4"),
    (64, "t64x128x64_w2x2x1_s4"),
    (512, "t128x128x64_w2x2x1_s4"),
)
# The atom layouts (sm90a; lowbit from 9 tokens, gemv taking up to 8): the decode tiles with the
# layout's schedule suffix. On lowbit, with the fused split below, within 1.07x of the best profiled
# schedule on the H100 (geomean; worst 1.23x; docs/notes/selection.md).
DECODE_ROWS: Tuple[Tuple[int, str], ...] = ((16, "t16x64x128_w1x1x4_s4"), (32, "t32x64x128_w1x1x4_s4"))
ROWS_BY_LAYOUT = {"sm80": ROWS, **{layout: tuple((m, f"{s}_{layout}") for m, s in DECODE_ROWS)
                                   for layout in ("sm90a", "lowbit")}}
SPLIT_K_MODE = "fused"
SPLIT_K_BELOW_WAVES = 2       # split only grids smaller than this many blocks per SM
SPLIT_K_TARGET_WAVES = 4      # blocks per SM to aim for when splitting K
SPLIT_K_MIN_TILES = 4         # k-tiles each slice keeps at least
SPLIT_K_MAX = 4               # the largest factor measured to help (8 not yet profiled)


def split_k_for(blocks: int, k_tiles: int, sms: int) -> int:
    """Slices that bring ``blocks`` up to the target waves, keeping SPLIT_K_MIN_TILES k-tiles each."""
    if blocks >= SPLIT_K_BELOW_WAVES * sms:
        return 1
    want = -(-SPLIT_K_TARGET_WAVES * sms // max(blocks, 1))
    return max(1, min(want, k_tiles // SPLIT_K_MIN_TILES, SPLIT_K_MAX))


def heuristic_config(m: int, *, n: int, k: int, dtype: str, bits: int, zero_mode: str,
                     sms: int, layout: str = "sm80") -> Optional[Sm80Config]:
    """The config of the first row whose max M covers ``m`` (None above the last row), with
    split-K where the grid under-fills ``sms`` multiprocessors. On the ``sm90a`` layout only the
    decode row (the catalog compiles the thin tiles for it; the wgmma family takes larger M); on the
    ``lowbit`` layout 9-32 tokens (dequant_mm takes larger M)."""
    rows = ROWS_BY_LAYOUT[layout]
    for max_m, schedule in rows:
        if m <= max_m:
            break
    else:
        return None
    config = Sm80Config.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=zero_mode)
    bm, bn, bk = config.tile
    blocks = -(-m // bm) * -(-n // bn)
    splits = split_k_for(blocks, -(-k // bk), sms)
    if splits > 1:
        config = config.replace(split_k_mode=SPLIT_K_MODE, split_k=splits)
    return config


REFIT_FROM_BM = 64  # tiles this tall fill an SM alone (shared memory), so blocks run in whole waves


def refit_split_k(config: Sm80Config, problem, sms: int, measured) -> Sm80Config:
    """The split-K factor of a split config measured on ``measured``, re-chosen for ``problem``
    (both :class:`~mixed_gemm.kernels.base.Problem`): tiles of REFIT_FROM_BM rows and up fill an SM
    alone and run in whole waves (:func:`split_for_waves`); thinner decode tiles share SMs and
    stream memory, so they keep the measured CTA count where the shape has fewer N tiles and the
    factor would under-fill the GPU (:func:`split_for_fill`). Unsplit configs stay unsplit."""
    bm, bn, bk = config.tile
    if config.split_k == 1:
        return config
    k_tiles = -(-problem.k // bk)
    if bm >= REFIT_FROM_BM:
        best = split_for_waves(config.split_k, -(-problem.m // bm) * -(-problem.n // bn), k_tiles, sms)
    else:
        best = split_for_fill(config.split_k, -(-measured.n // bn), -(-problem.n // bn), k_tiles, sms)
    return config if best == config.split_k else config.replace(split_k=best)
