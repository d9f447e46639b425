"""Tensor-parallel decode step: our all-reduce against NCCL, TP=N against TP=1 (Llama-3-70B shapes).

    torchrun --nproc-per-node 2 bench/tp_decode.py [--layers 80] [--batches 1,16,64] [--compile 0,1]
    torchrun --nproc-per-node 4 bench/tp_decode.py ...                            # TP=4 (N GPUs: TP=N)
    torchrun --nproc-per-node 2 bench/tp_decode.py --preset tiny --layers 2      # CPU dry run (gloo)

The tensor-parallel size is the world size N >= 2 (one GPU per rank); the preset must split at it
(heads, KV heads, hidden and intermediate sizes divisible by N, the row-parallel K per rank a
multiple of the group size 128), else it stops before building anything. Below, TP=N is the
world size (TP=2 on two GPUs).

What it measures (rank 0 prints one table; every timing is a CUDA graph's replay):

1. check: a ``--check-layers`` stack at TP=N (each all-reduce mode) against TP=1 on the same
   weights, 4 tokens: the norm-wise relative difference of the stack's output (PASS <= 2e-3), and
   our all-reduce's output against NCCL's (bit-identical over two ranks; over more ranks the two
   sum in different orders, so within the same 2e-3).
2. all-reduce alone, 16 KB .. 1 MB (1 .. 64 rows x hidden, fp16): NCCL, ours (one-shot and
   two-shot) and torch's symmetric-memory one-shot; then the all-reduce fused with the residual
   add and RMSNorm against ours + torch's ops and NCCL + torch's ops (µs per call, 20 calls a graph).
2b. row-parallel layer, per call at TP=N (o_proj hidden x hidden/N, down_proj hidden x
   intermediate/N, int4 g128, residual on rank 0): the GEMM alone, GEMM + NCCL, GEMM + ours and
   the GEMM fused with the all-reduce (one gemv kernel; GEMM + ours where it does not apply, e.g.
   batch 64), per ``--batches`` (µs per call, 20 calls a graph).
3. decode step: an ``--layers``-layer stack (one token per sequence, int4 g128 projections cut by
   ``shard_linear``: q|k|v and gate|up column-parallel, o and down row-parallel; attention over a
   ``--context``-token KV cache with torch's SDPA, of the real bytes per step; RMSNorm, rotary,
   SiLU·mul in torch ops) at TP=1 (one GPU holds the whole int4 model) and TP=N with the
   all-reduce by NCCL, by ours, ours fused with residual + RMSNorm, and the row-parallel GEMMs
   fused with their all-reduce (``gemm_fused``); plain (CUDA graph) and
   ``torch.compile`` (each layer compiled once, then the stack captured in a CUDA graph). The
   all-reduce's share per layer is the step minus the same step without any all-reduce (wrong
   sums, right bytes), divided by the layers; ``--breakdown`` adds GPU time by kernel class
   (profiler, eager launches).

Sets ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (no NVLink multicast) and
``MIXED_GEMM_JIT=block`` unless already set: a first run compiles the GEMM kernels of every shape
and batch (minutes for batch 64's sm90a kernels), later runs find them in the kernel cache.
``MIXED_GEMM_ALLREDUCE`` is left alone: the modes above choose per layer. Every rank stops itself
after ``--time-limit`` seconds. Exit status 1 on a failed check. Each part's rows are printed as
``row: | ... |`` lines as soon as it has them (a run cut short keeps what it measured), and the
whole table at the end. Run from the repository root (or with mixed_gemm installed).
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
# Time (and compare) the kernels selection picks, compiled before first use, never a stand-in that
# runs while they build in the background and switches mid-run.
os.environ.setdefault("MIXED_GEMM_JIT", "block")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from mixed_gemm.integrations.e2e import cuda_ms  # noqa: E402
from mixed_gemm.nn.parallel import all_reduce_residual_rms_norm  # noqa: E402

GROUP, EPS, ROPE_THETA = 128, 1e-5, 500000.0
# Splits at TP=2 and TP=4 (row-parallel K per rank 128 and 256 at TP=4: whole groups).
TINY = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=4)


def log(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def emit(rows):
    """Table rows as soon as a part has them (the whole table repeats at the end): a run that
    meets --time-limit or its caller's timeout still leaves what it measured."""
    for r in rows:
        log("row: | " + " | ".join(r) + " |")


