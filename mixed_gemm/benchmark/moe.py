"""``mixed-gemm bench --moe``: one mixture-of-experts layer (gate|up, SiLU * up, down, weighted top-k
sum) of a model's shape with random routing: :func:`mixed_gemm.moe` on int4 experts against the best
fp16/bf16 path in the same run (``torch._grouped_mm`` where this torch runs it for the dtype, else a
per-expert cuBLAS loop over the routed experts, transformers' eager way), against the two roofs of
:mod:`.limits` applied to the experts the routing touches (*ideal fp16*: their fp16 bytes at 3.0 TB/s
or the layer's FLOPs at 740 TFLOP/s, whichever is longer; *int4 floor*: their codes, scales and zeros
at 3.0 TB/s), and with ``compare`` against humming-kernels' MoE path on the same codes
(:mod:`.moe_peer`). ``--breakdown`` splits mg.moe's time by stage (:mod:`.moe_breakdown`).

Timed on a cold L2 (a buffer twice the L2 is written before each call, and its time taken off),
median of the repetitions, every path alternating, replayed from a CUDA graph where a
path can be captured (mg.moe's grouped kernels; the fp16 gathered batched GEMV that transformers'
experts run while decoding, at the token counts where its gathered weights fit; the peer) and eager
where it cannot (the per-expert loop and ``torch._grouped_mm``, which read the routing on the
host); mg.moe is timed both ways and keeps the faster (eager it takes its grouped kernels where
they pay, T * top_k at most a few times E, else its per-expert loop).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from ..profiler.problems import MOE_MODELS, MoeShape
from ..profiler.timing import time_cold
from ..profiler.workload import random_routing
from .limits import DENSE_FLOPS, PEAK_BANDWIDTH


MOE_TOKENS = (1, 4, 16, 64, 256, 4096)


def expert_bytes(shape: MoeShape, bits: int = 4, group_size: int = 128, scale_bytes: int = 2) -> int:
    """Bytes one expert's three projections occupy: codes plus a scale and a zero per group (what
    :func:`packed_expert_bytes` counts on the prepacked experts)."""
    weights = 3 * shape.hidden * shape.inter
    return weights * bits // 8 + 2 * scale_bytes * (weights // group_size)


def packed_expert_bytes(*stacks) -> int:
    """Bytes one expert occupies across ``stacks`` (``PackedExperts``) as prepacked: its codes,
    scales and zeros, the int4 bytes a layer streams per touched expert."""
    return sum(t[0].numel() * t.element_size() for w in stacks for t in (w.b, w.scales, w.zeros) if t is not None)


def touched_experts(topk_ids: torch.Tensor) -> int:
    """The distinct experts a routing selects: each one's weights are read at least once."""
    return int(torch.unique(topk_ids).numel())


def ideal_fp16_s(shape: MoeShape, tokens: int, touched: int, bandwidth: float = PEAK_BANDWIDTH,
                 flops: float = DENSE_FLOPS) -> float:
    """The fastest an fp16 layer could run (:func:`.limits.limit_s` for the layer): the larger of
    the ``touched`` experts' fp16 bytes at ``bandwidth`` and its ``2 * tokens * top_k * 3 H I`` FLOPs
    at ``flops``."""
    per_expert = 3 * shape.hidden * shape.inter
    return max(touched * per_expert * 2 / bandwidth, 2 * tokens * shape.top_k * per_expert / flops)


def int4_floor_s(touched: int, bytes_per_expert: int, bandwidth: float = PEAK_BANDWIDTH) -> float:
    """Seconds to read the ``touched`` experts' int4 bytes (codes, scales, zeros) once each at ``bandwidth``."""
    return touched * bytes_per_expert / bandwidth


