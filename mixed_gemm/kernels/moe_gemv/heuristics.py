"""The moe_gemv family's choices when no profile covers a problem, kept as data (pair mode's
schedules follow the H100 profile's winners at 1-4 tokens; the mode crossovers are still guesses
that follow gemv's numbers, docs/notes/moe.md).

- Pair mode or expert mode. Pair mode streams an expert's weight once per pair routed to it;
  expert mode once per ``tokens`` (8 or 16) of its pairs, for the price of a routing scan per CTA
  and mma n8 tiles that are padding below 8 pairs. With random routing the experts that get a pair
  number ``E (1 - (1 - k/E)^T)`` on average (``expected_experts``), so a routed expert holds
  ``reuse = T k / that`` pairs. Expert mode is taken from ``T >= 2`` once ``reuse >=
  EXPERT_MIN_REUSE`` (T = 1 is always pair mode: k distinct experts, one pass each either way),
  with 8-token chunks while ``reuse <= 4`` and 16-token chunks above (``EXPERT_ROWS``). Its down
  kernel always writes fp32 planes per pair (a token's slots are in different CTAs), so past
  ``WORKSPACE_FLOATS`` of them the down projection stays in pair mode (``_kloop``, no planes).
  For the presets that means expert mode from T = 16 (Qwen3-30B-A3B, E=128 k=8), T = 4 (Mixtral,
  E=8 k=2) and T = 8 (DeepSeek-V2-Lite, E=64 k=6). Unmeasured: the crossover is a guess.
- The schedule per stage and token count (``ROWS``, pair mode): up to ``SMALL_T`` tokens (down: one),
  64-output CTAs with K split over two warps (more CTAs for the few pairs there are), above them
  128-output CTAs;
  gate|up takes the 32-output CTAs with K over four warps (``NARROW``) while the 64-output grid
  (pairs x row tiles) would not exceed the SMs; the down projection takes the 128-output CTAs from
  two tokens on (as its winners did). Pair mode applies the group parameters to the sums
  (``_ds``): measured on the H100 (profiles/h100.json at 1-4 tokens, the three presets), every stage
  winner is a ``_ds`` schedule, and the 32-output one took the small experts' gate|up at one token
  (Qwen3-30B-A3B 96 -> 192 CTAs: ~10.3 -> 8.1 µs).
- ``splits``: K is split across CTAs until the row tiles x pairs (w13) or x slots x tokens (w2) --
  in expert mode x the expected routed experts x their chunks -- reach ``CTAS_PER_SM`` per SM
  (``DEFERRED_CTAS_PER_SM`` for ``_ds``: its winners split only where the CTAs were fewer than the
  SMs), keeping every split non-empty and the fp32 planes under ``WORKSPACE_FLOATS``.
- The down projection (pair mode) spreads a token's top-k slots over CTAs (fp32 planes, added in
  slot order by the last to arrive) until the tokens alone fill the GPU (``CTAS_PER_SM`` CTAs per
  SM) or the planes outgrow ``WORKSPACE_FLOATS``; then each CTA loops over its token's slots (``_kloop``).
- Persistent mode (``_m<tokens>_pe``) before both, for many small experts: from
  ``PERSISTENT_MIN_EXPERTS`` experts, up to ``EXPERT_MAX_TOKENS`` tokens, while its rules hold
  (pairs and experts sorted in shared memory) and its per-pair planes fit ``WORKSPACE_FLOATS``.
  Each touched expert's bytes then cross HBM once at every T, and the K split fills the GPU from
  the expected touched experts alone (Qwen3-30B-A3B and DeepSeek-V2-Lite at 1-256 tokens; Mixtral's
  8 large experts keep pair / expert mode, whose numbers are measured). 8-token passes while the
  expected pairs per touched expert are at most ``PERSISTENT_M8_REUSE``, 16 above. Off by default
  (``PERSISTENT_BY_DEFAULT``) until a graph-timed A/B decides: its first H100 timings were eager
  against the other modes' graph replays, host syncs included, so inconclusive (docs/notes/moe.md);
  it stays a profile candidate.
- ``pays``: ``moe`` takes the grouped path outside capture for every decode-size T (at most
  ``EXPERT_MAX_TOKENS`` tokens: expert mode reads each routed expert about once per 16 of its pairs)
  and, above it, while pair mode's re-reads stay few (``T k <= PAIR_REREAD E``); under CUDA-graph
  capture always (the per-expert loop reads the routing on the host). Above that the per-expert
  loop (dense GEMMs per expert) remains.
"""
from __future__ import annotations

