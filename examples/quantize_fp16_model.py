"""Quantize a loaded fp16 transformers model to int4 in place, run it, and save an AutoAWQ-style checkpoint.

    python examples/quantize_fp16_model.py HuggingFaceTB/SmolLM2-135M-Instruct ./smollm2-int4
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mixed_gemm.integrations.transformers import load_quantized, quantize_model, save_quantized

name, out_dir = sys.argv[1], sys.argv[2]
device = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU runs the float32 reference path
model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float16).to(device).eval()
quantize_model(model, bits=4, group_size=64, symmetric=False, skip=("lm_head",))
save_quantized(model, out_dir, format="awq")
AutoTokenizer.from_pretrained(name).save_pretrained(out_dir)

reloaded = load_quantized(out_dir, dtype=torch.float16, device=device)
tok = AutoTokenizer.from_pretrained(out_dir)
ids = tok("The capital of France is", return_tensors="pt").to(device)
with torch.no_grad():
    print(tok.decode(reloaded.generate(**ids, max_new_tokens=16, do_sample=False)[0]))
