"""Tensor parallel on two GPUs (NCCL): Llama-3-70B-shaped int4 g128 stacks with random weights.

    torchrun --nproc-per-node 2 bench/tp_two_gpu.py [--layers 4] [--batches 1,16] [--mem-layers 80]

1. logits: a stack of ``--layers`` 70B-shaped decoder layers (+ embeddings, lm_head), TP=2
   (column-parallel q/k/v/gate/up, row-parallel o/down + all-reduce, projections fused per rank)
   against TP=1 on the same weights (both fp16 activations); passes when the norm-wise relative
   difference is below 1e-2 (fp16 sums in another order, through ``--layers`` layers).
2. decode step (one token per sequence, no KV cache) replayed in a CUDA graph, batch 1 and 16:
   the decoder stack (layers + final norm) and the whole step (+ replicated lm_head); TP=2 vs TP=1.
3. memory: an 80-layer 70B-shaped int4 model at TP=2, built on the meta device, every rank
   generating only its own slices on its GPU and prepacking them (no full weight on any GPU);
   ``torch.cuda.max_memory_allocated()`` per GPU after building and after a batch-16 step.

Sets ``NCCL_NVLS_ENABLE=0`` (NVLink multicast off) unless already set; every rank stops itself
after ``--time-limit`` seconds (default 280). Rank 0 prints the table; exit status 1 on a failed
logits check. Run from the repository root (or with mixed_gemm installed).
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import sys
import time
import zlib
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # before NCCL initializes
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

GROUP = 128


def log(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


# A CPU dry run (gloo, no timings) of the same code: `--preset tiny` (70B shapes need a GPU).
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


def config(preset: str, layers: int):
    import transformers

    from mixed_gemm.integrations.e2e import PRESETS

    fields = TINY if preset == "tiny" else PRESETS[preset]
    return transformers.LlamaConfig(**dict(fields, num_hidden_layers=layers, max_position_embeddings=4096,
                                           tie_word_embeddings=False))


def random_plain(n: int, k: int, gen: torch.Generator, device="cpu"):
    """Canonical int4 g128 ``(q, s, z)`` sized so each layer's output is O(1)."""
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8, device=device)
    s = ((torch.rand(n, k // GROUP, generator=gen, device=device) + 0.5) * (2.0 / (16 * k**0.5))).half()
    z = torch.randint(0, 16, (n, k // GROUP), generator=gen, device=device).half()
    return {"qweight": q, "scales": s, "qzeros": z}


SPEC = dict(format="plain", bits=4, group_size=GROUP, symmetric=False, act_order=False)


def projections(model):
    from torch import nn

    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]


def fill_replicated(model, device, broadcast: bool):
    """Embeddings, norms and lm_head (still on the meta device): seeded random values, the same on
    every rank (broadcast from rank 0 for TP)."""
    from mixed_gemm.integrations.loading import set_tensor

    for name, p in list(model.named_parameters()):
        if not p.is_meta:
            continue
        gen = torch.Generator(device=device).manual_seed(seed(name))
        t = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32)
        t = 1 + 0.05 * t if "norm" in name else t * (p.shape[-1] ** -0.5 if "lm_head" in name else 1.0)
        t = t.half()
        if broadcast:
            dist.broadcast(t, src=0)
        set_tensor(model, name, t)


def build(cfg, weights, *, tp_rank, tp_size, device, fuse=True, norms=False):
    """The model with this rank's shards cut from ``weights`` (whole CPU tensors per module).
    ``norms``: the skip connections and norms fused too: at TP=1 into the projections' epilogues
    (``fuse_projections(residual=True)``), at TP=2 into the all-reduces (``fuse_all_reduce_norms``)."""
    from mixed_gemm.integrations.fuse import fuse_projections
    from mixed_gemm.integrations.tp_fuse import fuse_all_reduce_norms
    from mixed_gemm.integrations.tp import shard_projections
    from mixed_gemm.integrations.loading import empty_model, finish_loading

    model = empty_model(cfg, torch.float16)
    shard_projections(model, weights.__getitem__, projections(model), spec=SPEC, tp_rank=tp_rank, tp_size=tp_size,
                      device=device)
    fill_replicated(model, device, broadcast=tp_size > 1)
    finish_loading(model, False, device, "random weights")
    if fuse:
        fuse_projections(model, residual=norms and tp_size == 1)
    if norms and tp_size > 1:
        fuse_all_reduce_norms(model)
    return model.eval()


def timed_ms(fn, reps=20) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


def step_fn(model, batch: int, stack: bool, device, compiled: bool):
    """One decode step (batch x 1 token, no KV cache): the decoder stack or the whole model,
    through torch.compile (Inductor fuses norms, rotary, residuals, SiLU·mul) when ``compiled``."""
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device,
                        generator=torch.Generator(device=device).manual_seed(batch))
    emb = model.model.embed_tokens(ids)
    body = model.model if stack else model
    if compiled:
        body = torch.compile(body, dynamic=False)
    return (lambda: body(inputs_embeds=emb, use_cache=False)) if stack else (lambda: body(ids, use_cache=False))


# Kernel classes of the breakdown: ours (every family's kernels are named mg_*), NCCL, the rest.
def kernel_class(name: str) -> str:
    return "quantized GEMM" if name.startswith("mg_") else "all-reduce" if "nccl" in name.lower() else "other"


def breakdown(fn, layers: int, reps: int = 5) -> str:
    """GPU time per decoder layer by kernel class (torch.profiler, eager launches: kernel time only)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us, count = {}, {}
    for e in prof.key_averages():
        if e.device_type.name != "CUDA" or e.self_device_time_total <= 0:
            continue
        c = kernel_class(e.key)
        us[c] = us.get(c, 0.0) + e.self_device_time_total / (reps * layers)
        count[c] = count.get(c, 0) + e.count / (reps * layers)
    return ", ".join(f"{c} {us[c]:.1f} µs ({count[c]:.0f})" for c in sorted(us))


@torch.no_grad()
def step_ms(model, batch: int, stack: bool, device, compiled: bool = False, detail: bool = False):
    """One decode step (batch x 1 token, no KV cache) in a CUDA graph: ``(ms, how, breakdown)``."""
    fn = step_fn(model, batch, stack, device, compiled)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    parts = breakdown(fn, model.config.num_hidden_layers) if detail else ""
    dist.barrier()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            fn()
        graph.replay()
        ms, how = timed_ms(graph.replay), "graph"
        del graph
    except RuntimeError as e:  # report eager timings rather than nothing
        log(f"  (CUDA graph capture failed, eager timing instead: {str(e).splitlines()[0][:120]})")
        ms, how = timed_ms(fn), "eager"
    dist.barrier()
    return ms, how + ("+compile" if compiled else ""), parts


def graph_us(fn, reps: int = 20) -> float:
    """Mean µs of ``fn`` replayed ``reps`` times from one CUDA graph (median of 5 replays)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        dist.barrier()
        times.append(timed_ms(graph.replay, 1) * 1000 / reps)
    return sorted(times)[2]


@torch.no_grad()
def allreduce_rows(args, device):
    """The all-reduce a row-parallel layer does (batch x hidden fp16), alone in a graph: NCCL through
    torch.distributed, and torch's symmetric-memory one-shot all-reduce (peer loads over NVLink, no
    multicast) where this torch has it, for comparison."""
    hidden = config(args.preset, 1).hidden_size
    rows = []
    for batch in args.batches:
        x = torch.randn(batch, hidden, device=device, dtype=torch.float16)
        nccl = graph_us(lambda: dist.all_reduce(x))
        try:
            import torch.distributed._symmetric_memory as symm_mem

            name = dist.group.WORLD.group_name
            buf = symm_mem.empty(batch * hidden, dtype=torch.float16, device=device)
            symm_mem.rendezvous(buf, name)
            buf.normal_()
            one = f"{graph_us(lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, 'sum', name)):.1f} µs"
        except Exception as e:  # noqa: BLE001 - a comparison row, not a requirement
            one = f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
        rows.append((f"all-reduce, batch {batch}", f"{batch}x{hidden} fp16, in a CUDA graph",
                     f"NCCL {nccl:.1f} µs; symmetric-memory one-shot {one}", ""))
    return rows


@torch.no_grad()
def logits_and_speed(args, rank, device):
    cfg = config(args.preset, args.layers)
    t0 = time.time()
    from mixed_gemm.integrations.loading import empty_model

    names = projections(empty_model(cfg, torch.float16))
    weights = {}
    for name in names:  # the same whole weights on every rank, on the CPU
        shape = _shape(cfg, name)
        weights[name] = random_plain(*shape, torch.Generator().manual_seed(seed(name)))
    log(f"random weights for {args.layers} layers: {time.time() - t0:.1f} s")
    tp1 = build(cfg, weights, tp_rank=0, tp_size=1, device=device, norms=args.norms)
    tp2 = build(cfg, weights, tp_rank=rank, tp_size=2, device=device, norms=args.norms)
    del weights
    gc.collect()
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3)).to(device)
    want, got = tp1(ids, use_cache=False).logits.float(), tp2(ids, use_cache=False).logits.float()
    rel = ((got - want).norm() / want.norm()).item()
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    ok = rel < 1e-2
    fused = ", norms fused" if args.norms else ""
    rows = [("logits, TP=2 vs TP=1", f"{args.layers} layers, 2x16 tokens{fused}",
             f"rel {rel:.2e}, max|d| {(got - want).abs().max().item():.3g}, argmax agree {agree:.1%}",
             "PASS" if ok else "FAIL")]
    for compiled in args.compile if device.type == "cuda" else ():
        for batch in args.batches:
            for stack in (True, False):
                detail = args.breakdown and stack
                a, how_a, parts_a = step_ms(tp1, batch, stack, device, compiled, detail)
                b, how_b, parts_b = step_ms(tp2, batch, stack, device, compiled, detail)
                what = ("decoder stack" if stack else "whole step (+ lm_head, replicated)") + fused
                rows.append((f"decode step, batch {batch}", f"{what}, {args.layers} layers",
                             f"TP=1 {a:.3f} ms, TP=2 {b:.3f} ms ({how_a}/{how_b})", f"{a / b:.2f}x"))
                if detail:
                    rows.append((f"per layer, batch {batch}", "GPU time by kernel (profiler, eager" +
                                 (", compiled)" if compiled else ")"), f"TP=1: {parts_a}; TP=2: {parts_b}", ""))
    del tp1, tp2
    return rows, ok


