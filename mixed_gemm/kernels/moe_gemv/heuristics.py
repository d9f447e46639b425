"""The moe_gemv family's choices when no profile covers a problem, kept as data (none of it is
measured yet: the numbers follow gemv's, docs/moe-plan.md section 5.1).

- The schedule per stage and token count (``ROWS``): up to ``SMALL_T`` tokens, 64-output CTAs with
  K split over two warps (more CTAs for the few pairs there are), above them 128-output CTAs.
- ``splits``: K is split across CTAs until the row tiles x pairs (w13) or x slots x tokens (w2)
  reach ``CTAS_PER_SM`` per SM, keeping every split non-empty and the fp32 planes under
  ``WORKSPACE_FLOATS``.
- The down projection spreads a token's top-k slots over CTAs (fp32 planes, added in slot order by
  the last to arrive) until the tokens alone fill the GPU (``CTAS_PER_SM`` CTAs per SM) or the
  planes outgrow ``WORKSPACE_FLOATS``; then each CTA loops over its token's slots (``_kloop``).
- ``pays``: pair mode reads an expert once per pair that routes to it; ``moe`` takes it while the
  pairs are at most ``PAIR_REREAD`` times the experts (each expert re-read a few times, mostly from
  L2), and under CUDA-graph capture always (the per-expert loop reads the routing on the host).
"""
from __future__ import annotations

from ..base import MoeProblem
from .config import MAX_SPLITS, MoeGemvConfig

CTAS_PER_SM = 4
WORKSPACE_FLOATS = 1 << 24  # 64 MB of split-K / slot planes per launch at most
PAIR_REREAD = 4
SMALL_T = 4
# (stage, max tokens or None, schedule) for int4; int8 halves the unroll (catalog.shapes_for).
ROWS = (
    ("w13", SMALL_T, "w13_s1_w4x2_u8"), ("w13", None, "w13_s2_w4x1_u8"),
    ("w2", SMALL_T, "w2_s1_w4x2_u8"), ("w2", None, "w2_s2_w4x2_u8"),
)


def pays(tokens: int, top_k: int, experts: int) -> bool:
    """Is pair mode worth it outside capture (``tokens`` x ``top_k`` pairs over ``experts``)?"""
    return tokens * top_k <= PAIR_REREAD * experts


def schedule_for(problem: MoeProblem) -> str:
    return next(s for stage, max_t, s in ROWS if stage == problem.stage and (max_t is None or problem.tokens <= max_t))


def launch_fields(config: MoeGemvConfig, problem: MoeProblem, sms: int) -> MoeGemvConfig:
    """``config`` with the launch-time fields (``splits``, ``slot_loop``) for ``problem``."""
    row_tiles = config.launch_geometry(problem.n, problem.k)[0]
    tokens = max(1, problem.tokens)
    outputs = problem.n // 2 if config.gated else problem.n
    slot_loop = False
    if not config.gated and problem.top_k > 1:
        planes = tokens * problem.top_k * outputs
        slot_loop = tokens * row_tiles >= CTAS_PER_SM * sms or planes > WORKSPACE_FLOATS
    if config.gated:
        ctas, plane = tokens * problem.top_k * row_tiles, tokens * problem.top_k * problem.n
    else:  # slot groups per token: one (the CTA loops over the slots) or one per slot
        groups = 1 if slot_loop else problem.top_k
        ctas, plane = tokens * groups * row_tiles, tokens * groups * outputs
    want = -(-CTAS_PER_SM * sms // ctas)
    splits = max(1, min(want, config.steps(problem.k), MAX_SPLITS, WORKSPACE_FLOATS // max(1, plane)))
    return config.replace(splits=splits, slot_loop=slot_loop)


def heuristic_config(problem: MoeProblem, sms: int) -> MoeGemvConfig:
    config = MoeGemvConfig.from_schedule(schedule_for(problem), **problem.kind)
    if problem.bits == 8:
        config = config.replace(unroll=max(1, config.unroll // 2))
    return launch_fields(config, problem, sms)
