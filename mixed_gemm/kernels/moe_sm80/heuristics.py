"""The moe_sm80 family's choice when no profile covers a problem. It is the Ampere/Ada counterpart
of moe_sm90a (which GROUPED_FAMILIES asks first, and which takes these problems on an H100): it runs
once the routed experts hold ``moe_sm90a.heuristics.MIN_REUSE`` pairs each on average, where
moe_gemv's expert mode re-reads each expert's weight per chunk of 8-16 rows. Not yet measured on an
Ampere GPU (none is available): the threshold and the tiles are the H100's, to re-fit there.

The gate|up kernel of the 128-row tiles is the fused one (x's rows read by index: the gather pass
and its (pairs, H) copy are gone, and the kernel's rows are the same); the down kernel stays
unfused (its slot-ordered combine is deterministic, the fused down's fp32 atomics are not for
top-k > 2): a profile may pick the fused down (``_f``) where it measured faster."""
from __future__ import annotations

from typing import Optional

from ..base import MoeProblem
from ..moe_sm90a.heuristics import MIN_REUSE, reuse
from .config import MoeSm80Config

ROWS = ((48, (64, 128, 64), (2, 2, 1), 4), (512, (128, 128, 64), (2, 2, 1), 4),
        (None, (128, 256, 64), (2, 4, 1), 3))  # (mean pairs per routed expert below, tile, warps, stages)


def heuristic_config(problem: MoeProblem) -> Optional[MoeSm80Config]:
    r = reuse(problem)
    if r < MIN_REUSE:
        return None
    _, tile, warps, stages = next(row for row in ROWS if row[0] is None or r < row[0])
    fused = problem.stage == "w13" and tile[0] == 128
    return MoeSm80Config(stage=problem.stage, tile=tile, warps=warps, stages=stages, fused=fused, **problem.kind)
