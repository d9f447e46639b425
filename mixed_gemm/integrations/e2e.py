"""``mixed-gemm e2e``: a transformers model with random weights, fp16 against its int4
(mixed_gemm) twin and, with ``compare``, the peer users already have (torch's tinygemm int4 in
bf16, :mod:`.tinygemm`, the same codes), all alive, their runs alternating and repeated (median),
because the host is noisy. Per batch: the decode step (one token's forward, no KV cache) replayed in a CUDA graph,
eager and compiled by Inductor (:func:`compiled_step_ms`, the like-for-like step), and
``generate`` tokens/s eager and compiled (static cache: torch.compile with CUDA-graph trees), and
eager for an unfused int4 twin beside the fused one; time to first token for a 512-token prompt;
peak memory and the weights' bytes."""
from __future__ import annotations

import contextlib
import copy
import statistics
import time
from typing import Callable, Dict, List, Sequence

import torch

# Llama-architecture stand-ins for the presets (Qwen2.5's q/k/v biases are left out: shapes only),
# and transformers' own Qwen3-MoE for the mixture of experts (its 48 layers of 128 experts are
# 61 GB in fp16: beside an int4 copy they exceed an 80 GB GPU, so e2e_moe measures them in turn).
PRESETS = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      num_hidden_layers=32, vocab_size=128256),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                       num_hidden_layers=80, vocab_size=128256),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                       num_hidden_layers=28, vocab_size=152064),
    "mistral-7b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=32, vocab_size=32000),
    "qwen3-30b-a3b": dict(arch="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_local_experts=128, num_experts_per_tok=8, norm_topk_prob=True, head_dim=128,
                          num_attention_heads=32, num_key_value_heads=4, num_hidden_layers=48, vocab_size=151936),
}
# transformers' (config, model) classes per architecture.
ARCHS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}


def is_moe(preset: str) -> bool:
    return PRESETS[preset].get("arch", "llama") != "llama"
PROMPT, NEW_TOKENS, TTFT_PROMPT = 16, 48, 512
# TTFT samples per model (median): an eager prefill is host-bound, and on a shared host one int4
# TTFT varied 62-105 ms between consecutive calls (docs/notes/end-to-end.md); ~0.1-0.3 s each.
TTFT_REPS = 9


def build_models(preset: str, layers: int, group_size: int = 128, fuse: bool = True, lm_head=None,
                 residual: bool = True, routers: bool = True, norms: bool = True):
    """(fp16 model, int4 model): random weights made on the GPU (:func:`build_fp16`), the int4 one
    a quantized deep copy (:func:`quantize_in_place`)."""
    fp16 = build_fp16(preset, layers)
    return fp16, quantize_in_place(copy.deepcopy(fp16), group_size, fuse, lm_head, residual, routers, norms)


