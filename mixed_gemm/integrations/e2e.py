"""``mixed-gemm e2e``: a transformers model with random weights, fp16 against its int4
(mixed_gemm) twin, both alive, their runs alternating and repeated (median), because the host is
noisy. Per batch: the decode step (one token's forward, no KV cache) replayed in a CUDA graph, and
``generate`` tokens/s eager and compiled (static cache: torch.compile with CUDA-graph trees); time
to first token for a 512-token prompt; peak memory and the weights' bytes."""
from __future__ import annotations

import copy
import statistics
import time
from typing import Callable, Dict, List, Sequence

import torch

# Llama-architecture stand-ins for the presets (Qwen2.5's q/k/v biases are left out: shapes only).
PRESETS = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      num_hidden_layers=32, vocab_size=128256),
    "llama3-70b": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                       num_hidden_layers=80, vocab_size=128256),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                       num_hidden_layers=28, vocab_size=152064),
    "mistral-7b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=32, vocab_size=32000),
}
PROMPT, NEW_TOKENS, TTFT_PROMPT = 16, 48, 512


def build_models(preset: str, layers: int, group_size: int = 128, fuse: bool = True):
    """(fp16 model, int4 model): random weights made on the GPU, the int4 one by quantize_model
    (and fuse_projections: one launch for q|k|v and one for gate|up)."""
    import transformers

    from .fuse import fuse_projections
    from .transformers import quantize_model

    fields = dict(PRESETS[preset], max_position_embeddings=4096, tie_word_embeddings=False)
    if layers:
        fields["num_hidden_layers"] = layers
    cfg = transformers.LlamaConfig(**fields)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)
    try:
        with torch.device("cuda"):
            fp16 = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    gen = fp16.generation_config
    gen.eos_token_id, gen.pad_token_id = None, 0  # random weights: never stop early
    int4 = copy.deepcopy(fp16)
    quantize_model(int4, bits=4, group_size=group_size, progress=False)
    if fuse:
        fuse_projections(int4)
    torch.cuda.empty_cache()
    return fp16, int4


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def _cuda_ms(fn: Callable[[], object], reps: int = 1) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps


@torch.no_grad()
def decode_step_ms(model, batch: int) -> float:
    """One token's forward (batch x 1, no KV cache) captured in a CUDA graph, ms per replay."""
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    for _ in range(2):
        model(ids, use_cache=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(ids, use_cache=False)
    graph.replay()
    ms = _cuda_ms(graph.replay, reps=10)
    del graph
    return ms


@torch.no_grad()
def generate_tps(model, batch: int, compiled: bool) -> float:
    ids = torch.randint(0, model.config.vocab_size, (batch, PROMPT), device="cuda")
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    if compiled:
        kw["cache_implementation"] = "static"
    torch.cuda.synchronize()
    t = time.perf_counter()
    model.generate(ids, **kw)
    torch.cuda.synchronize()
    return batch * NEW_TOKENS / (time.perf_counter() - t)


@torch.no_grad()
def ttft_ms(model) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, TTFT_PROMPT), device="cuda")
    return _cuda_ms(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False))


def run(preset: str, layers: int, batches: Sequence[int], reps: int = 3, compiled: bool = True,
        fuse: bool = True, log=print) -> Dict:
    """Every measurement, fp16 and int4 alternating within each repetition; medians."""
    fp16, int4 = build_models(preset, layers, fuse=fuse)
    models = {"fp16": fp16, "mixed_gemm": int4}
    result: Dict = {"preset": preset, "layers": fp16.config.num_hidden_layers, "gpu": torch.cuda.get_device_name(),
                    "fused": fuse,
                    "weight_bytes": {k: weight_bytes(m) for k, m in models.items()}, "rows": []}
    warm = {}
    for name, model in models.items():  # warm-ups (module loads, selection, compilation) out of the timing
        for b in batches:
            decode_step_ms(model, b)
            generate_tps(model, b, False)
            if compiled:
                warm[(name, b)] = generate_tps(model, b, True)
        ttft_ms(model)
    for b in batches:
        samples: Dict[str, List[Dict]] = {k: [] for k in models}
        for rep in range(reps):
            for name, model in (models.items() if rep % 2 == 0 else reversed(models.items())):
                s = {"decode_ms": decode_step_ms(model, b), "eager_tps": generate_tps(model, b, False)}
                if compiled:
                    s["compiled_tps"] = generate_tps(model, b, True)
                samples[name].append(s)
        row = {"batch": b}
        for name in models:
            for key in samples[name][0]:
                row[f"{name}_{key}"] = statistics.median(s[key] for s in samples[name])
        row["decode_speedup"] = row["fp16_decode_ms"] / row["mixed_gemm_decode_ms"]
        row["eager_ratio"] = row["mixed_gemm_eager_tps"] / row["fp16_eager_tps"]
        if compiled:
            row["compiled_ratio"] = row["mixed_gemm_compiled_tps"] / row["fp16_compiled_tps"]
        result["rows"].append(row)
        log(_row_line(row, compiled))
    result["ttft_ms"] = {}
    for name, model in models.items():
        torch.cuda.reset_peak_memory_stats()
        result["ttft_ms"][name] = statistics.median(ttft_ms(model) for _ in range(reps))
        # Both models are alive: the other one's weights are not this one's peak.
        other = result["weight_bytes"]["mixed_gemm" if name == "fp16" else "fp16"]
        result.setdefault("peak_bytes", {})[name] = torch.cuda.max_memory_allocated() - other
    return result


def _row_line(r: Dict, compiled: bool) -> str:
    line = (f"| {r['batch']} | {r['fp16_decode_ms']:.2f} | {r['mixed_gemm_decode_ms']:.2f} | {r['decode_speedup']:.2f}x | "
            f"{r['fp16_eager_tps']:.0f} | {r['mixed_gemm_eager_tps']:.0f} | {r['eager_ratio']:.2f}x |")
    if compiled:
        line += f" {r['fp16_compiled_tps']:.0f} | {r['mixed_gemm_compiled_tps']:.0f} | {r['compiled_ratio']:.2f}x |"
    return line


def table(result: Dict, compiled: bool) -> List[str]:
    head = ("| batch | fp16 decode step ms (graph) | int4 decode step ms | speedup | fp16 eager tok/s | "
            "int4 eager tok/s | ratio |")
    sep = "|---|---|---|---|---|---|---|"
    if compiled:
        head += " fp16 compiled tok/s | int4 compiled tok/s | ratio |"
        sep += "---|---|---|"
    lines = [head, sep] + [_row_line(r, compiled) for r in result["rows"]]
    gib = 2.0**30
    lines += ["", "| | fp16 | mixed_gemm int4 |", "|---|---|---|",
              f"| weights + buffers | {result['weight_bytes']['fp16'] / gib:.2f} GiB | "
              f"{result['weight_bytes']['mixed_gemm'] / gib:.2f} GiB |",
              f"| peak memory (TTFT run) | {result['peak_bytes']['fp16'] / gib:.2f} GiB | "
              f"{result['peak_bytes']['mixed_gemm'] / gib:.2f} GiB |",
              f"| time to first token, {TTFT_PROMPT}-token prompt | {result['ttft_ms']['fp16']:.1f} ms | "
              f"{result['ttft_ms']['mixed_gemm']:.1f} ms |"]
    return lines


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
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("int4 (mixed_gemm) / fp16")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