def _shape(cfg, name):
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    leaf = name.rpartition(".")[2]
    return {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h), "gate_proj": (i, h),
            "up_proj": (i, h), "down_proj": (h, i)}[leaf]


@torch.no_grad()
def memory(args, rank, device):
    """The 80-layer model at TP=2, each rank generating and prepacking its slices only."""
    from mixed_gemm.integrations.tp import parallel_style, shard_projections
    from mixed_gemm.integrations.loading import empty_model, materialize

    cuda = device.type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    peak = (lambda: torch.cuda.max_memory_allocated(device)) if cuda else (lambda: 0)
    base = peak()
    cfg = config(args.preset, args.mem_layers)
    model = empty_model(cfg, torch.float16)
    gen = torch.Generator(device=device).manual_seed(seed(rank))

    def rank_slices(name):
        n, k = _shape(cfg, name)
        n, k = (n // 2, k) if parallel_style(name) == "column" else (n, k // 2)
        return random_plain(n, k, gen, device)

    t0, built = time.time(), 0
    for layer in range(args.mem_layers):
        names = [n for n in projections(model) if n.startswith(f"model.layers.{layer}.")]
        shard_projections(model, rank_slices, names, spec=SPEC, tp_rank=rank, tp_size=2, device=device, sliced=True)
        built += 1
        if time.time() - t0 > args.mem_budget:
            break
    gib = 2.0**30
    per_layer = sum(t.numel() * t.element_size() for n, t in model.named_buffers()
                    if n.startswith("model.layers.0.")) / gib
    if built < args.mem_layers:  # out of time: finish on the meta device, project the rest
        log(f"  memory: built {built} of {args.mem_layers} layers in {args.mem_budget} s; the rest projected")
        return [(f"{args.mem_layers}-layer int4 model, TP=2, per GPU", f"{built}/{args.mem_layers} layers built",
                 f"{per_layer:.3f} GiB/layer -> {per_layer * args.mem_layers:.2f} GiB projected (+ embed, lm_head)",
                 "partial")]
    fill = {n for n, p in model.named_parameters() if p.is_meta}
    materialize(model, device)  # embeddings, norms, lm_head, rotary: real memory, filled in place
    for n, p in model.named_parameters():
        if n in fill:
            p.data.normal_(std=1.0 if p.dim() == 1 else 0.02)
    built_peak = (peak() - base) / gib
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers())) / gib
    ids = torch.randint(0, cfg.vocab_size, (16, 1), device=device)
    model.eval()(ids, use_cache=False)
    step_peak = (peak() - base) / gib
    return [(f"{args.mem_layers}-layer int4 model, TP=2, per GPU", f"{args.mem_layers} layers, built in {time.time() - t0:.0f} s",
             f"weights {weights:.2f} GiB ({per_layer:.3f} GiB/layer), peak building {built_peak:.2f} GiB, "
             f"peak after a batch-16 step {step_peak:.2f} GiB", "")]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama3-70b", help="shapes (mixed_gemm.integrations.e2e.PRESETS, or tiny)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers for the logits and timing runs")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--compile", default="0,1", help="timing runs: 0 plain, 1 torch.compile, 0,1 both")
    ap.add_argument("--norms", type=int, choices=(0, 1), default=1,
                    help="1: skip connections and norms fused (TP=1 into the projections, TP=2 into the all-reduces)")
    ap.add_argument("--breakdown", action="store_true", help="per-layer GPU time by kernel class (profiler)")
    ap.add_argument("--mem-layers", type=int, default=80, help="layers of the memory run (0: skip it)")
    ap.add_argument("--mem-budget", type=float, default=120.0, help="seconds for building the memory model")
    ap.add_argument("--time-limit", type=float, default=280.0, help="every rank exits after this many seconds")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.compile = [c == "1" for c in args.compile.split(",")]
    faulthandler.dump_traceback_later(args.time_limit, exit=True)  # bounded runtime, with a traceback
    local = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = timedelta(seconds=args.time_limit)
    if torch.cuda.is_available():
        if torch.cuda.device_count() < 2:
            raise SystemExit(f"GPUs: this run needs 2, found {torch.cuda.device_count()}")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:  # the dry run: same code on the CPU over gloo
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise SystemExit(f"world size: this run compares TP=2 with TP=1; start it with --nproc-per-node 2, got "
                         f"{dist.get_world_size()}")
    what = (f"{torch.cuda.get_device_name(device)} x2, NCCL {torch.cuda.nccl.version()}" if device.type == "cuda"
            else "CPU dry run (gloo): no timings, no GPU memory")
    log(f"{what}, torch {torch.__version__}, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}, preset {args.preset}")
    start = time.time()
    rows, ok = logits_and_speed(args, rank, device)
    if device.type == "cuda":
        rows += allreduce_rows(args, device)
    if args.mem_layers:
        rows += memory(args, rank, device)
    log("\n| check | setup | result | verdict |\n|---|---|---|---|")
    for r in rows:
        log("| " + " | ".join(r) + " |")
    log(f"\n{'PASS' if ok else 'FAIL'} ({time.time() - start:.0f} s)")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