def build_fp16(preset: str, layers: int):
    """The preset's transformers model (``layers`` decoder layers, 0: the preset's) with random
    weights made on the GPU, fp16, seeded."""
    import transformers

    fields = dict(PRESETS[preset], max_position_embeddings=4096, tie_word_embeddings=False)
    config_class, model_class = (getattr(transformers, name) for name in ARCHS[fields.pop("arch", "llama")])
    if layers:
        fields["num_hidden_layers"] = layers
    cfg = config_class(**fields)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device("cuda"):
            fp16 = model_class(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    gen = fp16.generation_config
    gen.eos_token_id, gen.pad_token_id = None, 0  # random weights: never stop early
    return fp16


def quantize_in_place(model, group_size: int = 128, fuse: bool = True, lm_head=None, residual: bool = True,
                      routers: bool = True, norms: bool = True):
    """``model`` made the int4 twin by quantize_model (and fuse_projections: one launch for q|k|v
    and one for gate|up; ``residual``: the skip connections in the o_proj/down_proj epilogues too;
    ``routers``, ``norms``: one launch for each router and each RMSNorm;
    ``lm_head``: quantize the output head too, ``"int8"`` or ``"int4"``)."""
    from .fuse import fuse_projections
    from .transformers import quantize_model

    quantize_model(model, bits=4, group_size=group_size, progress=False, lm_head=lm_head)
    if fuse:
        fuse_projections(model, residual=residual, routers=routers, norms=norms)
    torch.cuda.empty_cache()
    return model


def build_unfused(fp16, group_size: int = 128, lm_head=None):
    """The int4 twin of ``fp16`` as quantize_model leaves it (q/k/v, gate/up and the skip
    connections as transformers runs them): what the fused model's eager generate is compared with."""
    from .transformers import quantize_model

    int4 = copy.deepcopy(fp16)
    quantize_model(int4, bits=4, group_size=group_size, progress=False, lm_head=lm_head)
    torch.cuda.empty_cache()
    return int4


def settle_kernels(log=print) -> List[str]:
    """After cold calls: wait for the kernels compiling in the background (``$MIXED_GEMM_JIT=async``
    with a cold cache, or a kernel package without them), so timed runs use the kernels selection
    chose, not their stand-ins; returns what still runs a stand-in (:func:`standins`)."""
    from ..compile import background

    pending = background.pending()
    if pending:
        log(f"waiting for {len(pending)} kernel(s) compiling in the background: {', '.join(pending)}")
        failed = background.wait()
        if failed:
            log(f"could not be built (their stand-ins keep running): {', '.join(failed)}")
    return standins()


def standins() -> List[str]:
    """``"chosen (runs stand-in)"`` for every selection whose chosen kernel is not running yet."""
    from ..select.selection import SELECTED

    return sorted({f"{c.schedule} (runs {c.running})" for c in list(SELECTED.values()) if c.standin is not None})


PEER = "tinygemm"
UNFUSED = "unfused"  # the int4 model without fuse_projections: eager generate only


def build_peer(fp16, group_size: int = 128):
    """The tinygemm twin of ``fp16``: a bf16 copy whose linear layers but lm_head hold the codes
    :func:`mixed_gemm.quantize` makes, in tinygemm's layout (unfused, as torchao leaves them)."""
    from .tinygemm import tinygemm_model

    peer = copy.deepcopy(fp16).to(torch.bfloat16)
    tinygemm_model(peer, group_size)
    torch.cuda.empty_cache()
    return peer


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def cuda_ms(fn: Callable[[], object], reps: int = 1) -> float:
    """Milliseconds per call of ``fn`` over ``reps`` back-to-back calls, between CUDA events."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


@contextlib.contextmanager
def decoding_experts(model):
    """transformers' own switch for decoding (``generate`` does the same): experts implemented with
    ``grouped_mm`` (host offsets: not capturable) run ``batched_mm`` meanwhile. Models without
    transformers' experts interface, or whose experts mixed_gemm replaced, are left as they are."""
    get = getattr(model, "get_experts_implementation", None)
    original = get() if get is not None else {}
    switch = isinstance(original, dict) and "grouped_mm" in original.values()
    if switch:
        model.set_experts_implementation({k: "batched_mm" if v == "grouped_mm" else v for k, v in original.items()})
    try:
        yield
    finally:
        if switch:
            model.set_experts_implementation(original)


STEP_EAGER: set = set()  # id() of the models whose decode step could not be captured (timed eager)


def decode_step_ms(model, batch: int) -> float:
    """One token's forward (batch x 1, no KV cache) captured in a CUDA graph, ms per replay; eager
    (ms per call) for a model that cannot be captured, which ``STEP_EAGER`` then names. Experts
    run as transformers decodes (:func:`decoding_experts`)."""
    with decoding_experts(model):
        return _decode_step_ms(model, batch)


def _graph_ms(fn: Callable[[torch.Tensor], object], ids: torch.Tensor, warm: int) -> float:
    """``fn(ids)`` called ``warm`` times, then captured in a CUDA graph: ms per replay. Raises
    RuntimeError where the call cannot be captured."""
    for _ in range(warm):
        fn(ids)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(ids)
    graph.replay()
    ms = cuda_ms(graph.replay, reps=10)
    del graph
    return ms


@torch.no_grad()
def _decode_step_ms(model, batch: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    step = lambda t: model(t, use_cache=False)  # noqa: E731
    try:
        return _graph_ms(step, ids, warm=2)
    except RuntimeError:
        torch.cuda.synchronize()
        STEP_EAGER.add(id(model))
        return cuda_ms(lambda: step(ids), reps=10)


_COMPILED: Dict[int, Callable] = {}  # id(model) -> its forward compiled by Inductor (its own CUDA graphs off)


def compiled_step_ms(model, batch: int) -> float:
    """One token's forward (batch x 1, no KV cache) compiled by Inductor without CUDA graphs of
    its own, then captured in one: both models' norms and elementwise work fused alike (experts as
    transformers decodes: :func:`decoding_experts`), so the like-for-like step. NaN where the
    compiled forward cannot be captured (``CAPTURE_ERRORS`` says why)."""
    with decoding_experts(model):
        return _compiled_step_ms(model, batch)


CAPTURE_ERRORS: Dict[int, str] = {}  # id(model) -> why its compiled step could not be captured


@torch.no_grad()
def _compiled_step_ms(model, batch: int) -> float:
    fn = _COMPILED.get(id(model))
    if fn is None:
        fn = _COMPILED[id(model)] = torch.compile(model, dynamic=False)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    try:
        return _graph_ms(lambda t: fn(t, use_cache=False), ids, warm=3)
    except RuntimeError as exc:
        torch.cuda.synchronize()
        CAPTURE_ERRORS[id(model)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return float("nan")


@torch.no_grad()
def generate_s(model, batch: int, compiled: bool, new_tokens: int = NEW_TOKENS) -> float:
    """Seconds of one ``generate`` of ``new_tokens`` from a ``PROMPT``-token prompt."""
    ids = torch.randint(0, model.config.vocab_size, (batch, PROMPT), device="cuda")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if compiled:
        kw["cache_implementation"] = "static"
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(ids, **kw)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def generate_tps(model, batch: int, compiled: bool) -> float:
    """Tokens/s of ``generate``, the prompt's prefill included."""
    return batch * NEW_TOKENS / generate_s(model, batch, compiled)


@torch.no_grad()
def ttft_ms(model) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, TTFT_PROMPT), device="cuda")
    return cuda_ms(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False))


