"""The moe_sm90a family's choices when no profile covers a problem, from the H100 sweep of the
three MoE presets (``mixed-gemm profile-moe``, docs/notes/moe.md):

- When it runs: once the routed experts hold ``MIN_REUSE`` pairs each on average (random routing,
  ``moe_gemv.heuristics.expected_experts``). Measured: Mixtral at 32 tokens (8 pairs per expert)
  already ran faster here than moe_gemv's expert mode (305 vs 356 µs gate|up), at 16 (4 per expert)
  not; Qwen3-30B-A3B and DeepSeek-V2-Lite at 64 tokens (4-6 per expert) split by projection.
- The tile along the routed rows (``ROWS``): 32 rows up to ~24 pairs per expert (Qwen3 at 256
  tokens, 16 per expert), 128 up to a few hundred (Mixtral at 256 and 1024 tokens), 256 beyond
  (Mixtral at 4096, 1024 per expert: 3582 vs ~3900 µs gate|up).
"""
from __future__ import annotations

from typing import Optional

from ..base import MoeProblem
from ..moe_gemv.heuristics import expected_experts
from .config import MoeSm90aConfig

MIN_REUSE = 8
ROWS = ((24, 32), (48, 64), (512, 128), (None, 256))  # (mean pairs per routed expert below, tile N)


def reuse(problem: MoeProblem) -> float:
    """Mean pairs per routed expert under random routing."""
    return problem.pairs / max(1e-9, expected_experts(problem.tokens, problem.top_k, problem.experts))


def heuristic_config(problem: MoeProblem) -> Optional[MoeSm90aConfig]:
    r = reuse(problem)
    if r < MIN_REUSE:
        return None
    tn = next(t for bound, t in ROWS if bound is None or r < bound)
    return MoeSm90aConfig(stage=problem.stage, tile=(128, tn, 64), **problem.kind)