def shapes(preset: str) -> dict:
    if preset == "tiny":
        return dict(TINY)
    from mixed_gemm.integrations.e2e import PRESETS

    p = PRESETS[preset]
    return {k: p[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")}


def check_split(cfg: dict, preset: str, tp: int) -> None:
    """Stop (SystemExit naming the preset, the field and ``tp``) unless every projection of
    ``cfg`` cuts into ``tp`` equal shards of whole quantization groups."""
    for field in ("num_attention_heads", "num_key_value_heads", "hidden_size", "intermediate_size"):
        if cfg[field] % tp:
            raise SystemExit(f"preset {preset}: {field}={cfg[field]} does not split at tp={tp} "
                             f"(not a multiple of {tp})")
    o_k = cfg["num_attention_heads"] * (cfg["hidden_size"] // cfg["num_attention_heads"])
    for field, k in (("hidden_size", o_k), ("intermediate_size", cfg["intermediate_size"])):
        if (k // tp) % GROUP:
            raise SystemExit(f"preset {preset}: {field}={cfg[field]} at tp={tp} leaves a row-parallel K per rank "
                             f"of {k // tp}, not a multiple of the group size {GROUP}")


def rms_norm(x, w, eps=EPS):
    """One kernel (as mixed_gemm's residual-fused HF layers run it): the TP=1 baseline and the
    unfused TP=N modes must not pay the seven kernels of an op-by-op norm that the fused mode
    removes, which would flatter the fused mode's speedup."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


# ------------------------------------------------------------------ the model
class DecodeLayer(nn.Module):
    """One pre-norm Llama layer for one token per sequence. ``plain``: residuals in the row-parallel
    GEMMs' epilogues (rank 0), all-reduce inside them. ``fused``: the row-parallel layers return
    partial sums and :func:`all_reduce_residual_rms_norm` reduces, adds the residual and applies
    the next RMSNorm."""

    def __init__(self, qkv, o, gate_up, down, w_in, w_post, heads, kv_heads, head_dim, cache, tp_size, group):
        super().__init__()
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down
        self.w_in, self.w_post = nn.Parameter(w_in, requires_grad=False), nn.Parameter(w_post, requires_grad=False)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.register_buffer("k_cache", cache[0])
        self.register_buffer("v_cache", cache[1])
        self.tp_size, self.group = tp_size, group

    def attention(self, h, cos, sin):
        b, d, hk = h.shape[0], self.head_dim, self.kv_heads
        q, k, v = self.qkv(h).split([self.heads * d, hk * d, hk * d], dim=-1)
        q, k = rope(q.view(b, self.heads, d), cos, sin), rope(k.view(b, hk, d), cos, sin)
        kc, vc = self.k_cache[:b], self.v_cache[:b]  # (b, hk, T, d): the new token takes the last slot
        kc[:, :, -1] = k
        vc[:, :, -1] = v.view(b, hk, d)
        # GQA as plain attention: a KV head's query group is its "sequence" (reads K and V once).
        o = F.scaled_dot_product_attention(q.view(b, hk, self.heads // hk, d), kc, vc)
        return o.reshape(b, self.heads * d)

    def mlp_in(self, h):
        g, u = self.gate_up(h).chunk(2, dim=-1)
        return F.silu(g) * u

    def forward_plain(self, x, cos, sin):
        x = self.o(self.attention(rms_norm(x, self.w_in), cos, sin), residual=x)
        return self.down(self.mlp_in(rms_norm(x, self.w_post)), residual=x)

    def forward_fused(self, h, x, w_next, cos, sin):
        row = self.o
        kw = dict(group=self.group, mode=getattr(row, "all_reduce", "nccl"), tp_size=self.tp_size,
                  name=getattr(row, "group_name", None))
        h, x = all_reduce_residual_rms_norm(self.o(self.attention(h, cos, sin)), x, self.w_post, EPS, **kw)
        return all_reduce_residual_rms_norm(self.down(self.mlp_in(h)), x, w_next, EPS, **kw)


def rope(t, cos, sin):
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + rotated * sin


class Stack(nn.Module):
    def __init__(self, layers, w_final, head_dim, device):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.w_final = nn.Parameter(w_final, requires_grad=False)
        inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
        ang = torch.cat([inv, inv]) * 1000.0  # position 1000
        self.register_buffer("cos", ang.cos().half())
        self.register_buffer("sin", ang.sin().half())
        self.fused, self.plain_fn, self.fused_fn = False, DecodeLayer.forward_plain, DecodeLayer.forward_fused

    def forward(self, x):
        layers = self.layers
        if not self.fused:
            for layer in layers:
                x = self.plain_fn(layer, x, self.cos, self.sin)
            return rms_norm(x, self.w_final)
        h = rms_norm(x, layers[0].w_in)
        for i, layer in enumerate(layers):
            w_next = layers[i + 1].w_in if i + 1 < len(layers) else self.w_final
            h, x = self.fused_fn(layer, h, x, w_next, self.cos, self.sin)
        return h

    def set_mode(self, mode: str, compiled: bool) -> None:
        """``nccl``, ``ours`` (auto), ``fused`` (all-reduce + residual + RMSNorm), ``gemm_fused``
        (the row-parallel GEMMs fused with their all-reduce) or ``none`` (no all-reduce: timing only)."""
        self.fused = mode == "fused"
        for layer in self.layers:
            for row in (layer.o, layer.down):
                if hasattr(row, "reduce_results"):
                    row.reduce_results = mode in ("nccl", "ours", "gemm_fused")
                    row.all_reduce = {"nccl": "nccl", "none": "nccl", "gemm_fused": "fused"}.get(mode, "auto")
                    row.fuse_all_reduce = mode == "gemm_fused"
            layer.tp_size = 1 if mode == "none" else layer.o.tp_size if hasattr(layer.o, "tp_size") else 1
        self.plain_fn = COMPILED["plain"] if compiled else DecodeLayer.forward_plain
        self.fused_fn = COMPILED["fused"] if compiled else DecodeLayer.forward_fused


COMPILED = {}


def compile_layers():
    import torch._dynamo.config as dc

    for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(dc, key):
            setattr(dc, key, max(getattr(dc, key), 256))
    COMPILED["plain"] = torch.compile(DecodeLayer.forward_plain, dynamic=False, fullgraph=True)
    COMPILED["fused"] = torch.compile(DecodeLayer.forward_fused, dynamic=False, fullgraph=True)


def random_weight(n, k, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8, device=device)
    s = ((torch.rand(n, k // GROUP, generator=gen, device=device) + 0.5) * (2.0 / (16 * k**0.5))).half()
    z = torch.randint(0, 16, (n, k // GROUP), generator=gen, device=device).half()
    return q, s, z


def build(cfg, layers, *, tp_rank, tp_size, device, batch, context, distinct=0, group=None):
    """The stack with this rank's shards, every projection cut from the full weight by
    ``shard_linear`` (q, k, v and gate, up cut one by one, then fused per rank)."""
    from mixed_gemm.integrations.fuse import concat
    from mixed_gemm.integrations.shard import shard_linear

    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // heads
    kw = dict(tp_rank=tp_rank, tp_size=tp_size, format="plain", bits=4, group_size=GROUP, dtype=torch.float16,
              device=device, group=group)
    built, made = [], {}
    for layer in range(layers):
        key = layer % distinct if distinct else layer
        if key in made:  # --distinct: later layers share an earlier layer's weights (its own KV cache)
            src = made[key]
            parts = (src.qkv, src.o, src.gate_up, src.down, src.w_in.data, src.w_post.data)
        else:
            def cut(name, n, k, style):
                q, s, z = random_weight(n, k, zlib.crc32(f"{key}.{name}".encode()), device)  # same on every rank
                return shard_linear(q, s, z, style=style, **kw)

            qkv = concat([cut("q", heads * d, h, "column"), cut("k", kv * d, h, "column"), cut("v", kv * d, h, "column")])
            gate_up = concat([cut("gate", i, h, "column"), cut("up", i, h, "column")])
            gen = torch.Generator(device=device).manual_seed(key)
            w_in = (1 + 0.05 * torch.randn(h, generator=gen, device=device)).half()
            w_post = (1 + 0.05 * torch.randn(h, generator=gen, device=device)).half()
            parts = (qkv, cut("o", h, heads * d, "row"), gate_up, cut("down", h, i, "row"), w_in, w_post)
        kvl = kv // tp_size
        cache = torch.randn(2, batch, kvl, context, d, device=device, dtype=torch.float16,
                            generator=torch.Generator(device=device).manual_seed(layer))
        mod = DecodeLayer(*parts, heads // tp_size, kvl, d, cache, tp_size, group)
        made.setdefault(key, mod)
        built.append(mod)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    w_final = (1 + 0.05 * torch.randn(h, generator=torch.Generator(device=device).manual_seed(12345),
                                      device=device)).half()
    return Stack(built, w_final, d, device).eval()


# ------------------------------------------------------------------ timing
def graph_ms(fn, collective: bool, reps: int = 20) -> float:
    """Median of 5 timings of ``reps`` replays of one CUDA graph of ``fn`` (after 3 eager calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if collective:
        dist.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(5):
        if collective:
            dist.barrier()
        times.append(cuda_ms(graph.replay, reps))
    del graph
    return sorted(times)[2]


def graph_us_each(fn, calls: int = 20) -> float:
    """µs per call of ``fn`` captured ``calls`` times in one graph."""
    return graph_ms(lambda: [fn() for _ in range(calls)], True, reps=5) * 1000 / calls


def kernel_class(name: str) -> str:
    low = name.lower()
    if "mg_allreduce" in low:
        return "all-reduce (ours)"
    if "mg_gemvar" in low:
        return "int4 GEMM + all-reduce (fused)"
    if "nccl" in low:
        return "all-reduce (NCCL)"
    if low.startswith("mg_"):
        return "int4 GEMM"
    if "flash" in low or "attention" in low or "fmha" in low:
        return "attention"
    return "other"


def breakdown(fn, layers: int, reps: int = 3) -> str:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    us = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            c = kernel_class(e.key)
            us[c] = us.get(c, 0.0) + e.self_device_time_total / (reps * layers)
    return ", ".join(f"{c} {v:.1f}" for c, v in sorted(us.items()))


# ------------------------------------------------------------------ the runs
@torch.no_grad()
def check(args, cfg, rank, device, tp):
    """TP=tp (each mode) against TP=1, ``--check-layers`` layers, 4 tokens."""
    b = 4
    tp1 = build(cfg, args.check_layers, tp_rank=0, tp_size=1, device=device, batch=b, context=args.check_context)
    tpn = build(cfg, args.check_layers, tp_rank=rank, tp_size=tp, device=device, batch=b, context=args.check_context)
    # Each rank's KV cache is its heads' part of TP=1's: copy the slices over.
    kvl = cfg["num_key_value_heads"] // tp
    for l1, l2 in zip(tp1.layers, tpn.layers):
        l2.k_cache.copy_(l1.k_cache[:, rank * kvl:(rank + 1) * kvl])
        l2.v_cache.copy_(l1.v_cache[:, rank * kvl:(rank + 1) * kvl])
    x = torch.randn(b, cfg["hidden_size"], device=device, generator=torch.Generator(device=device).manual_seed(7)).half()
    tp1.set_mode("nccl", False)
    want = tp1(x.clone()).float()
    rows, ok, outs = [], True, {}
    modes = ["nccl", "ours", "fused", "gemm_fused"] if device.type == "cuda" else ["nccl", "fused"]
    for mode in modes:
        tpn.set_mode(mode, False)
        got = tpn(x.clone())
        outs[mode] = got
        rel = ((got.float() - want).norm() / want.norm()).item()
        verdict = "PASS" if rel <= 2e-3 else "FAIL"
        ok &= verdict == "PASS"
        rows.append((f"check, TP={tp} {mode} vs TP=1", f"{args.check_layers} layers, {b} tokens", f"rel {rel:.2e}",
                     verdict))
    if "ours" in outs:
        # Two ranks: both round the exact a + b once, so bit-identical. More: NCCL's ring and our
        # rank-order fp32 sum add in different orders, so only close.
        ours, nccl = outs["ours"], outs["nccl"]
        same = torch.equal(ours, nccl)
        rel = ((ours.float() - nccl.float()).norm() / nccl.float().norm()).item()
        good = same or (tp > 2 and rel <= 2e-3)
        ok &= good
        rows.append(("check, ours vs NCCL", f"same stack, TP={tp}", "bit-identical" if same else
                     f"max|d| {(ours - nccl).abs().max().item():.3g}, rel {rel:.2e}", "PASS" if good else "FAIL"))
    del tp1, tpn
    return rows, ok


@torch.no_grad()
def micro(args, cfg, device):
    from mixed_gemm.nn.parallel import prepare_all_reduce
    from mixed_gemm.ops.allreduce import residual_rms_norm

    h = cfg["hidden_size"]
    comm = prepare_all_reduce(device=device, dtypes=(torch.float16,))
    rows = [("all-reduce setup", "", repr(comm), "")]
    if comm is None:  # MIXED_GEMM_ALLREDUCE=nccl: nothing of ours to time
        return rows
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm = symm_mem.empty(64 * h, dtype=torch.float16, device=device)
        symm_mem.rendezvous(symm, dist.group.WORLD.group_name)
    except Exception as e:  # noqa: BLE001 - a comparison row only
        symm = None
        rows.append(("torch symm-mem one-shot", "", f"n/a ({type(e).__name__}: {str(e)[:80]})", ""))
    name = dist.group.WORLD.group_name
    for r in args.micro_rows:
        x = torch.randn(r, h, device=device, dtype=torch.float16)
        kb = r * h * 2 // 1024
        nccl = graph_us_each(lambda: dist.all_reduce(x))
        one = graph_us_each(lambda: comm.all_reduce_(x, "one_shot"))
        two = graph_us_each(lambda: comm.all_reduce_(x, "two_shot"))
        parts = f"NCCL {nccl:.1f}, ours one-shot {one:.1f}, two-shot {two:.1f}"
        if symm is not None:
            buf = symm[: r * h].view(r, h)
            try:
                us = graph_us_each(lambda: torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", name))
                parts += f", torch symm-mem one-shot {us:.1f}"
            except Exception as e:  # noqa: BLE001 - a comparison only
                parts += f", torch symm-mem one-shot n/a ({type(e).__name__})"
                symm = None
        rows.append((f"all-reduce {kb} KB", f"{r} x {h} fp16, µs per call", parts, f"{nccl / one:.2f}x"))
    for r in args.batches:
        x, res = torch.randn(r, h, device=device).half(), torch.randn(r, h, device=device).half()
        w = torch.randn(h, device=device).half()
        fused = graph_us_each(lambda: comm.all_reduce_residual_rms_norm(x, res, w, EPS))
        split = graph_us_each(lambda: residual_rms_norm(comm.all_reduce(x), res, w, EPS))
        nccl = graph_us_each(lambda: residual_rms_norm(comm.all_reduce(x, "nccl"), res, w, EPS))
        rows.append((f"all-reduce + residual + RMSNorm, {r} rows", f"{r} x {h} fp16, µs per call",
                     f"fused {fused:.1f}, ours + torch ops {split:.1f}, NCCL + torch ops {nccl:.1f}", f"{nccl / fused:.2f}x"))
    return rows


@torch.no_grad()
def micro_gemm(args, cfg, rank, device, tp):
    """Per row-parallel layer at TP=tp: the GEMM alone, GEMM + NCCL, GEMM + ours, the fused kernel."""
    from mixed_gemm.integrations.shard import shard_linear
    from mixed_gemm.nn.parallel import prepare_all_reduce
    from mixed_gemm.ops.allreduce import communicator
    from mixed_gemm.ops.gemm_allreduce import fused_plan

    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    prepare_all_reduce(device=device, dtypes=(torch.float16,))
    comm, rows = communicator(None, device), []
    for name, k in (("o_proj", h), ("down_proj", inter)):
        q, s, z = random_weight(h, k, zlib.crc32(name.encode()), device)
        row = shard_linear(q, s, z, style="row", tp_rank=rank, tp_size=tp, format="plain", bits=4, group_size=GROUP,
                           dtype=torch.float16, device=device)
        del q, s, z
        for b in args.batches:
            x = torch.randn(b, k // tp, device=device).half()
            res = torch.randn(b, h, device=device).half()
            us = {"GEMM": graph_us_each(lambda: row.linear(x, residual=res if rank == 0 else None))}
            for label, mode, fuse in (("+ NCCL", "nccl", False), ("+ ours", "auto", False), ("fused", "fused", True)):
                row.all_reduce, row.fuse_all_reduce = mode, fuse
                us[label] = graph_us_each(lambda: row(x, residual=res))
            launcher, why = fused_plan(comm, row.linear.packed(), b, "fused")
            ran = (f"fused: {launcher.config.name}" if launcher is not None else f"fallback: {why}")[:90]
            rows.append((f"{name} {h}x{k // tp}, batch {b}", f"µs per call; {ran}",
                         ", ".join(f"{key} {v:.1f}" for key, v in us.items()), f"{us['+ ours'] / us['fused']:.2f}x"))
        del row
        torch.cuda.empty_cache()
    return rows


@torch.no_grad()
def step_rows(args, cfg, rank, device, tp_size):
    """Decode-step timings of one model (TP=1 on rank 0 alone, or TP=tp_size on every rank)."""
    from mixed_gemm.nn.parallel import prepare_all_reduce

    rows, t0 = [], time.time()
    model = build(cfg, args.layers, tp_rank=rank, tp_size=tp_size, device=device, batch=max(args.batches),
                  context=args.context, distinct=args.distinct)
    log(f"TP={tp_size}: built {args.layers} layers in {time.time() - t0:.0f} s, "
        f"{torch.cuda.memory_allocated(device) / 2**30:.1f} GiB on GPU {device.index}")
    modes = ["plain"] if tp_size == 1 else args.modes + ["none"]
    if tp_size > 1:
        prepare_all_reduce(device=device, dtypes=(torch.float16,))
    results = {}
    for compiled in args.compile:
        if compiled and not COMPILED:
            compile_layers()
        for batch in args.batches:
            first = len(rows)
            x = torch.randn(batch, cfg["hidden_size"], device=device).half()
            for mode in modes:
                model.set_mode("nccl" if mode == "plain" else mode, compiled)
                fn = lambda: model(x)  # noqa: E731
                ms = graph_ms(fn, tp_size > 1)
                results[(compiled, batch, mode)] = ms
                parts = breakdown(fn, args.layers) if args.breakdown and mode != "none" else ""
                if mode == "none":
                    continue
                what = f"batch {batch}, {'compiled' if compiled else 'plain'}"
                rows.append((f"decode step TP={tp_size}{'' if mode == 'plain' else ' ' + mode}", what,
                             f"{ms:.3f} ms ({ms * 1000 / args.layers:.1f} µs/layer)" + (f"; µs/layer: {parts}" if parts else ""),
                             ""))
            if tp_size > 1:
                none = results[(compiled, batch, "none")]
                for mode in args.modes:
                    share = (results[(compiled, batch, mode)] - none) * 1000 / args.layers
                    rows.append((f"all-reduce share, {mode}", f"batch {batch}, {'compiled' if compiled else 'plain'}",
                                 f"{share:.1f} µs/layer (2 all-reduces; step without them {none:.3f} ms)", ""))
            emit(rows[first:])
    model = None  # noqa: F841 - freed before the next model is built
    gc.collect()
    torch.cuda.empty_cache()
    return rows, results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama3-70b", help="shapes (mixed_gemm.integrations.e2e.PRESETS, or tiny)")
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=512, help="KV-cache tokens each sequence attends to")
    ap.add_argument("--compile", default="0,1", help="0 plain CUDA graph, 1 torch.compile + CUDA graph, 0,1 both")
    ap.add_argument("--modes", default="nccl,ours,fused,gemm_fused", help="TP=N all-reduce modes to time")
    ap.add_argument("--distinct", type=int, default=0, help="distinct layer weights (0: every layer its own)")
    ap.add_argument("--check-layers", type=int, default=2)
    ap.add_argument("--check-context", type=int, default=64)
    ap.add_argument("--micro-rows", default="1,2,4,8,16,32,64", help="rows of the all-reduce micro-benchmark")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: check, micro, gemm, tp1, "
                    "tp2 (the TP=N step, whatever N)")
    ap.add_argument("--breakdown", action="store_true", help="GPU µs per layer by kernel class (profiler, eager)")
    ap.add_argument("--time-limit", type=float, default=1800.0, help="every rank exits after this many seconds")
    args = ap.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.compile = [c == "1" for c in args.compile.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    args.micro_rows = [int(r) for r in args.micro_rows.split(",")]
    skip = set(args.skip.split(","))
    faulthandler.dump_traceback_later(args.time_limit, exit=True)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's, known before the group exists
    timeout = timedelta(seconds=args.time_limit)
    if torch.cuda.is_available():
        if torch.cuda.device_count() < world:
            raise SystemExit(f"GPUs: this run needs {world} (one per rank), found {torch.cuda.device_count()}")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    rank, tp = dist.get_rank(), dist.get_world_size()
    if tp < 2:
        raise SystemExit(f"world size: start with --nproc-per-node N (N >= 2, the tensor-parallel size), got {tp}")
    cfg = shapes(args.preset)
    check_split(cfg, args.preset, tp)
    what = (f"{torch.cuda.get_device_name(device)} x{tp}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
            if device.type == "cuda" else "CPU dry run (gloo): the check only")
    log(f"{what}, torch {torch.__version__}, NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}, "
        f"TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']}, preset {args.preset} {cfg}")
    start, ok, rows = time.time(), True, []
    if "check" not in skip:
        r, ok = check(args, cfg, rank, device, tp)
        rows += r
        emit(r)
    if device.type == "cuda":
        if "micro" not in skip:
            r = micro(args, cfg, device)
            rows += r
            emit(r)
        if "gemm" not in skip:
            r = micro_gemm(args, cfg, rank, device, tp)
            rows += r
            emit(r)
        tp1 = {}
        if "tp1" not in skip:  # one GPU holds the whole model; the other ranks wait
            if rank == 0:
                r, tp1 = step_rows(args, cfg, 0, device, 1)
                rows += r
            dist.barrier()
        if "tp2" not in skip:  # the part keeps its name at every TP size
            r, tpn = step_rows(args, cfg, rank, device, tp)
            rows += r
            for key, ms in sorted(tpn.items()):
                base = tp1.get((key[0], key[1], "plain"))
                if base and key[2] not in ("none",):
                    rows.append((f"TP={tp} {key[2]} speedup", f"batch {key[1]}, {'compiled' if key[0] else 'plain'}",
                                 f"TP=1 {base:.3f} ms / TP={tp} {ms:.3f} ms", f"{base / ms:.2f}x"))
    log("\n| run | setup | result | verdict |\n|---|---|---|---|")
    for r in rows:
        log("| " + " | ".join(r) + " |")
    log(f"\n{'PASS' if ok else 'FAIL'} ({time.time() - start:.0f} s)")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
