"""``mixed-gemm bench --moe``: one mixture-of-experts layer (gate|up, SiLU * up, down, weighted top-k
sum) of a model's shape with random routing: :func:`mixed_gemm.moe` on int4 experts against the best
fp16/bf16 path in the same run (``torch._grouped_mm`` where this torch runs it for the dtype, else a
per-expert cuBLAS loop over the routed experts, transformers' eager way) and against the int4 floor,
the bytes of the experts actually routed at the copy bandwidth.

Timed on a cold L2 (a buffer twice the L2 is written before each call, and its time taken off),
median of the repetitions, ours and the dense paths alternating, replayed from a CUDA graph where a
path can be captured (mg.moe's grouped kernels; the fp16 gathered batched GEMV that transformers'
experts run while decoding, at the token counts where its gathered weights fit) and eager
where it cannot (the per-expert loop and ``torch._grouped_mm``, which read the routing on the
host); mg.moe is timed both ways and keeps the faster (eager it takes its grouped kernels where
they pay, T * top_k at most a few times E, else its per-expert loop).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

import torch


@dataclass(frozen=True)
class MoeShape:
    experts: int
    top_k: int
    hidden: int
    inter: int


MOE_MODELS = {
    "mixtral-8x7b": MoeShape(8, 2, 4096, 14336),
    "qwen3-30b-a3b": MoeShape(128, 8, 2048, 768),
    "deepseek-v2-lite": MoeShape(64, 6, 2048, 1408),
}
MOE_TOKENS = (1, 4, 16, 64, 256, 4096)


def expert_bytes(shape: MoeShape, bits: int = 4, group_size: int = 128, scale_bytes: int = 2) -> int:
    """Bytes one expert's three projections occupy: codes plus a scale and a zero per group."""
    weights = 3 * shape.hidden * shape.inter
    return weights * bits // 8 + 2 * scale_bytes * (weights // group_size)


def routed_floor_s(shape: MoeShape, topk_ids: torch.Tensor, bandwidth: float, bits: int = 4,
                   group_size: int = 128) -> float:
    """Seconds to read the experts ``topk_ids`` routes to, once each, at ``bandwidth`` bytes/s (the
    copy bandwidth, as ``mixed-gemm bench``'s int4 floor uses it)."""
    active = int(torch.unique(topk_ids).numel())
    return active * expert_bytes(shape, bits, group_size) / bandwidth


def random_routing(tokens: int, shape: MoeShape, gen: torch.Generator, device="cuda"):
    """``(topk_weights, topk_ids)`` of a softmax router over random logits (renormalized top-k)."""
    logits = torch.randn(tokens, shape.experts, generator=gen).to(device)
    weights, ids = torch.softmax(logits, dim=-1).topk(shape.top_k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), ids


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


def _graph_of(fn: Callable[[], object], reps: int):
    """``reps`` calls of ``fn`` captured in one CUDA graph, or None where it cannot be (mg.moe's
    per-expert path reads the routing on the host; the dense loop too)."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return graph
    except (RuntimeError, ValueError):
        torch.cuda.synchronize()
        return None


def _elapsed_s(run: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _cold_s(fns: Dict[str, Callable[[], object]], rounds: int, calls: int = 10) -> Dict[str, tuple]:
    """``(seconds, how)`` per fn: one call on a cold L2, the median over ``rounds`` of ``calls``
    calls each preceded by a write of a buffer twice the L2, less the same number of writes alone
    (so neither the graph launch nor the event timing is counted in a call). Replayed from a
    CUDA graph where the fn can be captured, else eager (``how`` says which; a capturable fn is
    timed both ways and keeps the faster: mg.moe under capture always takes its grouped kernels,
    eager it may take its per-expert path). Eager, the flushes run while the host issues the next
    call, which hides up to a flush's time of host work: in the dense paths' favour. Fns alternate."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    flush = torch.empty(2 * l2 // 4 + 1, dtype=torch.float32, device="cuda")

    def flushed(fn):
        def call():
            flush.zero_()
            fn()
        return call

    def eager(fn):
        return lambda: [fn() for _ in range(calls)]

    runs: Dict[tuple, Callable[[], object]] = {("flush", "eager"): eager(flush.zero_)}
    flush_graph = _graph_of(flush.zero_, calls)
    runs[("flush", "graph")] = flush_graph.replay
    for name, fn in fns.items():
        fn()
        runs[(name, "eager")] = eager(flushed(fn))
        graph = _graph_of(flushed(fn), calls)
        if graph is not None:
            runs[(name, "graph")] = graph.replay
    samples: Dict[tuple, List[float]] = {key: [] for key in runs}
    for rep in range(rounds):
        for key, run in (list(runs.items()) if rep % 2 == 0 else list(reversed(runs.items()))):
            samples[key].append(_elapsed_s(run))
    base = {how: statistics.median(samples[("flush", how)]) for how in ("eager", "graph")}
    out: Dict[str, tuple] = {}
    for (name, how), times in samples.items():
        if name == "flush":
            continue
        t = max(statistics.median(times) - base[how], 0.0) / calls
        if name not in out or t < out[name][0]:
            out[name] = (t, how)
    return out


