"""The gemv schedules ``mixed-gemm profile`` tries for one problem: every catalog shape whose token
tile holds M and is not more than 4x wider than needed, at split counts around the one that gives
each SM a few CTAs."""
from __future__ import annotations

from typing import List

from .catalog import shapes_for
from .config import MAX_SPLITS, GemvConfig
from .heuristics import MAX_M, splits_for


def candidate_schedules(m: int, n: int, k: int, sms: int, bits: int = 4, layouts=("sm90a",)) -> List[str]:
    """``layouts``: those the weight holds; the sm90a kernels where it has that copy, else the
    sm80-layout ones."""
    layout = "lowbit" if "lowbit" in layouts else ("sm90a" if "sm90a" in layouts else "sm80")
    if m > MAX_M or layout not in layouts:
        return []
    out: List[str] = []
    for shape in shapes_for(bits, layout):
        tokens = shape["tokens"]
        if tokens < m or (layout != "sm80" and tokens > 8 and tokens >= 4 * m):  # sm80: always 16
            continue
        base = GemvConfig(bits=bits, layout=layout, **shape)
        steps = base.steps(k)
        best = splits_for(base, n, k, sms)
        for s in sorted({1, max(1, best // 2), best, min(2 * best, steps, MAX_SPLITS)}):
            out.append(base.replace(splits=s).schedule)
    return out