from ..base import MoeProblem
from .catalog import expert_shapes_for, persistent_shapes_for
from .config import (MAX_SPLITS, PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS, PERSISTENT_MAX_TOP_K,
                     MoeGemvConfig)

CTAS_PER_SM = 4
DEFERRED_CTAS_PER_SM = 1
WORKSPACE_FLOATS = 1 << 24  # 64 MB of split-K / slot planes per launch at most
PAIR_REREAD = 4
SMALL_T = 4
# (stage, max tokens or None, schedule) for int4; int8 halves the unroll (catalog.shapes_for).
ROWS = (
    ("w13", SMALL_T, "w13_s1_w4x2_u8_ds"), ("w13", None, "w13_s2_w4x1_u8_ds"),
    ("w2", 1, "w2_s1_w4x2_u8_ds"), ("w2", None, "w2_s2_w4x2_u8_ds"),
)
NARROW = "w13_s1_w2x4_u8_ds"  # gate|up while the pairs x 64-output row tiles are fewer than the SMs
EXPERT_MIN_REUSE = 1.25   # expected pairs per routed expert from which expert mode runs (unmeasured)
EXPERT_MAX_TOKENS = 256   # pays(): the grouped path for every T up to this
# Expert mode: (stage, max expected pairs per routed expert or None, chunk tokens).
# 8-token chunks only while the mean is half a chunk: random routing spreads the counts, and an
# expert past 8 pairs would take a second pass (Mixtral at T = 16: 4 on average, up to 16).
EXPERT_ROWS = (("w13", 4, 8), ("w13", None, 16), ("w2", 4, 8), ("w2", None, 16))
PERSISTENT_MIN_EXPERTS = 16  # persistent mode from this many experts (unmeasured)
PERSISTENT_M8_REUSE = 4      # 8-token passes up to this many expected pairs per touched expert
PERSISTENT_BY_DEFAULT = False  # until a graph-timed bench/moe_modes.py run decides (module docstring)


def pays(tokens: int, top_k: int, experts: int) -> bool:
    """Is the grouped path worth it outside capture (``tokens`` x ``top_k`` pairs over ``experts``)?"""
    return tokens <= EXPERT_MAX_TOKENS or tokens * top_k <= PAIR_REREAD * experts


def expected_experts(tokens: int, top_k: int, experts: int) -> float:
    """Experts with at least one pair under uniform random top-k routing (k distinct per token)."""
    k = min(top_k, experts)
    return experts * (1.0 - (1.0 - k / experts) ** max(1, tokens))


def reuse(problem: MoeProblem) -> float:
    """Expected pairs per routed expert: pair mode's passes over each routed expert's weight."""
    tokens = max(1, problem.tokens)
    return tokens * problem.top_k / max(1e-9, expected_experts(tokens, problem.top_k, problem.experts))


def by_expert(problem: MoeProblem) -> bool:
    """Expert mode for this projection (module docstring)?"""
    if problem.tokens < 2 or reuse(problem) < EXPERT_MIN_REUSE:
        return False
    return problem.stage == "w13" or problem.pairs * problem.n <= WORKSPACE_FLOATS  # down: planes per pair


def persistent(problem: MoeProblem) -> bool:
    """Persistent mode for this projection (module docstring)?"""
    if not (problem.experts >= PERSISTENT_MIN_EXPERTS and 1 <= problem.tokens <= EXPERT_MAX_TOKENS):
        return False
    if problem.pairs > PERSISTENT_MAX_PAIRS or problem.experts > PERSISTENT_MAX_EXPERTS:
        return False
    return problem.top_k <= PERSISTENT_MAX_TOP_K and problem.pairs * problem.n <= WORKSPACE_FLOATS