def bench_moe(name: str, tokens: Sequence[int], dtype: torch.dtype, bandwidth: float, group_size: int = 128,
              reps: int = 7, log=print) -> List[Dict]:
    """Rows (one per token count) for the MoE layer of preset ``name``."""
    from ..formats import quantize
    from ..ops import moe, prepack_experts

    shape = MOE_MODELS[name]
    gen = torch.Generator().manual_seed(0)
    dense13 = (torch.randn(shape.experts, 2 * shape.inter, shape.hidden, generator=gen) / shape.hidden**0.5)
    dense2 = (torch.randn(shape.experts, shape.hidden, shape.inter, generator=gen) / shape.inter**0.5)
    packed = []
    for w, gate_up in ((dense13, True), (dense2, False)):
        parts = [quantize(w[e].cuda(), bits=4, group_size=group_size) for e in range(shape.experts)]
        packed.append(prepack_experts(*(torch.stack([p[i] for p in parts]) for i in range(3)), bits=4,
                                         group_size=group_size, dtype=dtype, gate_up=gate_up))
    w13, w2 = dense13.to("cuda", dtype), dense2.to("cuda", dtype)
    w13_t, w2_t = w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    rows = []
    for t in tokens:
        x = (torch.randn(t, shape.hidden, generator=gen) / 4).to("cuda", dtype)
        weights, ids = random_routing(t, shape, gen)
        fns = {"mixed_gemm": lambda: moe(x, packed[0], packed[1], weights, ids),
               "dense loop": lambda: dense_loop(x, w13, w2, weights, ids)}
        if t * shape.top_k * 3 * shape.hidden * shape.inter * w13.element_size() <= GATHER_LIMIT:
            fns["gathered bmm"] = lambda: dense_gathered(x, w13, w2, weights, ids)
        grouped_error = ""
        if hasattr(torch, "_grouped_mm"):
            try:
                dense_grouped(x, w13_t, w2_t, weights, ids)
                fns["torch._grouped_mm"] = lambda: dense_grouped(x, w13_t, w2_t, weights, ids)
            except (RuntimeError, TypeError, ValueError) as exc:  # dtype/arch this torch does not run
                grouped_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        timed = _cold_s(fns, reps)
        secs = {name: t for name, (t, _) in timed.items()}
        best_dense = min((k for k in secs if k != "mixed_gemm"), key=secs.get)
        floor = routed_floor_s(shape, ids, bandwidth, group_size=group_size)
        row = dict(model=name, tokens=t, active_experts=int(torch.unique(ids).numel()),
                   mixed_gemm_us=secs["mixed_gemm"] * 1e6, dense=best_dense, dense_us=secs[best_dense] * 1e6,
                   dense_loop_us=secs["dense loop"] * 1e6, floor_us=floor * 1e6,
                   mixed_gemm_how=timed["mixed_gemm"][1], dense_how=timed[best_dense][1],
                   speedup=secs[best_dense] / secs["mixed_gemm"], share_of_floor=floor / secs["mixed_gemm"])
        if "torch._grouped_mm" in secs:
            row["grouped_mm_us"] = secs["torch._grouped_mm"] * 1e6
        if grouped_error:
            row["grouped_mm_error"] = grouped_error
        rows.append(row)
        log(table_line(row))
    return rows


TABLE_HEAD = ["| model | tokens | active experts | mixed_gemm µs | best dense (which) µs | speedup | int4 floor µs "
              "| share of floor |", "|---|---|---|---|---|---|---|---|"]
# µs figures carry "(g)" when replayed from a CUDA graph, "(e)" when eager (not capturable).


def table_line(r: Dict) -> str:
    how = lambda key: "" if key not in r else f" ({r[key][0]})"  # noqa: E731
    return (f"| {r['model']} | {r['tokens']} | {r['active_experts']} | {r['mixed_gemm_us']:.1f}{how('mixed_gemm_how')} | "
            f"{r['dense_us']:.1f}{how('dense_how')} ({r['dense']}) | {r['speedup']:.2f}x | {r['floor_us']:.1f} | "
            f"{100 * r['share_of_floor']:.0f}% |")
