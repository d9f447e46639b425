"""The sm80 schedules ``mixed-gemm profile`` tries for one problem: catalog tiles that fit M, fused
(and, for comparison, parallel) split-K factors where the grid under-fills the GPU, and swizzles
where there are many tile rows."""
from __future__ import annotations

from typing import List

from .catalog import catalog_shapes

SPLITS = (2, 3, 4, 6, 8)        # fused split-K factors
PARALLEL_SPLITS = (2, 4)        # parallel split-K (a reduce kernel), for comparison
SWIZZLES = (4,)
MIN_K_TILES_PER_SLICE = 2


def candidate_schedules(m: int, n: int, k: int, sms: int, shapes=None, layout: str = "sm80") -> List[str]:
    """Schedules (see :attr:`Sm80Config.schedule`) worth timing for an ``m`` x ``n`` x ``k`` problem
    whose weight holds ``layout`` (the catalog's shapes for it, unless ``shapes`` is given)."""
    out: List[str] = []
    suffix = "" if layout == "sm80" else f"_{layout}"
    for (bm, bn, bk), (wm, wn, wk), stages in (catalog_shapes(layout) if shapes is None else shapes):
        # Tiles much taller than M only multiply padding work; tiny tiles at large M re-read B too often.
        if bm > max(16, 2 * m) or (m >= 1024 and bm < 128) or (m >= 256 and bm < 64):
            continue
        base = f"t{bm}x{bn}x{bk}_w{wm}x{wn}x{wk}_s{stages}{suffix}"
        out.append(base)
        tiles_m, tiles_n, k_tiles = -(-m // bm), -(-n // bn), -(-k // bk)
        if tiles_m * tiles_n < 2 * sms:
            out += [f"{base}_kfused{f}" for f in SPLITS if k_tiles // f >= MIN_K_TILES_PER_SLICE]
            out += [f"{base}_kparallel{f}" for f in PARALLEL_SPLITS if k_tiles // f >= MIN_K_TILES_PER_SLICE]
        if tiles_m >= 4:
            out += [f"{base}_sw{t}" for t in SWIZZLES]
    return out