def run(preset: str, layers: int, batches: Sequence[int], reps: int = 3, compiled: bool = True,
        fuse: bool = True, compare: bool = False, lm_head=None, residual: bool = True, log=print,
        unfused: bool = True, routers: bool = True, norms: bool = True) -> Dict:
    """Every measurement, the models alternating within each repetition (order reversed every
    other one); medians. ``compare`` adds the tinygemm peer; ``unfused`` (with ``fuse``) the int4
    model without fusion, for eager generate only (:func:`build_unfused`)."""
    # Every model's forward (and each batch's graph) compiles the same transformers code objects: at
    # Dynamo's default of 8 entries per code object the model compiled last falls back to eager
    # (the peer's compiled generate fell to 25 tok/s that way: docs/notes/end-to-end.md).
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, 64)
    fp16, int4 = build_models(preset, layers, fuse=fuse, lm_head=lm_head, residual=residual, routers=routers,
                              norms=norms)
    models = {"fp16": fp16, "mixed_gemm": int4}
    if compare:
        models[PEER] = build_peer(fp16)
    eager_only = {UNFUSED: build_unfused(fp16, lm_head=lm_head)} if unfused and fuse else {}
    result: Dict = {"preset": preset, "layers": fp16.config.num_hidden_layers, "gpu": torch.cuda.get_device_name(),
                    "fused": fuse, "unfused": bool(eager_only), "residual": fuse and residual, "routers": fuse and routers,
                    "norms": fuse and norms, "lm_head": lm_head or "fp16",
                    "weight_bytes": {k: weight_bytes(m) for k, m in models.items()}, "rows": []}
    everyone = list(models.items()) + list(eager_only.items())
    # Cold calls first (each batch's decode and prefill, the TTFT prompt): what compiles in the
    # background lands before anything is timed or recorded in a CUDA graph.
    for _, model in everyone:
        for b in batches:
            generate_tps(model, b, False)
        ttft_ms(model)
    result["standins"] = settle_kernels(log)
    if result["standins"]:
        log(f"int4 timings include stand-ins: {'; '.join(result['standins'])}")
    warm = {}
    for name, model in models.items():  # warm-ups (module loads, selection, compilation) out of the timing
        for b in batches:
            decode_step_ms(model, b)
            generate_tps(model, b, False)
            if compiled:
                warm[(name, b)] = generate_tps(model, b, True)
                compiled_step_ms(model, b)
        ttft_ms(model)
    # The table streams: its head (which knows by now whose decode step runs eager), then a row per batch.
    for line in table_head(dict(result, step_eager=[n for n, m in models.items() if id(m) in STEP_EAGER]), compiled):
        log(line)
    for b in batches:
        samples: Dict[str, List[Dict]] = {k: [] for k, _ in everyone}
        for rep in range(reps):
            for name, model in (everyone if rep % 2 == 0 else everyone[::-1]):
                if name in eager_only:
                    samples[name].append({"eager_tps": generate_tps(model, b, False)})
                    continue
                s = {"decode_ms": decode_step_ms(model, b), "eager_tps": generate_tps(model, b, False)}
                if compiled:
                    s["compiled_step_ms"] = compiled_step_ms(model, b)
                    full, first = generate_s(model, b, True), generate_s(model, b, True, 1)
                    # compiled_tps counts the prefill (eager in transformers' static-cache generate);
                    # compiled_decode_tps is the steady decode rate, the prefill's time taken off.
                    s["compiled_tps"] = b * NEW_TOKENS / full
                    s["compiled_decode_tps"] = b * (NEW_TOKENS - 1) / max(full - first, 1e-9)
                samples[name].append(s)
        row = {"batch": b}
        for name in samples:
            for key in samples[name][0]:
                row[f"{name}_{key}"] = statistics.median(s[key] for s in samples[name])
        for name in eager_only:
            row[f"{name}_eager_ratio"] = row[f"{name}_eager_tps"] / row["fp16_eager_tps"]
        for name in models:
            if name == "fp16":
                continue
            prefix = "" if name == "mixed_gemm" else f"{name}_"
            row[f"{prefix}decode_speedup"] = row["fp16_decode_ms"] / row[f"{name}_decode_ms"]
            row[f"{prefix}eager_ratio"] = row[f"{name}_eager_tps"] / row["fp16_eager_tps"]
            if compiled:
                row[f"{prefix}compiled_step_speedup"] = row["fp16_compiled_step_ms"] / row[f"{name}_compiled_step_ms"]
                row[f"{prefix}compiled_ratio"] = row[f"{name}_compiled_tps"] / row["fp16_compiled_tps"]
                row[f"{prefix}decode_ratio"] = row[f"{name}_compiled_decode_tps"] / row["fp16_compiled_decode_tps"]
        result["rows"].append(row)
        log(_row_line(row, compiled))
    for name, model in models.items():
        if id(model) in CAPTURE_ERRORS:
            log(f"{name}: compiled step not capturable: {CAPTURE_ERRORS[id(model)]}")
    result["step_eager"] = [name for name, model in models.items() if id(model) in STEP_EAGER]
    if result["step_eager"]:
        log(f"decode step timed eager (not capturable): {', '.join(result['step_eager'])}")
    result["ttft_ms"] = {}
    for name, model in models.items():
        torch.cuda.reset_peak_memory_stats()
        result["ttft_ms"][name] = statistics.median(ttft_ms(model) for _ in range(max(reps, TTFT_REPS)))
        # Every model is alive: the others' weights are not this one's peak.
        others = sum(v for k, v in result["weight_bytes"].items() if k != name) + sum(map(weight_bytes, eager_only.values()))
        result.setdefault("peak_bytes", {})[name] = torch.cuda.max_memory_allocated() - others
    return result


