"""The moe_sm90s schedules worth timing for one projection: every catalog tile whose token tile
is at most twice the mean pairs per routed expert (a CTA's x rows mostly belong to its expert) and
at least half of it up to 64 rows, from
2 to ``TO_TOKENS`` tokens, each whole, on a persistent grid (``_p``) and with the K split that would
fill the SMs were the routed experts' tiles alone, and each again with half issue (``_hi``) where the
tile has one fragment set, for the gate|up stage with the gather (``_g``) where the tile has it, and
for the down stage each again with the combine in its epilogue (``_f``) and, one K slice, with the
staged epilogue (``_se``) where the catalog has the tile (random routing,
``moe_gemv.heuristics.expected_experts``)."""
from __future__ import annotations

from typing import List

from ..base import MoeProblem
from ..moe_gemv.heuristics import expected_experts
from ..sm90s.config import MAX_SPLITS
from .catalog import BITS, gather_tiles, half_issue_tiles, staged_tiles, tiles_for
from .config import MoeSm90sConfig

# Up to prefill: the 4-D weight TMA takes any expert without a tensormap rewrite, so the many small
# experts' 1024-4096 token layers are worth timing against the CUTLASS grouped kernels (moe_sm90a).
FROM_TOKENS, TO_TOKENS = 2, 4096


def _routed(problem: MoeProblem):
    """(experts random routing touches, mean pairs per touched expert)."""
    routed = expected_experts(problem.tokens, problem.top_k, problem.experts)
    return routed, problem.pairs / max(routed, 1e-9)


def splits_for(problem: MoeProblem, tile, sms: int, routed=None) -> int:
    """K slices that fill ``sms`` with the CTAs of the experts random routing touches (``routed``:
    :func:`_routed` of ``problem``, when the caller has it)."""
    tm, tn, tk = tile
    experts, per_expert = routed or _routed(problem)
    ctas = experts * -(-problem.n // tm) * max(1, -(-int(per_expert) // tn))
    k_tiles = -(-problem.k // tk)
    return max(1, min(sms // max(1, int(ctas)), k_tiles // 4, MAX_SPLITS))


def candidate_schedules(problem: MoeProblem, sms: int) -> List[str]:
    if problem.bits not in BITS or not FROM_TOKENS <= problem.tokens <= TO_TOKENS:
        return []
    routed = _routed(problem)
    per_expert = routed[1]
    out = []
    for tile in tiles_for(problem.bits):
        if tile[1] > max(16, 2 * per_expert) or tile[1] < min(64, per_expert / 2):
            continue  # mostly padding, or (prefill) x re-read for many small token tiles
        splits = splits_for(problem, tile, sms, routed)
        gathers = (False, True) if problem.stage == "w13" and tile in gather_tiles(problem.bits) else (False,)
        for half_issue in (False, True) if tile in half_issue_tiles(problem.bits) else (False,):
            for gather in gathers if not half_issue else (False,):  # the catalog's _g tiles: no _hi
                base = MoeSm90sConfig(stage=problem.stage, tile=tile, half_issue=half_issue, gather=gather)
                launches = [base, base.replace(persistent=True)] + ([base.replace(splits=splits)] if splits > 1 else [])
                out += [c.schedule for c in launches]
                if problem.stage == "w2":
                    out += [c.replace(combine=True).schedule for c in launches]
                    if not half_issue and tile in staged_tiles(problem.bits):
                        out += [c.replace(staged=True).schedule for c in (base, base.replace(persistent=True))]
    return out
