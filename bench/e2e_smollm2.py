"""End to end on the GPU (issue #6): a Llama model with SmolLM2-135M's shapes and random weights,
quantized to int4 (group 32 and 128: K = 576 is not a multiple of 128, the last group is short),
saved with save_quantized, loaded with load_quantized, and compared with the same model running
the dequantized weights in fp16: teacher-forced logits over 64 tokens, greedy generation of 64
tokens, decode tokens/s at batch 1 and 16 (eager, and torch.compile + static cache + CUDA graphs).

    python bench/e2e_smollm2.py [--out DIR]
"""
from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import torch
import transformers
from torch import nn

import mixed_gemm as mg
from mixed_gemm.integrations.transformers import load_quantized, quantize_model, save_quantized
from mixed_gemm.nn import QuantLinear

CONFIG = dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9,
              num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048,
              rope_theta=100000.0, rms_norm_eps=1e-5)


def dequantized_twin(model: nn.Module) -> nn.Module:
    """The same model with every QuantLinear replaced by an fp16 nn.Linear of its dequantized weight."""
    twin = copy.deepcopy(model)
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, QuantLinear):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="cuda",
                            dtype=torch.float16)
            lin.weight.data.copy_(mg.dequantize(mod.packed()))
            if mod.bias is not None:
                lin.bias.data.copy_(mod.bias)
            parent, _, child = name.rpartition(".")
            setattr(twin.get_submodule(parent), child, lin)
    return twin


def decode_rate(model, batch: int, new_tokens: int = 64, compiled: bool = False) -> dict:
    """Greedy generation from an 8-token prompt; decode tokens/s from the time of 64 new tokens
    minus the time of 1 (prefill)."""
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, 8), device="cuda")
    kw = dict(do_sample=False, pad_token_id=0, min_new_tokens=new_tokens)
    if compiled:
        kw["cache_implementation"] = "static"

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, **dict(kw, min_new_tokens=n))
        torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    for _ in range(2):
        run(new_tokens)  # warm-up: kernels, selection, compilation, graph capture
    t1 = min(run(1)[0] for _ in range(3))
    tn, out = min((run(new_tokens) for _ in range(3)), key=lambda r: r[0])
    step = (tn - t1) / (new_tokens - 1)
    return dict(batch=batch, step_ms=step * 1e3, tokens_per_s=batch / step, tokens=out[:, 8:].tolist())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--compiled", action="store_true",
                    help="also time torch.compile(mode='reduce-overhead') + static cache (slow to compile)")
    args = ap.parse_args()
    out_dir = Path(args.out)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).half().cuda().eval()
    results = {}
    lines = ["| group | logits rel err | top-1 agreement | greedy 64 tokens equal | mode | batch | fp16 dequant tok/s "
             "| mg tok/s | speedup |", "|---|---|---|---|---|---|---|---|---|"]
    for group in (32, 128):
        with tempfile.TemporaryDirectory() as tmp:
            q = quantize_model(copy.deepcopy(base), bits=4, group_size=group, progress=False)
            save_quantized(q, tmp)
            del q
            model = load_quantized(tmp, dtype=torch.float16, device="cuda", progress=False)
        twin = dequantized_twin(model)
        ids = torch.randint(0, CONFIG["vocab_size"], (4, 64), device="cuda")
        with torch.no_grad():
            lq, lr = model(ids).logits.float(), twin(ids).logits.float()
        rel = ((lq - lr).norm() / lr.norm()).item()
        top1 = (lq.argmax(-1) == lr.argmax(-1)).float().mean().item()
        res = dict(rel_err=rel, top1=top1, decode={})
        for mode in ("eager", "compiled") if args.compiled else ("eager",):
            if mode == "compiled":
                for m in (model, twin):
                    m.forward = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)
            for batch in (1, 16):
                try:
                    a = decode_rate(model, batch, compiled=mode == "compiled")
                    b = decode_rate(twin, batch, compiled=mode == "compiled")
                except Exception as exc:  # noqa: BLE001 - report and go on
                    res["decode"][f"{mode}-{batch}"] = dict(error=f"{type(exc).__name__}: {exc}"[:300])
                    lines.append(f"| {group} | {rel:.2e} | {100 * top1:.2f}% | - | {mode} | {batch} | failed: "
                                 f"{type(exc).__name__} | | |")
                    continue
                same = a.pop("tokens") == b.pop("tokens")
                res["decode"][f"{mode}-{batch}"] = dict(mg=a, fp16=b, greedy_equal=same)
                lines.append(f"| {group} | {rel:.2e} | {100 * top1:.2f}% | {same} | {mode} | {batch} | "
                             f"{b['tokens_per_s']:.0f} | {a['tokens_per_s']:.0f} | "
                             f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x |")
                print(lines[-1], flush=True)
        results[group] = res
        del model, twin
        torch.cuda.empty_cache()
    text = "\n".join([f"# SmolLM2-135M shapes, random weights, int4 — {torch.cuda.get_device_name()}", ""] + lines)
    print(text)
    (out_dir / "e2e.md").write_text(text + "\n")
    (out_dir / "e2e.json").write_text(json.dumps(results, indent=1))
    ok = all(r["rel_err"] <= 2e-2 and r["top1"] >= 0.99 for r in results.values())
    print("criteria (rel err <= 2e-2, top-1 >= 99%):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