def _row_line(r: Dict, compiled: bool) -> str:
    peer = f"{PEER}_decode_ms" in r
    line = (f"| {r['batch']} | {r['fp16_decode_ms']:.2f} | {r['mixed_gemm_decode_ms']:.2f} | {r['decode_speedup']:.2f}x |")
    if peer:
        line += f" {r[f'{PEER}_decode_ms']:.2f} | {r[f'{PEER}_decode_speedup']:.2f}x |"
    line += f" {r['fp16_eager_tps']:.0f} | {r['mixed_gemm_eager_tps']:.0f} | {r['eager_ratio']:.2f}x |"
    if f"{UNFUSED}_eager_tps" in r:
        line += f" {r[f'{UNFUSED}_eager_tps']:.0f} | {r[f'{UNFUSED}_eager_ratio']:.2f}x |"
    if peer:
        line += f" {r[f'{PEER}_eager_tps']:.0f} | {r[f'{PEER}_eager_ratio']:.2f}x |"
    if compiled and "compiled_step_speedup" in r:  # results saved before the compiled step have no such column
        line += (f" {r['fp16_compiled_step_ms']:.3f} | {r['mixed_gemm_compiled_step_ms']:.3f} |"
                 f" {r['compiled_step_speedup']:.2f}x |")
        if peer:
            line += f" {r[f'{PEER}_compiled_step_ms']:.3f} | {r[f'{PEER}_compiled_step_speedup']:.2f}x |"
    if compiled:
        line += f" {r['fp16_compiled_tps']:.0f} | {r['mixed_gemm_compiled_tps']:.0f} | {r['compiled_ratio']:.2f}x |"
        if peer:
            line += f" {r[f'{PEER}_compiled_tps']:.0f} | {r[f'{PEER}_compiled_ratio']:.2f}x |"
        if "decode_ratio" in r:  # results saved before the decode-only rate have no such column
            line += f" {r['fp16_compiled_decode_tps']:.0f} | {r['mixed_gemm_compiled_decode_tps']:.0f} | {r['decode_ratio']:.2f}x |"
            if peer:
                line += f" {r[f'{PEER}_compiled_decode_tps']:.0f} | {r[f'{PEER}_decode_ratio']:.2f}x |"
    return line