def dense_loop(x, w13, w2, weights, ids):
    """The fp16/bf16 layer as transformers' eager loop does it: one GEMM pair per routed expert."""
    from ..ops.moe_per_expert import per_expert

    inter = w2.shape[2]

    def expert(e, rows):
        h = rows @ w13[e].t()
        return (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2[e].t()

    counts = torch.bincount(ids.reshape(-1), minlength=w13.shape[0]).tolist()
    return per_expert(x, weights, ids, counts, expert)


def dense_grouped(x, w13_t, w2_t, weights, ids):
    """The same with ``torch._grouped_mm``: rows sorted by expert, one grouped GEMM per projection.
    ``w13_t`` ``(E, H, 2I)`` and ``w2_t`` ``(E, I, H)`` are the weights transposed (its layout)."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=w13_t.shape[0]), 0).to(torch.int32)
    rows = x.index_select(0, order // k)
    h = torch._grouped_mm(rows, w13_t, offs=offs)
    inter = w2_t.shape[1]
    y = torch._grouped_mm(torch.nn.functional.silu(h[:, :inter]) * h[:, inter:], w2_t, offs=offs)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    out.index_add_(0, order // k, y.float() * weights.reshape(-1)[order].float().unsqueeze(1))
    return out.to(x.dtype)


def dense_gathered(x, w13, w2, weights, ids):
    """The same as one batched GEMV per (token, slot) pair over that pair's expert weights, gathered:
    what transformers' experts run while its ``generate`` decodes (their ``batched_mm``
    implementation), and the fp16 path a CUDA graph can capture (no host read of the routing). Moves each pair's expert
    weights three times (read, write, read), so it is timed only while they stay small
    (:data:`GATHER_LIMIT`)."""
    t, k = ids.shape
    flat = ids.reshape(-1)
    rows = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # (pairs, H, 1)
    h = torch.bmm(w13.index_select(0, flat), rows).squeeze(-1)  # (pairs, 2I)
    inter = w2.shape[2]
    h = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]).unsqueeze(-1)
    y = torch.bmm(w2.index_select(0, flat), h).squeeze(-1)  # (pairs, H)
    return (y.float().view(t, k, -1) * weights.float().unsqueeze(-1)).sum(1).to(x.dtype)


GATHER_LIMIT = 4 << 30  # bytes of gathered expert weights above which dense_gathered is not timed


@dataclass
class MoeLayer:
    """One preset's layer on the GPU: the int4 experts mg.moe runs (``w13``, ``w2``: PackedExperts,
    quantized from the fp16 weights) and the fp16 weights the dense paths run (``dense13`` ``(E, 2I,
    H)``, ``dense2`` ``(E, H, I)``, and both transposed for ``torch._grouped_mm``)."""

    name: str
    shape: MoeShape
    w13: object
    w2: object
    dense13: torch.Tensor
    dense2: torch.Tensor
    dense13_t: torch.Tensor
    dense2_t: torch.Tensor


def build_layer(name: str, dtype: torch.dtype, group_size: int = 128, shape: Optional[MoeShape] = None) -> MoeLayer:
    """Random experts of preset ``name`` (or of ``shape``, named ``name``; seeded), int4
    g``group_size`` with integer zeros."""
    from ..formats import quantize
    from ..ops import prepack_experts

    shape = shape or MOE_MODELS[name]
    gen = torch.Generator().manual_seed(0)
    dense13 = (torch.randn(shape.experts, 2 * shape.inter, shape.hidden, generator=gen) / shape.hidden**0.5)
    dense2 = (torch.randn(shape.experts, shape.hidden, shape.inter, generator=gen) / shape.inter**0.5)
    packed = []
    for w, gate_up in ((dense13, True), (dense2, False)):
        parts = [quantize(w[e].cuda(), bits=4, group_size=group_size) for e in range(shape.experts)]
        packed.append(prepack_experts(*(torch.stack([p[i] for p in parts]) for i in range(3)), bits=4,
                                      group_size=group_size, dtype=dtype, gate_up=gate_up))
    w13, w2 = dense13.to("cuda", dtype), dense2.to("cuda", dtype)
    return MoeLayer(name, shape, packed[0], packed[1], w13, w2, w13.transpose(1, 2).contiguous(),
                    w2.transpose(1, 2).contiguous())


ROUTING_SEED = 3


def layer_inputs(layer: MoeLayer, tokens: int, device: str = "cuda"):
    """``(x, topk_weights, topk_ids)`` for ``tokens`` tokens of ``layer``, from a generator seeded by
    the token count alone: a token count gets the same activations and routing (so the same touched
    experts) whatever else one invocation measures, in the layer table and the stage breakdown alike."""
    gen = torch.Generator().manual_seed(ROUTING_SEED * 100_003 + tokens)
    x = (torch.randn(tokens, layer.shape.hidden, generator=gen) / 4).to(device, layer.dense13.dtype)
    weights, ids = random_routing(tokens, layer.shape, gen, device=device)
    return x, weights, ids


# Keys of the int4 paths beside mg.moe among the timed paths (the rest but mixed_gemm are fp16): the
# humming peer, and mg.moe's grouped kernels as pair / expert mode would pick them ("older_modes",
# timed where the plan took persistent mode: the A/B of the same run).
PEERS = ("humming", "older_modes")


def row_of(model: str, shape: MoeShape, tokens: int, touched: int, bytes_per_expert: int,
           timed: Dict[str, tuple]) -> Dict:
    """One table row from ``timed`` = ``{path: (seconds, "graph" | "eager")}`` (``mixed_gemm``, the
    fp16 paths, the peers of :data:`PEERS` that ran): the best fp16 path and mg's speedup over it;
    the ideal fp16 time (:func:`ideal_fp16_s`) and mg's speedup over that; the int4 floor
    (:func:`int4_floor_s`) and the share of it mg reaches; each peer's time and mg's speedup over it."""
    secs = {name: t for name, (t, _) in timed.items()}
    ours = secs["mixed_gemm"]
    best = min((k for k in secs if k != "mixed_gemm" and k not in PEERS), key=secs.get)
    ideal, floor = ideal_fp16_s(shape, tokens, touched), int4_floor_s(touched, bytes_per_expert)
    row = dict(model=model, tokens=tokens, touched_experts=touched, mixed_gemm_us=ours * 1e6,
               mixed_gemm_how=timed["mixed_gemm"][1], dense=best, dense_us=secs[best] * 1e6, dense_how=timed[best][1],
               speedup=secs[best] / ours, ideal_fp16_us=ideal * 1e6, vs_ideal_fp16=ideal / ours,
               floor_us=floor * 1e6, share_of_floor=floor / ours)
    row["fp16_paths_us"] = {name: t * 1e6 for name, t in secs.items() if name != "mixed_gemm" and name not in PEERS}
    for name in PEERS:
        if name in secs:
            row.update({f"{name}_us": secs[name] * 1e6, f"{name}_how": timed[name][1], f"vs_{name}": secs[name] / ours})
    return row


def bench_moe(layer: MoeLayer, tokens: Sequence[int], reps: int = 7, compare: bool = False, log=print) -> List[Dict]:
    """Rows (one per token count) for ``layer``; ``compare``: humming-kernels' MoE path beside."""
    from ..ops import moe
    from ..ops.moe_grouped import moe_grouped
    from . import moe_peer

    shape = layer.shape
    peer, peer_note = (moe_peer.prepare(layer.w13, layer.w2, shape.top_k, tokens) if compare else (None, ""))
    bytes_per_expert = packed_expert_bytes(layer.w13, layer.w2)
    w13, w2, w13_t, w2_t = layer.dense13, layer.dense2, layer.dense13_t, layer.dense2_t
    rows = []
    for t in tokens:
        x, weights, ids = layer_inputs(layer, t)
        fns = {"mixed_gemm": lambda: moe(x, layer.w13, layer.w2, weights, ids),
               "dense loop": lambda: dense_loop(x, w13, w2, weights, ids)}
        if t * shape.top_k * 3 * shape.hidden * shape.inter * w13.element_size() <= GATHER_LIMIT:
            fns["gathered bmm"] = lambda: dense_gathered(x, w13, w2, weights, ids)
        notes = {}
        if hasattr(torch, "_grouped_mm"):
            try:
                dense_grouped(x, w13_t, w2_t, weights, ids)
                fns["torch._grouped_mm"] = lambda: dense_grouped(x, w13_t, w2_t, weights, ids)
            except (RuntimeError, TypeError, ValueError) as exc:  # dtype/arch this torch does not run
                notes["grouped_mm_error"] = f"torch._grouped_mm: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        older = older_modes(layer, x, shape.top_k)
        if older is not None:
            fns["older_modes"] = lambda: moe_grouped(x, layer.w13, layer.w2, weights, ids, configs=older)
        if peer is not None:  # run once and checked against mg.moe first; timed only if it ran
            ran, found = moe_peer.check(peer, x, weights, ids, moe(x, layer.w13, layer.w2, weights, ids))
            notes.update(found)
            if ran:
                fns["humming"] = lambda: peer(x, weights, ids)
        elif compare:
            notes["humming_error"] = peer_note
        row = row_of(layer.name, shape, t, touched_experts(ids), bytes_per_expert, time_cold(fns, reps))
        row.update(notes)
        row["schedules"] = plan_schedules(layer, x, shape.top_k)
        rows.append(row)
        log(table_line(row, compare))
        if "older_modes_us" in row:
            log(f"  (pair / expert modes, same run: {row['older_modes_us']:.1f} µs; mg.moe ran {row['schedules']})")
    return rows


