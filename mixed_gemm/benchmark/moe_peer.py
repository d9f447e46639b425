"""humming-kernels' MoE path, the int4 peer of ``mixed-gemm bench --moe --compare``, on mg's own codes.

humming (0.1.x) gives a GEMM, not a layer: its ``HummingLayer`` with ``num_experts`` runs an
*indexed* GEMM (``compute_config={"gemm_type": "indexed"}``) over rows listed by expert in blocks of
its tile's M (``sorted_ids``: pair ids ``t * top_k + j``, each expert's list padded to a multiple of
the block with the pair count; ``expert_ids``: each block's expert; ``num_tokens_padded``: how many
rows are listed), reading input row ``id // top_k`` and writing output row ``id``. The layer is
composed the way a server composes it: gate|up (``top_k`` = k, rows gate then up), SiLU(gate) * up
(its ``process_input`` with a binary-split activation), down (``top_k`` = 1 over the pairs' rows),
and the weighted top-k sum in torch. The routing lists are built on the device from ``topk_ids``
(:func:`align_blocks`, no host read), so the whole layer is captured in a CUDA graph like mg.moe.

Its weights are mg's canonical codes, scales and zero points (``PackedExperts.unpack_expert``,
packed by :func:`.peers.humming_tensors`), so its output is checked against mg.moe's. Each
projection's kernel is humming's heuristic pick for that token count (``T * top_k`` rows), all the
bench's token counts compiled at once. Missing or failing, it is skipped with a note.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from .peers import MAX_REL_ERR, error_text, humming_tensors, rel_err

COMPUTE = {"gemm_type": "indexed"}
# humming's process_input activation: a = the gate half of a row, b = the up half.
SILU_MUL = "a / (1.0f + __expf(-a)) * b"


def align_blocks(ids: torch.Tensor, experts: int, block: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sorted_ids, expert_ids, num_tokens_padded)`` (int32) of the indexed GEMM for ``ids``
    ``(T, k)``: the pairs of each expert in pair order, expert 0 first, each list padded with ``T k``
    to a multiple of ``block``. Torch ops on ``ids``' device and no host read (capturable): the
    tensors are sized for the worst case (every touched expert leaving a block short), blocks past
    ``num_tokens_padded`` are never read."""
    flat = ids.reshape(-1).long()
    pairs, dev = flat.numel(), flat.device
    counts = torch.zeros(experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    firsts = torch.cumsum(counts, 0) - counts  # each expert's first pair among the sorted ones
    by_expert, order = torch.sort(flat, stable=True)
    slot = (ends - padded)[by_expert] + torch.arange(pairs, device=dev) - firsts[by_expert]
    capacity = -(-(pairs + min(experts, pairs) * (block - 1)) // block) * block
    sorted_ids = torch.full((capacity,), pairs, dtype=torch.int32, device=dev)
    sorted_ids.index_copy_(0, slot, order.to(torch.int32))
    starts = torch.arange(0, capacity, block, device=dev)
    expert_ids = torch.searchsorted(ends, starts, right=True).clamp_(max=experts - 1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


class HummingMoe:
    """``peer(x, topk_weights, topk_ids) -> y``: the layer through humming's kernels.

    ``layers``: (gate|up, down) callables with HummingLayer's forward signature; ``tunings``: per
    layer the tuning config passed on every call (``[[min rows, max rows, config], ...]``);
    ``blocks``: ``T * top_k`` -> (gate|up block M, down block M) of the configs humming picks there;
    ``activation``: ``h13 -> silu(gate) * up``."""

    def __init__(self, layers, tunings, blocks: Dict[int, Tuple[int, int]], activation, experts: int):
        self.layers, self.tunings, self.blocks = layers, tunings, blocks
        self.activation, self.experts = activation, experts

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        tokens, top_k = topk_ids.shape
        b13, b2 = self.blocks[tokens * top_k]
        r13 = align_blocks(topk_ids, self.experts, b13)
        r2 = r13 if b2 == b13 else align_blocks(topk_ids, self.experts, b2)
        h = self.layers[0](x, sorted_ids=r13[0], expert_ids=r13[1], num_tokens_padded=r13[2], top_k=top_k,
                           compute_config=COMPUTE, tuning_config=self.tunings[0])
        y = self.layers[1](self.activation(h), sorted_ids=r2[0], expert_ids=r2[1], num_tokens_padded=r2[2], top_k=1,
                           compute_config=COMPUTE, tuning_config=self.tunings[1])
        return (y.view(tokens, top_k, -1).float() * topk_weights.float().unsqueeze(-1)).sum(1).to(x.dtype)


def unavailable(w13) -> Optional[str]:
    """Why humming cannot run these experts here (not installed, a weight kind it lacks), or None."""
    from .measure import WeightKind
    from .peers import Humming

    if w13.zero_mode != "int":
        return f"{w13.zero_mode} zeros: the MoE peer packs integer zero points"
    return Humming().unavailable(WeightKind("f16", w13.bits, w13.group_size, w13.zero_mode))


def _layer(w, dtype: torch.dtype):
    """A HummingLayer with ``num_experts`` holding ``w``'s (PackedExperts) codes, gate rows then up rows."""
    from humming.layer import HummingLayer

    config = {"quant_method": "humming", "b_dtype": f"uint{w.bits}",
              "weight_scale_group_size": 0 if w.group_size in (-1, w.k) else w.group_size,
              "has_zero_point": True, "is_fp_zero_point": False}
    parts = []
    for e in range(w.num_experts):
        q, s, z = w.unpack_expert(e)
        parts.append(humming_tensors(q, s.to(dtype), z, w.bits, "int"))
    state = {key: torch.stack([p[key] for p in parts]) for key in parts[0]}
    del parts
    layer = HummingLayer(shape_n=w.n, shape_k=w.k, weight_config=config, num_experts=w.num_experts,
                         torch_dtype=dtype).cuda()
    layer.load_from_tensors(state)
    layer.transform()
    return layer


def tuning_intervals(picks: Sequence[Tuple[int, dict]]):
    """``[[lo, hi, config], ...]`` covering every row count, config ``i`` for rows in ``(lo, hi]``
    around its own count (humming's launcher picks the interval holding ``T * top_k``)."""
    picks = sorted(picks, key=lambda p: p[0])
    bounds = [0] + [m for m, _ in picks[:-1]] + [1 << 30]
    return [[bounds[i], bounds[i + 1], config] for i, (_, config) in enumerate(picks)]


def build(w13, w2, top_k: int, tokens: Sequence[int]) -> HummingMoe:
    """The peer for stacks ``w13``, ``w2`` at these token counts (raises where humming refuses)."""
    from humming import ops
    from humming.tune import get_heuristics_config

    dtype, device = w13.dtype, w13.device.index
    layers = (_layer(w13, dtype), _layer(w2, dtype))
    rows = sorted({t * top_k for t in tokens})
    picks = [[(m, get_heuristics_config(layer.humming_config, shape_m=m, gemm_type="indexed", device=device))
              for m in rows] for layer in layers]
    blocks = {m: (a["block_shape"][0], b["block_shape"][0]) for (m, a), (_, b) in zip(*picks)}

    def activation(h):
        return ops.process_input(h, activation_type="binary_split", activation_impl=SILU_MUL)[0]

    return HummingMoe(layers, [tuning_intervals(p) for p in picks], blocks, activation, w13.num_experts)


def prepare(w13, w2, top_k: int, tokens: Sequence[int]) -> Tuple[Optional[HummingMoe], str]:
    """``(peer, "")``, or ``(None, note)`` saying why humming is skipped."""
    why = unavailable(w13)
    if why is None:
        try:
            return build(w13, w2, top_k, tokens), ""
        except Exception as exc:  # noqa: BLE001 - a refused peer is a note, not a failed bench
            why = error_text(exc)
    return None, f"humming: {why}"


def check(peer, x, topk_weights, topk_ids, reference) -> Tuple[bool, Dict]:
    """Run ``peer`` once on these inputs (its kernels compile here) and compare with mg.moe's
    ``reference``: ``(ran, {"humming_rel_err": ..., "humming_error": note where it differs by more
    than 2% or failed})``."""
    tokens = topk_ids.shape[0]
    try:
        y = peer(x, topk_weights, topk_ids)
    except Exception as exc:  # noqa: BLE001
        return False, {"humming_error": f"humming: failed at {tokens} tokens: {error_text(exc)}"}
    err = rel_err(y, reference)
    out = {"humming_rel_err": err}
    if not err <= MAX_REL_ERR:  # timed all the same; the footer says so
        out["humming_error"] = f"humming: output differs from mg.moe's by {100 * err:.1f}% (relative) at {tokens} tokens"
    return True, out