def table_head(result: Dict, compiled: bool) -> List[str]:
    """The header and separator lines of :func:`table` (what :func:`run` logs before its first row).
    A result without rows yet is a live run's: every column of ``compiled``; a saved result shows
    the columns its rows have."""
    peer = PEER in result["weight_bytes"]
    rows = result["rows"]
    tg = f" {PEER} (bf16 int4)"
    eager = result.get("step_eager", [])
    how = lambda name: "eager" if name in eager else "graph"  # noqa: E731
    head = f"| batch | fp16 decode step ms ({how('fp16')}) | int4 decode step ms ({how('mixed_gemm')}) | speedup |"
    if peer:
        head += f"{tg} decode step ms | speedup |"
    fused = result.get("fused", True)
    head += f" fp16 eager tok/s | int4{' fused' if fused else ''} eager tok/s | ratio |"
    if (f"{UNFUSED}_eager_tps" in rows[0]) if rows else (fused and result.get("unfused", True)):
        head += " int4 unfused eager tok/s | ratio |"
    if peer:
        head += f"{tg} eager tok/s | ratio |"
    if compiled and (not rows or "compiled_step_speedup" in rows[0]):
        head += " fp16 compiled step ms (graph) | int4 compiled step ms (graph) | speedup |"
        if peer:
            head += f"{tg} compiled step ms | speedup |"
    if compiled:
        head += " fp16 compiled tok/s | int4 compiled tok/s | ratio |"
        if peer:
            head += f"{tg} compiled tok/s | ratio |"
        if not rows or "decode_ratio" in rows[0]:
            head += " fp16 compiled decode tok/s (prefill off) | int4 | ratio |"
            if peer:
                head += f"{tg} | ratio |"
    return [head, "|" + "---|" * (head.count("|") - 1)]


def memory_table(result: Dict) -> List[str]:
    """Per model: weights, peak memory and time to first token (the lines after :func:`table`'s blank one)."""
    gib = 2.0**30
    names = list(result["weight_bytes"])
    label = {"fp16": "fp16", "mixed_gemm": "mixed_gemm int4", PEER: f"{PEER} int4 (bf16)"}

    def cells(fn) -> str:
        return " | ".join(fn(n) for n in names)

    return ["| | " + cells(lambda n: label[n]) + " |", "|---|" + "---|" * len(names),
            "| weights + buffers | " + cells(lambda n: f"{result['weight_bytes'][n] / gib:.2f} GiB") + " |",
            "| peak memory (TTFT run) | " + cells(lambda n: f"{result['peak_bytes'][n] / gib:.2f} GiB") + " |",
            f"| time to first token, {TTFT_PROMPT}-token prompt | "
            + cells(lambda n: f"{result['ttft_ms'][n]:.1f} ms") + " |"]


def table(result: Dict, compiled: bool) -> List[str]:
    """The markdown table of :func:`run`'s result: per batch, each model's figure and its ratio to
    fp16 (the peer's columns beside mixed_gemm's when it ran), then weights, peak memory and TTFT."""
    return (table_head(result, compiled) + [_row_line(r, compiled) for r in result["rows"]] + [""]
            + memory_table(result))


def plot(result: Dict, path: str, title: str, compiled: bool):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'mixed-gemm[bench]')"
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    xs = [r["batch"] for r in rows]
    ax.plot(xs, [r["decode_speedup"] for r in rows], marker="o", label="decode step (CUDA graph)")
    ax.plot(xs, [r["eager_ratio"] for r in rows], marker="s", label="generate, eager")
    if compiled:
        ax.plot(xs, [r["compiled_ratio"] for r in rows], marker="^", label="generate, compiled (static cache)")
    if rows and f"{PEER}_decode_speedup" in rows[0]:
        ax.plot(xs, [r[f"{PEER}_decode_speedup"] for r in rows], ls="--", marker="o", label=f"{PEER}: decode step")
        key = f"{PEER}_compiled_ratio" if compiled else f"{PEER}_eager_ratio"
        ax.plot(xs, [r[key] for r in rows], ls="--", marker="^", label=f"{PEER}: generate, "
                + ("compiled" if compiled else "eager"))
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("int4 / fp16 (same batch)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
