"""Load an AutoAWQ (or GPTQ) checkpoint directory into a transformers model on mixed_gemm and generate.

    python examples/load_awq_checkpoint.py /path/to/Llama-3-8B-Instruct-AWQ "The capital of France is"
"""
import sys

import torch
from transformers import AutoTokenizer

from mixed_gemm.integrations.transformers import load_quantized

model_dir, prompt = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "The capital of France is"
model = load_quantized(model_dir, dtype=torch.float16, device="cuda")  # QuantLinear in every quantized layer
tok = AutoTokenizer.from_pretrained(model_dir)
ids = tok(prompt, return_tensors="pt").to("cuda")
with torch.no_grad():
    out = model.generate(**ids, max_new_tokens=32, do_sample=False)
print(tok.decode(out[0], skip_special_tokens=True))
