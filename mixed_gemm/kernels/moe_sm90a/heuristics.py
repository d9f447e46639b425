"""The moe_sm90a family's choices when no profile covers a problem (unmeasured first guesses;
bench/NOTES.md has the measurements that revise them).

- When it runs: once the routed experts hold ``MIN_REUSE`` pairs each on average (random routing,
  ``moe_gemv.heuristics.expected_experts``): below that an expert's weight is read by few rows and
  moe_gemv's decode kernels (no sort, no gathers, two launches) are the better trade.
- The tile along the routed rows: the narrowest of the catalog's whose rows cover the mean pairs
  per routed expert (``ROWS``): an expert's weight tile is read once per tile of its rows.
"""
from __future__ import annotations

from typing import Optional

from ..base import MoeProblem
from ..moe_gemv.heuristics import expected_experts
from .config import MoeSm90aConfig

MIN_REUSE = 24
ROWS = ((48, 32), (96, 64), (192, 128), (None, 256))  # (mean pairs per routed expert below, tile N)


def reuse(problem: MoeProblem) -> float:
    """Mean pairs per routed expert under random routing."""
    return problem.pairs / max(1e-9, expected_experts(problem.tokens, problem.top_k, problem.experts))


def heuristic_config(problem: MoeProblem) -> Optional[MoeSm90aConfig]:
    r = reuse(problem)
    if r < MIN_REUSE:
        return None
    tn = next(t for bound, t in ROWS if bound is None or r < bound)
    return MoeSm90aConfig(stage=problem.stage, tile=(128, tn, 64), **problem.kind)
