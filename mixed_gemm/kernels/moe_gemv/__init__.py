"""The ``moe_gemv`` family: the decode path of a mixture-of-experts layer (docs/notes/moe.md;
templates/moe_gemv/). Two launches per layer, no host sync: the
gate|up kernel (``stage="w13"``, SiLU(gate) * up fused) and the down kernel (``stage="w2"``, the
top-k weighted sum fused, deterministic), reading the experts' weights from the stacked
sm90a-layout experts (``ops.experts.PackedExperts``), in one of three schedules:

- pair mode: each CTA column serves one (token, slot) pair of the router (gemv's FMA variant for one
  token, templates/gemv/gemv.cuh): ideal at one token, but an expert's weight is streamed once per
  pair routed to it;
- expert mode (``by_expert``, ``_m<tokens>_xe``): each CTA column serves one expert, scans the
  routing for that expert's pairs and streams its weight once per ``tokens`` (8 or 16) of them
  (gemv's mma path on gathered rows): the floor whenever an expert has at most ``tokens`` pairs;
- persistent mode (``persistent``, ``_m<tokens>_pe``): a grid of resident CTAs walks the work items
  (touched expert, row tile, K slice), each CTA sorting the routing in its shared memory and serving
  all of the item's expert's pairs (``tokens`` per pass, expert mode's main loop; later passes re-read
  the item's slice from L2): each touched expert's bytes cross HBM once whatever the token count,
  untouched experts cost nothing, and split-K fills the GPU with a few small experts; ``fused``
  (``_m<tokens>_pe1``) runs both projections in ONE launch (an atomic work queue of gate|up items,
  then down items, each down item waiting on its expert's gate|up items): one start, one sort.

A grouped family: it is registered in ``kernels.GROUPED_FAMILIES``, not ``FAMILIES``, so dense
selection never considers it; its problems are :class:`~..base.MoeProblem`, and ``ops.moe_grouped``
chooses among the grouped families.
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import OK, SM80_UP_FLAGS, GroupedFamily, MoeProblem, Verdict
from ..common import DTYPES, grouped_constant_checks
from ..sm90a import layout
from .abi import MOE_GEMV_ARGS_BYTES, MOE_GEMV_FUSED_ARGS_BYTES
from .candidates import candidate_schedules, layer_candidates
from .catalog import default_catalog
from .config import (GRID_Z, PERSISTENT_MAX_EXPERTS, PERSISTENT_MAX_PAIRS, PERSISTENT_MAX_TOP_K,
                     MoeGemvConfig, route_bytes, weight_constant_checks)
from .heuristics import heuristic_config, pays
from .launch import MoeGemvLauncher

_STAGES = {"w13": ("kGateUp", "gate|up: h[p] = silu(x[t] Wg_e^T) * (x[t] Wu_e^T), one CTA per (pair, row tile, K slice)"),
           "w2": ("kDown", "down: y[t] = sum_j topk_weights[t, j] * (h[t k + j] W2_e^T), slots added in slot order")}
MAX_PAIRS = 2**31 - 1  # pair indices are 32-bit in the kernel
MAX_EXPERT_PAIRS = 2**30  # expert mode: scan rounds index up to pairs + 4 * threads, invalid ids as ~p


def _tail_args(kernel: MoeGemvConfig) -> str:
    """The kernel struct's template arguments after the unroll: expert and persistent mode's rows per
    pass; pair mode's ``kDeferred, kTouchPages``, left at their defaults when false (the source of
    every earlier pair-mode kernel stays as it was)."""
    if kernel.tiled:
        return f", {kernel.tokens}"
    if kernel.touch_pages:
        return f", {str(kernel.deferred).lower()}, true"
    return ", true" if kernel.deferred else ""  # MoeGemvSlotWarps takes kDeferred the same way


class MoeGemvFamily(GroupedFamily):
    name = "moe_gemv"
    config_class = MoeGemvConfig
    layout = layout.NAME
    sets_layout = False  # it reads the sm90a copy prepack_experts made on the H100
    reads_gate_up_halves = True  # the gate|up order is a launch argument (ops.gated's dense weights)
    arch_flags = SM80_UP_FLAGS
    min_capability = (8, 0)

    def grouped_rules(self, config: MoeGemvConfig, problem: MoeProblem) -> Verdict:
        if problem.stage == "w13" and problem.n % 32:
            return False, (f"gate|up: I = N/2 must be a multiple of 16 (a warp pairs gate strip s with up strip s + I/16 "
                           f"of the sm90a layout's 16-row atoms), got I={problem.n / 2:g}")
        if problem.k % 8:
            return False, f"K must be a multiple of 8 (rows of x are 16-byte aligned), got K={problem.k}"
        if problem.top_k < 1 or problem.experts < 1 or problem.tokens < 0:
            return False, (f"needs top_k >= 1, experts >= 1 and tokens >= 0, got top_k={problem.top_k}, "
                           f"experts={problem.experts}, tokens={problem.tokens}")
        if problem.pairs > MAX_PAIRS:
            return False, f"at most {MAX_PAIRS} (token, slot) pairs (32-bit indices), got {problem.pairs}"
        if config.by_expert and problem.pairs > MAX_EXPERT_PAIRS:
            return False, (f"expert mode (_xe): at most {MAX_EXPERT_PAIRS} (token, slot) pairs (the routing scan's "
                           f"32-bit indices), got {problem.pairs}")
        if config.by_expert and problem.experts > GRID_Z:
            return False, f"expert mode (_xe): at most {GRID_Z} experts (a grid.z slot each), got {problem.experts}"
        if config.persistent:
            if problem.pairs > PERSISTENT_MAX_PAIRS:
                return False, (f"persistent mode (_pe): at most {PERSISTENT_MAX_PAIRS} (token, slot) pairs (sorted in "
                               f"shared memory), got {problem.pairs}")
            if problem.experts > PERSISTENT_MAX_EXPERTS:
                return False, (f"persistent mode (_pe): at most {PERSISTENT_MAX_EXPERTS} experts (their buckets in "
                               f"shared memory), got {problem.experts}")
            if problem.top_k > PERSISTENT_MAX_TOP_K:
                return False, (f"persistent mode (_pe): top_k at most {PERSISTENT_MAX_TOP_K} (a token's valid slots "
                               f"are a 32-bit mask), got {problem.top_k}")
        return OK

    def plan_rules(self, configs) -> Verdict:
        """Can ``configs`` = (gate|up, down) run as one plan? A one-launch config (``_pe1``) runs both
        projections in one kernel, so its pair must be one too, of the same compiled kernel."""
        fused = [getattr(c, "fused", False) for c in configs]
        if not any(fused):
            return OK
        if not all(fused):
            return False, ("a one-launch persistent schedule (_pe1) runs both projections in one kernel: the gate|up "
                           "and the down schedule must both be _pe1")
        if configs[0].kernel != configs[1].kernel:
            return False, (f"the one-launch schedules {configs[0].schedule} and {configs[1].schedule} must share one "
                           "kernel (the same strips, warps, unroll and rows per pass, one weight kind)")
        return OK

    def catalog(self) -> List[MoeGemvConfig]:
        return default_catalog()

    def packaged(self, capability) -> List[MoeGemvConfig]:
        """The catalog (a grouped family's choice depends on the routing), less the page-touch and
        slot-warps kernels (``_tp``, ``_sw``: profile candidates), which come in only through a
        profile naming them."""
        return [c for c in super().packaged(capability) if not (c.touch_pages or c.slot_warps)]

    def candidates(self, problem, sms: int) -> List[str]:
        return candidate_schedules(problem, sms) if isinstance(problem, MoeProblem) else []

    def layer_candidates(self, problems, sms: int):
        return layer_candidates(problems, sms)

    def heuristic(self, problem, sms: int):
        return heuristic_config(problem, sms) if isinstance(problem, MoeProblem) else None

    def pays(self, tokens: int, top_k: int, experts: int) -> bool:
        """Is this family worth running outside CUDA-graph capture for ``tokens`` x ``top_k`` pairs
        over ``experts`` (heuristics.pays)? Under capture ``moe`` runs it whenever it can."""
        return pays(tokens, top_k, experts)

    def render(self, config: MoeGemvConfig) -> str:
        kernel = config.kernel
        stage, doc = _STAGES[kernel.stage]
        if kernel.by_expert:
            doc = (doc.split(", one CTA per")[0] + f"; expert mode: a CTA per (expert x {kernel.tokens}-pair chunk, "
                   "row tile, K slice), one weight pass per chunk")
        if kernel.fused:
            doc = ("gate|up then down in one launch: resident CTAs claim (touched expert, row tile, K slice) items from "
                   "one queue, gate|up items first, a down item waiting on its expert's gate|up items")
        elif kernel.persistent:
            doc = (doc.split(", one CTA per")[0] + "; persistent mode: resident CTAs walk the (touched expert, row "
                   f"tile, K slice) items, all of an item's pairs {kernel.tokens} per pass")
        if kernel.slot_warps:
            doc = doc.replace("slots added in slot order", "the CTA's K warps spread over a group of slots (_sw), "
                                                              "added in its reduction")
        struct = ("MoeGemvExpert" if kernel.by_expert else "MoeGemvPersistent" if kernel.persistent
                  else "MoeGemvSlotWarps" if kernel.slot_warps else "MoeGemv")
        return render_template(
            "moe_gemv/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name, persistent=kernel.persistent,
            fused=kernel.fused, slot_warps=kernel.slot_warps, tokens=kernel.tokens, fused_args_bytes=MOE_GEMV_FUSED_ARGS_BYTES,
            args_type="MoeGemvFusedArgs" if kernel.fused else "MoeGemvArgs",
            kernel_struct=struct,
            tail_args=_tail_args(kernel),
            element=DTYPES[kernel.dtype][0], bits=kernel.bits, stage=stage, stage_doc=doc, strips=kernel.strips,
            warps_n=kernel.warps[0], warps_k=kernel.warps[1], unroll=kernel.unroll, threads=kernel.threads,
            rows=kernel.rows, smem_bytes=kernel.smem_bytes, args_bytes=MOE_GEMV_ARGS_BYTES, constants=grouped_constant_checks() + weight_constant_checks(),
            route_words_3_5=route_bytes(3, 5) // 4,
        )

    def launcher(self, config: MoeGemvConfig, device_index: int) -> MoeGemvLauncher:
        return MoeGemvLauncher(config, self.build_spec(config), device_index)


FAMILY = MoeGemvFamily()

__all__ = ["FAMILY", "MoeGemvConfig", "MoeGemvFamily"]
