"""GGUF Q4_1 weights (llama.cpp) into :class:`QuantLinear`, exactly.

Q4_1 block (32 weights along K, 20 bytes): ``d`` fp16, ``m`` fp16, then 16 bytes whose low nibbles
are weights 0-15 and high nibbles weights 16-31; ``w = d * q + m``. That is mixed_gemm's
``"plain"`` format with ``zero_mode="offset"`` and group size 32: ``q`` as is, ``s = d``,
``z = m`` — no rounding anywhere, so the reference dequantizes to the same float32 values as the
``gguf`` package (``d.astype(f32) * q + m.astype(f32)``).

llama.cpp stores the Q and K projections of llama models with rows permuted for its rotary
layout; like transformers' GGUF loader we permute them back (rows only: exact).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Tuple

import numpy as np
import torch

from ..nn import QuantLinear
from .loading import empty_model, finish_loading, set_submodule, set_tensor

Q4_1_BLOCK, Q4_1_BYTES = 32, 20
_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (llama architecture)."""
    base, _, leaf = gguf_name.rpartition(".")
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _LAYER:
        return f"model.layers.{m.group(1)}.{_LAYER[m.group(2)]}.{leaf}"
    if base in _TOP:
        return f"{_TOP[base]}.{leaf}"
    raise KeyError(f"GGUF tensor {gguf_name!r}: no llama module for it")


def q4_1_to_plain(data: np.ndarray, n: int, k: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw Q4_1 rows (uint8 ``(N, K/32*20)``) -> canonical ``q`` uint8 ``(N, K)``, ``d`` and ``m``
    float16 ``(N, K/32)``."""
    if k % Q4_1_BLOCK or data.shape != (n, k // Q4_1_BLOCK * Q4_1_BYTES) or data.dtype != np.uint8:
        raise ValueError(f"data: expected uint8 ({n}, {k // Q4_1_BLOCK * Q4_1_BYTES}) Q4_1 rows for N={n}, K={k}, "
                         f"got {data.dtype} {data.shape}")
    blocks = np.ascontiguousarray(data).reshape(n, k // Q4_1_BLOCK, Q4_1_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)
    return torch.from_numpy(q.copy()), torch.from_numpy(d.copy()), torch.from_numpy(m.copy())


def unpermute_rows(n: int, n_head: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (transformers' ``reverse_permute_weights``)."""
    dim = n // n_head // 2
    return torch.arange(n).reshape(n_head, dim, 2).transpose(1, 2).reshape(n)


def load_gguf_llama(path, *, dtype: torch.dtype = torch.float32, device="cpu", progress: bool = True):
    """A transformers llama model from a GGUF file: Q4_1 linears as :class:`QuantLinear` (exact),
    every other tensor dequantized by the ``gguf`` package; the config comes from transformers'
    own GGUF reader."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize
    from tqdm import tqdm
    from transformers import AutoConfig

    path = Path(path)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    model = empty_model(config, dtype)
    kdtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    reader = GGUFReader(str(path))
    for t in tqdm(reader.tensors, desc="gguf", unit="tensor", disable=not progress):
        name = hf_name(t.name)
        kind = t.name.split(".")[-2]
        if t.tensor_type == GGMLQuantizationType.Q4_1:
            k, n = (int(v) for v in t.shape[:2])
            q, d, m = q4_1_to_plain(np.asarray(t.data), n, k)
            if kind in heads:
                rows = unpermute_rows(n, heads[kind])
                q, d, m = q[rows], d[rows], m[rows]
            layer = QuantLinear.from_checkpoint(q.to(device), d.to(device), m.to(device), format="plain", bits=4,
                                                group_size=Q4_1_BLOCK, zero_mode="offset", dtype=kdtype)
            set_submodule(model, name.rpartition(".")[0], layer)
        else:
            w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
            w = w.reshape(tuple(int(v) for v in reversed(t.shape)) if w.dim() > 1 else w.shape)
            if kind in heads:
                w = w[unpermute_rows(w.shape[0], heads[kind])]
            set_tensor(model, name, w.to(device=device, dtype=dtype))
    tie = getattr(config, "tie_word_embeddings", False) or "lm_head.weight" not in {hf_name(t.name) for t in reader.tensors}
    finish_loading(model, tie, device, path.name)
    return model.eval()