def plan_schedules(layer: MoeLayer, x: torch.Tensor, top_k: int) -> List[str]:
    """The grouped kernels mg.moe's plan runs for ``x`` (``family:schedule`` per projection), or []."""
    from ..ops.moe_grouped import GroupedPlan, grouped_plan

    plan = grouped_plan(x, layer.w13, layer.w2, top_k)
    return [f"{f.name}:{c.schedule}" for f, c in zip(plan.families, plan.configs)] if isinstance(plan, GroupedPlan) else []


def older_modes(layer: MoeLayer, x: torch.Tensor, top_k: int):
    """moe_gemv's (gate|up, down) configs as pair / expert mode would pick them, where mg.moe's plan
    took persistent mode for either projection; else None."""
    from ..kernels.base import sm_count
    from ..kernels.moe_gemv.heuristics import heuristic_config
    from ..ops.moe_grouped import GroupedPlan, _problems, grouped_plan
    from ..select import m_bucket

    plan = grouped_plan(x, layer.w13, layer.w2, top_k)
    if not isinstance(plan, GroupedPlan) or not any(getattr(c, "persistent", False) for c in plan.configs):
        return None
    problems = _problems(m_bucket(max(1, x.shape[0])), top_k, layer.w13, layer.w2)
    return tuple(heuristic_config(p, sm_count(x.device.index or 0), persistent_mode=False) for p in problems)


