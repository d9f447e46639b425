"""The mixture-of-experts layer ``moe``: gate|up GEMM, SiLU(gate) * up, down GEMM, weighted sum
over the top-k, on :class:`~.experts.PackedExperts` (the layout contract is in :mod:`.experts`).

Execution: on the CPU the float32 reference (:func:`mixed_gemm.reference.moe` of the dequantized
experts). On a GPU, the grouped path when a grouped family (``kernels.GROUPED_FAMILIES``) can take
the experts (the ``sm90a`` layout, 4/8 bits): on an H100, once the routed experts get many pairs
each, ``moe_sm90a`` (pairs sorted by expert on the device, one grouped wgmma GEMM per projection
over every expert's rows, SiLU(gate) * up in the gate|up GEMM's epilogue, the top-k sum after
down; ``moe_sm80`` likewise with mma.sync tiles on Ampere); otherwise ``moe_gemv``
(the decode kernels, "pair mode" at one token, "expert mode" once experts get several pairs; ``I``
a multiple of 16): two launches, gate|up with SiLU(gate) * up fused, then down with the top-k
weighted sum fused. The profile's grouped entries, where they were measured near this token
count, say which kernels run (the two projections' may be of different families); else the
families are asked in that order. Neither reads the
routing on the host, so both run under CUDA-graph capture. Outside capture it runs while it pays (every
decode-size ``T``, up to 256 tokens, and above that while ``T * top_k`` is at most a few times
``E``: ``moe_gemv.heuristics.pays``); otherwise, and for what no grouped family takes
(``sm80``-layout experts), one gate|up and one down :func:`matmul` per expert that got tokens
(:func:`per_expert`). Finding those experts reads the routing on the host, so that path cannot be
captured; it says so.

Rounding (grouped path): the gate and up dot products accumulate in float32, ``silu(g) * u`` is
computed in float32 and rounded once to the activation dtype (the intermediate ``h``; the tile
families, moe_sm90a and moe_sm80, round ``g`` and ``u`` to the activation dtype first); the down
dot products accumulate in float32, each slot's is multiplied by its top-k weight in float32, the
slots are added in slot order (deterministic, no atomics), and ``y`` is rounded once. (A profile may
pick moe_sm80's fused down, which adds the weighted fp32 rows with atomics instead: unrounded rows,
one rounding of ``y``, and for top-k > 2 an order of the fp32 additions that may vary between runs.)
"""
from __future__ import annotations

import torch

from .experts import PackedExperts, check_moe_inputs, routing_stats, split_gate_up
from .matmul import matmul
from .moe_grouped import GroupedPlan, grouped_plan, run_grouped
from .moe_per_expert import per_expert


def moe(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """A SiLU-gated mixture-of-experts layer: for each token ``t``,
    ``y[t] = sum_j topk_weights[t, j] * W2[e] @ (silu(gate_e x_t) * up_e x_t)`` with
    ``e = topk_ids[t, j]`` and ``gate_e``/``up_e`` the two halves of ``W13[e]``.

    ``x`` ``(T, H)`` float16/bfloat16 (the experts' dtype; any strides), ``w13`` ``(E, 2I, H)`` and
    ``w2`` ``(E, H, I)`` :class:`PackedExperts` of one kind (bits, zero mode, layout),
    ``topk_weights`` float ``(T, k)``, ``topk_ids`` int32/int64 ``(T, k)``. Returns ``(T, H)`` in
    ``x``'s dtype (module docstring: which path runs and where it rounds).

    Routing ids (the same on every path): an id in ``[0, E)`` routes the pair to that expert; ``-1``
    marks a pair that contributes nothing (expert parallelism: servers mark so the pairs whose
    expert lives on another rank), its weight never read, so a token whose slots are all ``-1``
    gets a zero row. Any other id (``>= E`` or ``< -1``) is a bug in the caller: where the routing is
    read on the host (the CPU, the per-expert path) it raises ``ValueError`` naming ``topk_ids``, as
    does a NaN or infinite weight of a routed pair; the grouped path reads nothing on the host (no
    sync, capturable), so there such a pair, like a ``-1`` one, contributes nothing (never read out
    of bounds), and weights are not checked.

    Every other rule (types, dtypes, shapes, devices: :func:`~.experts.check_moe_inputs`) is checked
    on every path before anything launches, from metadata only."""
    check_moe_inputs(x, w13, w2, topk_weights, topk_ids)
    if not topk_ids.numel():  # no tokens (or top_k = 0): nothing to route
        return torch.zeros_like(x)
    if x.is_cuda:
        capturing = torch.cuda.is_current_stream_capturing()
        plan = grouped_plan(x, w13, w2, topk_ids.shape[1])
        if isinstance(plan, GroupedPlan) and (capturing or plan.pays(x.shape[0], topk_ids.shape[1], w13.num_experts)):
            launchers = plan.launchers(capturing)
            if launchers is not None:
                return run_grouped(launchers, x, w13, w2, topk_weights, topk_ids)
        if capturing:  # before any host read of the routing
            why = plan if isinstance(plan, str) else "its kernels are not available (MIXED_GEMM_JIT=off)"
            raise RuntimeError("mixed_gemm.moe: the per-expert path runs one GEMM pair per routed expert and reads the "
                               "routing on the host, which a CUDA graph cannot capture; the grouped kernels, which can, "
                               f"cannot run these experts: {why}")
    counts = routing_stats(topk_weights, topk_ids, w13.num_experts)  # one host read; raises on bad routing
    if x.device.type != "cuda":
        from ..reference import moe as reference_moe

        return reference_moe(x.float(), w13.dequantize(), w2.dequantize(), topk_weights.float(), topk_ids).to(x.dtype)
    inter = w13.n // 2

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = split_gate_up(matmul(rows, w13.expert(e)))
        return matmul((torch.nn.functional.silu(gate) * up).reshape(rows.shape[0], inter), w2.expert(e))

    return per_expert(x, topk_weights, topk_ids, counts, expert)