def persistent_config(problem: MoeProblem) -> MoeGemvConfig:
    tokens = 8 if reuse(problem) <= PERSISTENT_M8_REUSE else 16
    stage, strips, warps, unroll, tokens = persistent_shapes_for(problem.bits, problem.stage, tokens)[0]
    return MoeGemvConfig(stage=stage, strips=strips, warps=warps, unroll=unroll, tokens=tokens, persistent=True,
                         **problem.kind)


def schedule_for(problem: MoeProblem, sms: int) -> str:
    schedule = next(s for stage, max_t, s in ROWS if stage == problem.stage and (max_t is None or problem.tokens <= max_t))
    if problem.stage == "w13" and problem.tokens <= SMALL_T:
        row_tiles = MoeGemvConfig.from_schedule(schedule).launch_geometry(problem.n, problem.k)[0]
        if problem.pairs * row_tiles <= sms:
            return NARROW
    return schedule


def expert_config(problem: MoeProblem) -> MoeGemvConfig:
    r = reuse(problem)
    tokens = next(t for stage, max_r, t in EXPERT_ROWS if stage == problem.stage and (max_r is None or r <= max_r))
    stage, strips, warps, unroll, tokens = expert_shapes_for(problem.bits, problem.stage, tokens)[0]
    return MoeGemvConfig(stage=stage, strips=strips, warps=warps, unroll=unroll, tokens=tokens, by_expert=True,
                         **problem.kind)


def launch_fields(config: MoeGemvConfig, problem: MoeProblem, sms: int) -> MoeGemvConfig:
    """``config`` with the launch-time fields (``splits``, ``slot_loop``) for ``problem``."""
    row_tiles = config.launch_geometry(problem.n, problem.k)[0]
    tokens = max(1, problem.tokens)
    outputs = problem.n // 2 if config.gated else problem.n
    if config.tiled:  # planes per (pair, slice) of the weight's n rows (w13: gate and up; w2: H)
        active = expected_experts(tokens, problem.top_k, problem.experts)
        # expert mode: a CTA per chunk of an expert's pairs; persistent mode: per (expert, row tile, slice)
        chunks = 1 if config.persistent else max(1, -(-int(reuse(problem) + 0.999) // config.tokens))
        ctas, plane = max(1, int(row_tiles * active * chunks)), tokens * problem.top_k * problem.n
        want = -(-CTAS_PER_SM * sms // ctas)
        splits = max(1, min(want, config.steps(problem.k), MAX_SPLITS, WORKSPACE_FLOATS // max(1, plane)))
        return config.replace(splits=splits, slot_loop=False)
    slot_loop = False
    if not config.gated and not config.slot_warps and problem.top_k > 1:
        planes = tokens * problem.top_k * outputs
        slot_loop = tokens * row_tiles >= CTAS_PER_SM * sms or planes > WORKSPACE_FLOATS
    if config.gated:
        ctas, plane = tokens * problem.top_k * row_tiles, tokens * problem.top_k * problem.n
    else:  # slot groups per token: one (the CTA loops over the slots), one per slot, or _sw's
        groups = config.replace(slot_loop=slot_loop).slot_group(problem.top_k)[1]
        ctas, plane = tokens * groups * row_tiles, tokens * groups * outputs
    want = -(-(DEFERRED_CTAS_PER_SM if config.deferred else CTAS_PER_SM) * sms // ctas)
    splits = max(1, min(want, config.steps(problem.k), MAX_SPLITS, WORKSPACE_FLOATS // max(1, plane)))
    return config.replace(splits=splits, slot_loop=slot_loop)


def heuristic_config(problem: MoeProblem, sms: int, persistent_mode: bool = PERSISTENT_BY_DEFAULT) -> MoeGemvConfig:
    """The config for ``problem``; ``persistent_mode=True``: persistent mode where its rule holds,
    else the choice among pair and expert mode alone."""
    if persistent_mode and persistent(problem):
        return launch_fields(persistent_config(problem), problem, sms)
    if by_expert(problem):
        return launch_fields(expert_config(problem), problem, sms)
    config = MoeGemvConfig.from_schedule(schedule_for(problem, sms), **problem.kind)
    if problem.bits == 8:
        config = config.replace(unroll=max(1, config.unroll // 2))
    return launch_fields(config, problem, sms)
