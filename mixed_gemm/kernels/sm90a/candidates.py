"""The sm90a schedules ``mixed-gemm profile`` tries for one problem: catalog tiles whose token
tile M fills reasonably, their tile K compatible with the group size, and for cooperative kernels
the stream-K scheduler's decompositions (data-parallel, stream-K, split-K factors) where the tiles
leave SMs idle."""
from __future__ import annotations

from typing import List

from .catalog import shapes_for

SPLITS = (2, 3, 4, 6)
MIN_K_TILES = 4
FROM_M = 16  # the 32-token tile with split-K competes with gemv from here
ORDERS = ("_sw4_rm", "_sw4_rn")  # tile orders tried for grids of many waves
MANY_WAVES = 4


def candidate_schedules(m: int, n: int, k: int, group_size: int, sms: int, bits: int = 4, shapes=None) -> List[str]:
    if m < FROM_M:
        return []
    out: List[str] = []
    for (tm, tn, tk), kind, (cm, cn), stages in (shapes_for(bits) if shapes is None else shapes):
        if group_size != k and group_size % tk:
            continue
        # Token tiles far wider than M only multiply padding work; thin ones at large M re-read W.
        if tn > max(16, 2 * m) or (m >= 512 and tn < 128) or (m >= 128 and tn < 64):
            continue
        base = f"t{tm}x{tn}x{tk}_{kind}_c{cm}x{cn}_s{stages}"
        tiles = -(-n // tm) * -(-m // tn)
        if kind == "pp":
            out.append(base)
            continue
        out.append(base + "_dp")
        if tiles >= MANY_WAVES * sms:
            out += [base + "_dp" + order for order in ORDERS]
        if tiles < 2 * sms:
            out.append(base + "_sk")
            out += [f"{base}_split{s}" for s in SPLITS if -(-k // tk) // s >= MIN_K_TILES and tiles * s <= 4 * sms]
    return out
