"""``mixed-gemm bench --moe --breakdown``: where one mg.moe layer's time goes, stage by stage.

The layer is captured in a CUDA graph behind a write of a buffer twice the L2 (cold L2, as the
bench times it; capture always takes the grouped path, ops/moe.py) and replayed under
torch.profiler; every kernel of a replay gets a stage from its name (:func:`stage_of`): the
routing sort (the tile families' two counting-sort kernels, ``*_route_count`` / ``*_route_scatter``,
or torch's stable sort where a path still uses it), the routing bookkeeping (pointer arrays,
zeroing, the weights to fp32, the fused down's rounding copy), the gathers and scatters of
activation rows (x into expert order, h where it is not handed over sorted), the gate|up GEMM,
SiLU(gate) * up, the down GEMM, and the top-k combine. Every grouped family fuses SiLU * up into
the gate|up GEMM's epilogue, moe_gemv and moe_sm80's fused down the combine into their down
kernels: those show as ``fused`` (moe_sm80's fused gate|up reads x by index: no gathers). The op itself is not touched: kernel times come from the profiler (CUPTI
reports each kernel of a graph replay), grouped by replay, median over replays. ``span`` is the
replay's first kernel start to its last kernel end, so span minus the kernels' sum is the time the
GPU sat between kernels. A kernel launched as a programmatic dependent starts before the one it
waits on ends; each kernel is counted from the end of the ones before it (:func:`exclusive`).
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Dict, List, Sequence, Tuple

import torch

STAGES = ("sort", "routing", "gathers", "gate|up GEMM", "SiLU·mul", "down GEMM", "top-k combine")
# Stages a grouped family may run inside another stage's kernel: an empty one is shown as fused.
FUSABLE = ("SiLU·mul", "top-k combine")
_SIXTEEN_BIT = ("Half", "BFloat16", "bfloat16", "__half", "OpaqueType<2>")


def stage_of(name: str, gate_up_seen: bool) -> str:
    """The stage of a kernel called ``name`` in one mg.moe call; ``gate_up_seen``: a gate|up GEMM
    kernel came earlier in the call (mg's grouped GEMMs whose names do not say their projection,
    moe_sm90a's, are told apart by order: gate|up runs first)."""
    low = name.lower()
    if "combine" in low:
        return "top-k combine"
    if name.startswith("mg_"):  # our kernels (extern "C" names: the config's kernel_name)
        if "_route_count" in low or "_route_scatter" in low:  # the counting sort (templates/common/moe_sort.cuh)
            return "sort"
        if low.endswith("_gather") or low.startswith("mg_gather"):  # the grouped libraries' mg_gather_k
            return "gathers"
        if low == "mg_pointers":
            return "routing"
        if "gate_up" in low or "_w13_" in low:
            return "gate|up GEMM"
        if "_w2_" in low:
            return "down GEMM"
        return "down GEMM" if gate_up_seen else "gate|up GEMM"
    if "silu" in low:
        return "SiLU·mul"
    if "sort" in low or "fill_index_and_segment" in low:  # torch's sort: cub radix passes, its in-place kernels
        return "sort"
    if any(w in low for w in ("index", "gather", "scatter")) and any(t in name for t in _SIXTEEN_BIT):
        return "gathers"  # moving activation rows (16-bit); the int64 index work is routing
    return "routing"


def classify(kernels: Sequence[Tuple[str, float]]) -> Dict[str, Tuple[float, int]]:
    """``{stage: (µs, kernels)}`` of one call's ``(name, µs)`` kernels, in launch order."""
    out = {stage: (0.0, 0) for stage in STAGES}
    seen = False
    for name, us in kernels:
        stage = stage_of(name, seen)
        seen = seen or stage == "gate|up GEMM"
        t, n = out[stage]
        out[stage] = (t + us, n + 1)
    return out


def split_replays(events: Sequence[Tuple[str, float, float, int]], replays: int) -> List[List[Tuple[str, float, float]]]:
    """The kernels ``(name, start µs, end µs)`` of each of ``replays`` graph replays, in order, from
    the profiler's device events ``(name, start, end, correlation id)``: a replay's kernels share
    the correlation id of its graph launch (else, with no ids, the events split into equal runs).
    The first kernel of each replay (the L2 flush) is dropped."""
    groups: Dict[int, List[Tuple[str, float, float]]] = {}
    for name, start, end, corr in events:
        groups.setdefault(corr, []).append((name, start, end))
    runs = [sorted(g, key=lambda k: k[1]) for c, g in groups.items() if c]
    sizes = Counter(len(r) for r in runs)
    size = max(sizes, key=lambda s: (sizes[s], s)) if sizes else 0
    runs = [r for r in runs if len(r) == size]
    if len(runs) != replays:
        ordered = sorted(((n, s, e) for n, s, e, _ in events), key=lambda k: k[1])
        if not ordered or len(ordered) % replays:
            raise ValueError(f"events: cannot split {len(ordered)} kernels into {replays} replays")
        size = len(ordered) // replays
        runs = [ordered[i * size:(i + 1) * size] for i in range(replays)]
    runs.sort(key=lambda r: r[0][1])
    return [r[1:] for r in runs]


def exclusive(kernels: Sequence[Tuple[str, float, float]]) -> List[Tuple[str, float]]:
    """``(name, µs)`` of each kernel of one replay counted from the later of its start and the end of
    every kernel before it: a programmatic dependent launch (moe_gemv's down kernel) starts while
    the kernel before it finishes and waits, and that overlap belongs to the kernel it waited on."""
    out, frontier = [], float("-inf")
    for name, start, end in kernels:
        out.append((name, max(0.0, end - max(start, frontier))))
        frontier = max(frontier, end)
    return out


def summarize(replays: Sequence[Sequence[Tuple[str, float, float]]]) -> Dict:
    """Per stage the median µs (:func:`exclusive`) and the kernels per call; their sum (so that the
    stages' shares add up to 100%) and the span of a call; per replay its kernels' sum and its span
    (a sum of per-stage medians can exceed the median span when replays vary, one replay's sum
    cannot exceed its own span)."""
    timed = [exclusive(r) for r in replays]
    per = [classify(t) for t in timed]
    stages = {st: statistics.median(p[st][0] for p in per) for st in STAGES}
    counts = {st: per[0][st][1] for st in STAGES}
    spans = [r[-1][2] - r[0][1] for r in replays if r]
    return dict(stage_us=stages, stage_kernels=counts, kernels=sum(counts.values()),
                sum_us=sum(stages.values()), span_us=statistics.median(spans),
                replay_sum_us=[sum(us for _, us in t) for t in timed if t], replay_span_us=spans,
                names=sorted({n for n, _, _ in replays[0]}))


def profile_replays(fn, replays: int = 5) -> List[List[Tuple[str, float, float]]]:
    """``fn`` (called once first, outside) captured behind an L2 flush and replayed ``replays``
    times under torch.profiler: each replay's kernels (:func:`split_replays`). RuntimeError where
    ``fn`` cannot be captured."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from ..profiler.timing import graph_of, l2_flush_buffer

    flush = l2_flush_buffer()
    fn()
    torch.cuda.synchronize()
    graph = graph_of(lambda: (flush.zero_(), fn()), 1)
    if graph is None:
        raise RuntimeError("the layer could not be captured in a CUDA graph")
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.time_range.end, getattr(e, "linked_correlation_id", 0) or 0)
              for e in prof.events() if e.device_type == DeviceType.CUDA]
    del graph
    return split_replays(events, replays)


def breakdown(layer, tokens: Sequence[int], replays: int = 5) -> List[Dict]:
    """One row per token count for ``layer`` (a :class:`.moe.MoeLayer`): :func:`summarize` of its
    replays and the grouped kernels that ran, or ``error`` where it could not be profiled."""
    from ..ops import moe
    from ..ops.moe_grouped import grouped_plan
    from .moe import layer_inputs

    shape, rows = layer.shape, []
    for t in tokens:
        x, weights, ids = layer_inputs(layer, t)
        plan = grouped_plan(x, layer.w13, layer.w2, shape.top_k)
        row = dict(model=layer.name, tokens=t, kernels_run=plan if isinstance(plan, str) else
                   " + ".join(f"{f.name}:{c.schedule}" for f, c in zip(plan.families, plan.configs)))
        try:
            row.update(summarize(profile_replays(lambda: moe(x, layer.w13, layer.w2, weights, ids), replays)))
        except Exception as exc:  # noqa: BLE001 - a stage table that cannot be made is a note, not a failed bench
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        rows.append(row)
    return rows


def _cell(r: Dict, stage: str) -> str:
    us, n = r["stage_us"][stage], r["stage_kernels"][stage]
    if not n:
        return "fused" if stage in FUSABLE else "-"
    return f"{us:.1f} ({100 * us / r['sum_us']:.0f}%)"


def table(rows: List[Dict]) -> List[str]:
    """One markdown table per model: per token count each stage's µs (share of the kernels' sum),
    the sum, the span, the kernels launched and the grouped kernels that ran."""
    out: List[str] = []
    for model in dict.fromkeys(r["model"] for r in rows):
        head = ("| tokens | " + " | ".join(s.replace("|", "\\|") for s in STAGES)
                + " | kernels' sum | span | kernels | grouped kernels |")
        out += [f"### {model}: mg.moe by stage, µs per layer (share of the kernels' sum)", "", head,
                "|" + "---|" * (head.replace("\\|", "").count("|") - 1)]
        for r in (r for r in rows if r["model"] == model):
            if "error" in r:
                out.append(f"| {r['tokens']} | " + " | ".join("-" for _ in STAGES) + f" | - | - | - | {r['error']} |")
                continue
            out.append(f"| {r['tokens']} | " + " | ".join(_cell(r, s) for s in STAGES)
                       + f" | {r['sum_us']:.1f} | {r['span_us']:.1f} | {r['kernels']} | {r['kernels_run']} |")
        out.append("")
    return out
