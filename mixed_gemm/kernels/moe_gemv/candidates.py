"""The moe_gemv schedules worth timing for one projection: every catalog shape of its stage (pair
mode with and without deferred group parameters, ``_ds``; the deferred gate|up ones also with the
page touch before the main loop, ``_tp``, which a kernel package holds only where a profile names
it), at
split counts around the heuristic's (and, for the down projection, with and without ``_kloop``;
up to ``SW_MAX_TOKENS`` tokens also the slot-warps shapes, ``_sw``, at one slice and the heuristic's);
from two tokens on, the expert-mode shapes too (their down kernel while its per-pair planes fit);
the persistent-mode shapes at every token count their rules allow (pairs and experts sorted in
shared memory, per-pair planes within the workspace cap). The one-launch persistent mode (``_pe1``)
cannot be timed one projection at a time: :func:`layer_candidates` gives its (gate|up, down) pairs,
which the profiler times as a layer."""
from __future__ import annotations

import itertools
from typing import List, Tuple

from ..base import MoeProblem
from .catalog import expert_shapes_for, persistent_shapes_for, shapes_for, slot_warp_shapes_for
from .config import (GRID_Z, MAX_SPLITS, PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS, PERSISTENT_MAX_TOP_K,
                     MoeGemvConfig)
from .heuristics import WORKSPACE_FLOATS, launch_fields

SW_MAX_TOKENS = 8


def candidate_schedules(problem: MoeProblem, sms: int) -> List[str]:
    out: List[str] = []
    for (stage, strips, warps, unroll), deferred in itertools.product(shapes_for(problem.bits, problem.stage),
                                                                      (False, True)):
        base = launch_fields(MoeGemvConfig(bits=problem.bits, stage=stage, strips=strips, warps=warps, unroll=unroll,
                                           deferred=deferred), problem, sms)
        loops = (base.slot_loop,) if stage == "w13" or problem.top_k == 1 else (False, True)
        for slot_loop in loops:
            best, steps = base.splits, base.steps(problem.k)
            for s in sorted({1, max(1, best // 2), best, min(2 * best, steps, MAX_SPLITS)}):
                for touch in (False, True) if stage == "w13" and deferred else (False,):
                    name = base.replace(splits=s, slot_loop=slot_loop, touch_pages=touch).schedule
                    if name not in out:
                        out.append(name)
    for stage, strips, warps, unroll in slot_warp_shapes_for(problem.bits) if sw_fits(problem) else ():
        base = launch_fields(MoeGemvConfig(bits=problem.bits, stage=stage, strips=strips, warps=warps, unroll=unroll,
                                           deferred=True, slot_warps=True), problem, sms)
        for s in sorted({1, base.splits}):
            name = base.replace(splits=s).schedule
            if name not in out:
                out.append(name)
    expert = (problem.tokens >= 2 and problem.experts <= GRID_Z
              and (problem.stage == "w13" or problem.pairs * problem.n <= WORKSPACE_FLOATS))
    for stage, strips, warps, unroll, tokens in expert_shapes_for(problem.bits, problem.stage) if expert else ():
        base = launch_fields(MoeGemvConfig(bits=problem.bits, stage=stage, strips=strips, warps=warps, unroll=unroll,
                                           tokens=tokens, by_expert=True), problem, sms)
        best, steps = base.splits, base.steps(problem.k)
        for s in sorted({1, max(1, best // 2), best, min(2 * best, steps, MAX_SPLITS)}):
            if s * problem.pairs * problem.n <= WORKSPACE_FLOATS or s == 1:
                name = base.replace(splits=s).schedule
                if name not in out:
                    out.append(name)
    persistent = (1 <= problem.tokens and problem.pairs <= PERSISTENT_MAX_PAIRS
                  and problem.experts <= PERSISTENT_MAX_EXPERTS and problem.top_k <= PERSISTENT_MAX_TOP_K)
    for stage, strips, warps, unroll, tokens in persistent_shapes_for(problem.bits, problem.stage) if persistent else ():
        base = launch_fields(MoeGemvConfig(bits=problem.bits, stage=stage, strips=strips, warps=warps, unroll=unroll,
                                           tokens=tokens, persistent=True), problem, sms)
        best, steps = base.splits, base.steps(problem.k)
        for s in sorted({1, max(1, best // 2), best, min(2 * best, steps, MAX_SPLITS)}):
            if s * problem.pairs * problem.n <= WORKSPACE_FLOATS:
                name = base.replace(splits=s).schedule
                if name not in out:
                    out.append(name)
    return out


def sw_fits(problem: MoeProblem) -> bool:
    """Slot-warps down schedules (``_sw``) are timed for the down projection of up to
    ``SW_MAX_TOKENS`` tokens with more than one slot (above it the tokens alone fill the GPU)."""
    return problem.stage == "w2" and problem.top_k > 1 and 1 <= problem.tokens <= SW_MAX_TOKENS


def layer_candidates(problems, sms: int) -> List[Tuple[str, str]]:
    """(gate|up, down) schedule pairs of the one-launch persistent mode for ``problems`` = (gate|up
    problem, down problem): 8 and 16 rows per pass, each projection at the persistent heuristic's K
    split and at one slice, where the persistent rules hold and both projections' planes fit the cap."""
    up, down = problems
    if not (1 <= up.tokens and up.pairs <= PERSISTENT_MAX_PAIRS and up.experts <= PERSISTENT_MAX_EXPERTS
            and up.top_k <= PERSISTENT_MAX_TOP_K):
        return []
    out: List[Tuple[str, str]] = []
    for rows in (8, 16):
        per_stage = []
        for p in problems:
            stage, strips, warps, unroll, tokens = persistent_shapes_for(p.bits, p.stage, rows)[0]
            base = launch_fields(MoeGemvConfig(bits=p.bits, stage=stage, strips=strips, warps=warps, unroll=unroll,
                                               tokens=tokens, persistent=True, fused=True), p, sms)
            per_stage.append([base.replace(splits=s) for s in sorted({1, base.splits})])
        for c13 in per_stage[0]:
            for c2 in per_stage[1]:
                if c13.splits * up.pairs * up.n + c2.splits * down.pairs * down.n <= WORKSPACE_FLOATS:
                    out.append((c13.schedule, c2.schedule))
    return out
