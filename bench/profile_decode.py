"""Where one decode step's time goes: a random Llama-3-8B-shaped model in fp16, its
mixed_gemm int4 twin (fused projections) and the tinygemm peer (bf16 int4, the same codes), under
torch.profiler.

Two views per model:
  - eager: one token forward (batch x 1, no KV cache); GPU time and launches per kernel class,
    with the step replayed from a CUDA graph beside it, so "gaps" = graph step - GPU busy is what
    the GPU idles between kernels even without a host in the loop;
  - compiled: ``generate`` with a static cache (torch.compile, CUDA-graph trees), profiled over
    ``--tokens`` new tokens after a warm-up; per token: wall, GPU busy and the classes.

The lm_head and the RMSNorms are told apart by profiler ranges opened in module hooks; the
other classes by kernel name.

    python bench/profile_decode.py [--layers 32] [--batch 1] [--tokens 16] [--json FILE]
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from mixed_gemm.integrations import e2e

GEMM_INT4 = "int4 GEMM"
GEMM_FP16 = "fp16 GEMM (cuBLAS)"
ORDER = (GEMM_INT4, GEMM_FP16, "lm_head", "attention", "RMSNorm", "fused elementwise (Inductor)",
         "elementwise (rotary, residual, SiLU*up, casts)", "cat/copy", "other")


def kernel_class(name: str) -> str:
    n = name.lower()
    if n.startswith("mg_") or "tinygemm" in n or "_reduce" in n and "mg" in n:
        return GEMM_INT4
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "efficient")):
        return "attention"
    if n.startswith("triton"):
        return "fused elementwise (Inductor)"
    if any(k in n for k in ("nvjet", "gemm", "gemv", "xmma", "cutlass")):
        return GEMM_FP16
    if any(k in n for k in ("cat", "copy")):
        return "cat/copy"
    if any(k in n for k in ("elementwise", "reduce")):
        return "elementwise (rotary, residual, SiLU*up, casts)"
    return "other"


def annotate(model) -> list:
    """Profiler ranges around the lm_head and every RMSNorm (module hooks); returns the handles."""
    handles = []

    def wrap(mod, label):
        def pre(m, args):
            m._mg_range = record_function(label)
            m._mg_range.__enter__()

        def post(m, args, out):
            m._mg_range.__exit__(None, None, None)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))

    for name, mod in model.named_modules():
        if name.endswith("lm_head"):
            wrap(mod, "mg.lm_head")
        elif type(mod).__name__.endswith("RMSNorm"):
            wrap(mod, "mg.RMSNorm")
    return handles


def _subtree_kernels(evt):
    out = [(k.name, k.duration) for k in getattr(evt, "kernels", [])]
    for child in evt.cpu_children:
        out += _subtree_kernels(child)
    return out


def classify(prof, steps: int = 1):
    """(µs per class, launches per class, GPU busy µs), each divided by ``steps``."""
    us, count = collections.Counter(), collections.Counter()
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA and not evt.name.startswith("mg."):
            dur = evt.time_range.elapsed_us()
            us[kernel_class(evt.name)] += dur
            count[kernel_class(evt.name)] += 1
    for evt in prof.events():  # move the annotated modules' kernels out of their name classes
        if evt.device_type == torch.autograd.DeviceType.CPU and evt.name in ("mg.lm_head", "mg.RMSNorm"):
            label = evt.name[3:]
            for name, dur in _subtree_kernels(evt):
                us[kernel_class(name)] -= dur
                count[kernel_class(name)] -= 1
                us[label] += dur
                count[label] += 1
    busy = sum(us.values())
    return ({k: v / steps for k, v in us.items() if v > 0}, {k: v / steps for k, v in count.items() if v > 0},
            busy / steps)


@torch.no_grad()
def eager_view(model, batch: int):
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    for _ in range(3):
        model(ids, use_cache=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(ids, use_cache=False)
        torch.cuda.synchronize()
    return classify(prof)


@torch.no_grad()
def compiled_view(model, batch: int, tokens: int):
    ids = torch.randint(0, model.config.vocab_size, (batch, e2e.PROMPT), device="cuda")
    kw = dict(do_sample=False, cache_implementation="static")
    for _ in range(2):  # compile, record the graphs
        model.generate(ids, max_new_tokens=tokens + 1, min_new_tokens=tokens + 1, **kw)
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    torch.cuda.synchronize()
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=tokens + 1, min_new_tokens=tokens + 1, **kw)
    torch.cuda.synchronize()
    per_token_ms = (time.perf_counter() - t - prefill) / tokens * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.generate(ids, max_new_tokens=tokens + 1, min_new_tokens=tokens + 1, **kw)
        torch.cuda.synchronize()
    us, count, busy = classify(prof, steps=tokens + 1)
    return us, count, busy, per_token_ms


def lm_head_graph_ms(model, batch: int) -> float:
    """The lm_head alone (batch x hidden -> vocab), replayed from a CUDA graph."""
    head = model.lm_head
    x = torch.randn(batch, 1, model.config.hidden_size, device="cuda", dtype=model.dtype)
    with torch.no_grad():
        for _ in range(2):
            head(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            head(x)
        return e2e.cuda_ms(graph.replay, reps=20)


def table(title: str, names, rows, extra) -> list:
    lines = [f"### {title}", "", "| kernel class | " + " | ".join(f"{n} µs | launches" for n in names) + " |",
             "|---|" + "---|---|" * len(names)]
    labels = [k for k in ORDER if any(k in rows[n][0] for n in names)]
    for k in labels:
        lines.append(f"| {k} | " + " | ".join(f"{rows[n][0].get(k, 0):.0f} | {rows[n][1].get(k, 0):.0f}"
                                             for n in names) + " |")
    lines.append("| **GPU busy** | " + " | ".join(f"**{rows[n][2]:.0f}** | {sum(rows[n][1].values()):.0f}"
                                                   for n in names) + " |")
    for label, fn in extra:
        lines.append(f"| {label} | " + " | ".join(f"{fn(n)} | " for n in names) + "|")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16, help="new tokens profiled in the compiled view")
    ap.add_argument("--no-compiled", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    fp16, int4 = e2e.build_models("llama3-8b", args.layers)
    models = {"fp16": fp16, "mixed_gemm": int4, e2e.PEER: e2e.build_peer(fp16)}
    graph = {n: statistics.median([e2e.decode_step_ms(m, args.batch) for _ in range(3)]) for n, m in models.items()}
    head = {n: lm_head_graph_ms(m, args.batch) for n, m in models.items()}
    hooks = [h for m in models.values() for h in annotate(m)]
    eager = {n: eager_view(m, args.batch) for n, m in models.items()}
    for h in hooks:  # Dynamo would trace the ranges' hooks: the compiled view goes without them
        h.remove()
    names = list(models)
    out = [f"One decode step, llama3-8b {args.layers} layers, batch {args.batch}, {torch.cuda.get_device_name()}", ""]
    out += table("eager token forward (GPU µs and launches per step)", names, eager, [
        ("step in a CUDA graph, ms", lambda n: f"{graph[n]:.2f}"),
        ("gaps in the graph (graph - busy), ms", lambda n: f"{graph[n] - eager[n][2] / 1e3:.2f}"),
        ("lm_head alone in a graph, ms", lambda n: f"{head[n]:.3f}")])
    result = {"eager": eager, "graph_ms": graph, "lm_head_ms": head}
    if not args.no_compiled:
        comp = {n: compiled_view(m, args.batch, args.tokens) for n, m in models.items()}
        out += table(f"compiled generate, static cache (per new token, {args.tokens} tokens)", names,
                     {n: c[:3] for n, c in comp.items()}, [
                         ("wall per token, ms", lambda n: f"{comp[n][3]:.2f}"),
                         ("host/gaps (wall - busy), ms", lambda n: f"{comp[n][3] - comp[n][2] / 1e3:.2f}")])
        result["compiled"] = comp
    print("\n".join(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main()