def table_head(compare: bool) -> List[str]:
    """The header of :func:`table_line`'s rows. µs figures carry "(g)" when replayed from a CUDA
    graph, "(e)" when eager (not capturable)."""
    head = ("| model | tokens | touched experts | mixed_gemm µs | best fp16 µs (which) | speedup | ideal fp16 µs "
            "| vs ideal fp16 | int4 floor µs | of int4 floor |")
    if compare:
        head += " humming µs | vs humming |"
    return [head, "|" + "---|" * (head.count("|") - 1)]


def table_line(r: Dict, compare: bool = False) -> str:
    how = lambda key: "" if key not in r else f" ({r[key][0]})"  # noqa: E731
    line = (f"| {r['model']} | {r['tokens']} | {r['touched_experts']} | {r['mixed_gemm_us']:.1f}{how('mixed_gemm_how')} | "
            f"{r['dense_us']:.1f}{how('dense_how')} ({r['dense']}) | {r['speedup']:.2f}x | {r['ideal_fp16_us']:.1f} | "
            f"{r['vs_ideal_fp16']:.2f}x | {r['floor_us']:.1f} | {100 * r['share_of_floor']:.0f}% |")
    if compare:
        line += (f" {r['humming_us']:.1f}{how('humming_how')} | {r['vs_humming']:.2f}x |" if "humming_us" in r
                 else " - | - |")
    return line


def notes(rows: List[Dict]) -> List[str]:
    """The footer: why a path has no numbers or disagreed with mg.moe, one line per distinct note."""
    return sorted({r[key] for r in rows for key in r if key.endswith("_error")})
