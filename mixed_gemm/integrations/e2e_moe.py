"""``mixed-gemm e2e`` for a mixture-of-experts preset whose fp16 model and int4 twin do not fit the
GPU together (Qwen3-30B-A3B at its 48 layers: 61 GB of fp16 weights, and :func:`.e2e.build_models`
holds a second fp16 copy while it quantizes): fp16 is built, measured and freed, then the same
seeded model is built again and quantized in place (never two fp16 copies), and measured. The
models cannot alternate, so each figure is the median of its model's own repetitions.

Per batch: the compiled decode step (one token's forward, no KV cache, compiled by Inductor and
captured in one CUDA graph: :func:`.e2e.compiled_step_ms`), the compiled ``generate`` rate with a
static cache, prefill included and taken off (decode tok/s); per model: time to first token for a
512-token prompt, weights and peak memory.
"""
from __future__ import annotations

import gc
import statistics
from typing import Dict, List, Sequence, Tuple

import torch

from . import e2e

HEADROOM = 0.85  # share of the GPU's memory the weights may take (activations, graphs, the allocator's slack)


def default_batches(preset: str) -> str:
    """``--batches``' default: 1 and 16 for a mixture-of-experts preset (its fp16 decode step
    gathers every pair's expert weights, transformers' way), else 1, 16 and 64."""
    return "1,16" if e2e.is_moe(preset) else "1,16,64"


def fp16_bytes(preset: str, layers: int) -> int:
    """Bytes of the preset's fp16 weights (``layers`` decoder layers, 0: the preset's), counted on
    the meta device (nothing allocated)."""
    import transformers

    fields = dict(e2e.PRESETS[preset], max_position_embeddings=4096, tie_word_embeddings=False)
    config_class, model_class = (getattr(transformers, name) for name in e2e.ARCHS[fields.pop("arch", "llama")])
    if layers:
        fields["num_hidden_layers"] = layers
    with torch.device("meta"):
        model = model_class(config_class(**fields))
    return sum(p.numel() for p in model.parameters()) * 2


def one_at_a_time(preset: str, layers: int, gpu_bytes: int) -> Tuple[bool, int]:
    """``(run the models in turn, fp16 bytes)``: in turn for a mixture-of-experts preset whose two
    fp16 copies (:func:`.e2e.build_models` quantizes a deep copy) would pass :data:`HEADROOM` of
    ``gpu_bytes``; dense presets always alternate."""
    if not e2e.is_moe(preset):
        return False, 0
    fp16 = fp16_bytes(preset, layers)
    return 2 * fp16 > HEADROOM * gpu_bytes, fp16


def _measure(model, batches: Sequence[int], reps: int) -> Dict:
    """Warm-ups (compilation, kernel selection) out of the timing, then ``reps`` repetitions per
    batch of the compiled step and compiled generate; TTFT and peak memory last."""
    for b in batches:
        e2e.compiled_step_ms(model, b)
        e2e.generate_s(model, b, True)
    e2e.ttft_ms(model)
    out: Dict = {"rows": {}}
    for b in batches:
        samples = []
        for _ in range(reps):
            step = e2e.compiled_step_ms(model, b)
            full, first = e2e.generate_s(model, b, True), e2e.generate_s(model, b, True, 1)
            samples.append({"compiled_step_ms": step, "compiled_tps": b * e2e.NEW_TOKENS / full,
                            "compiled_decode_tps": b * (e2e.NEW_TOKENS - 1) / max(full - first, 1e-9)})
        out["rows"][b] = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
    torch.cuda.reset_peak_memory_stats()
    out["ttft_ms"] = statistics.median(e2e.ttft_ms(model) for _ in range(max(reps, e2e.TTFT_REPS)))
    out["peak_bytes"] = torch.cuda.max_memory_allocated()
    out["weight_bytes"] = e2e.weight_bytes(model)
    if id(model) in e2e.CAPTURE_ERRORS:
        out["capture_error"] = e2e.CAPTURE_ERRORS.pop(id(model))
    return out


def _free() -> None:
    """Give a released model's memory back: its compiled graphs hold its weights too."""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def run(preset: str, layers: int, batches: Sequence[int], reps: int = 3, fuse: bool = True, lm_head=None,
        residual: bool = True, group_size: int = 128, log=print, routers: bool = True,
        norms: bool = True) -> Dict:
    """fp16, then int4 (the same seeded weights, quantized in place), one alive at a time; the
    result has :func:`.e2e.memory_table`'s keys and per batch each model's figures and the ratios."""
    dynamo = torch._dynamo.config
    dynamo.recompile_limit = max(dynamo.recompile_limit, 64)
    measured = {}
    for name in ("fp16", "mixed_gemm"):
        log(f"{name}: building, compiling, measuring")
        model = e2e.build_fp16(preset, layers)
        if name == "mixed_gemm":
            e2e.quantize_in_place(model, group_size, fuse, lm_head, residual, routers, norms)
        measured[name] = _measure(model, batches, reps)
        e2e._COMPILED.pop(id(model), None)
        del model
        _free()
    result: Dict = {"preset": preset, "layers": layers or e2e.PRESETS[preset]["num_hidden_layers"],
                    "gpu": torch.cuda.get_device_name(), "one_at_a_time": True, "fused": fuse,
                    "residual": fuse and residual, "routers": fuse and routers,
                    "norms": fuse and norms, "lm_head": lm_head or "fp16", "rows": []}
    for key in ("weight_bytes", "peak_bytes", "ttft_ms"):
        result[key] = {name: m[key] for name, m in measured.items()}
    result["capture_errors"] = {name: m["capture_error"] for name, m in measured.items() if "capture_error" in m}
    for b in batches:
        row = {"batch": b}
        for name, m in measured.items():
            row.update({f"{name}_{key}": v for key, v in m["rows"][b].items()})
        row["compiled_step_speedup"] = row["fp16_compiled_step_ms"] / row["mixed_gemm_compiled_step_ms"]
        row["decode_ratio"] = row["mixed_gemm_compiled_decode_tps"] / row["fp16_compiled_decode_tps"]
        row["compiled_ratio"] = row["mixed_gemm_compiled_tps"] / row["fp16_compiled_tps"]
        result["rows"].append(row)
    return result


HEAD = ("| batch | fp16 compiled step µs (graph) | int4 compiled step µs (graph) | speedup "
        "| fp16 compiled decode tok/s (prefill off) | int4 | ratio | fp16 compiled tok/s (prefill in) | int4 | ratio |")


def table(result: Dict) -> List[str]:
    """The step and rate table, a blank line, then :func:`.e2e.memory_table` (weights, peak memory,
    TTFT), and a line per model whose compiled step could not be captured."""
    lines = [HEAD, "|" + "---|" * (HEAD.count("|") - 1)]
    for r in result["rows"]:
        lines.append(f"| {r['batch']} | {1e3 * r['fp16_compiled_step_ms']:.0f} | {1e3 * r['mixed_gemm_compiled_step_ms']:.0f} "
                     f"| {r['compiled_step_speedup']:.2f}x | {r['fp16_compiled_decode_tps']:.0f} "
                     f"| {r['mixed_gemm_compiled_decode_tps']:.0f} | {r['decode_ratio']:.2f}x "
                     f"| {r['fp16_compiled_tps']:.0f} | {r['mixed_gemm_compiled_tps']:.0f} | {r['compiled_ratio']:.2f}x |")
    lines += [""] + e2e.memory_table(result)
    for name, why in result.get("capture_errors", {}).items():
        lines.append(f"{name}: compiled step not capturable: {why}")
    return lines
