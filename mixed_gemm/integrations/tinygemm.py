"""The peer a transformers user already has: torch's own int4 weight-only linear (tinygemm,
``torch._weight_int4pack_mm``; bf16 activations, group-wise scales and zeros, the layout
torchao's int4 weight-only quantization packs). ``mixed-gemm e2e --compare`` builds a model of
these beside fp16 and mixed_gemm, quantized by the same :func:`mixed_gemm.quantize`, so
the two int4 models hold the same codes and differ only in the kernels that read them.

The layout and its packing: :mod:`mixed_gemm.formats.tinygemm`. On the CPU the layer runs
tinygemm's CPU kernel (``torch._weight_int4pack_mm_for_cpu``), so tests check it without a GPU.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..formats.quantize import quantize
from ..formats.tinygemm import pack, pad_k, padded_k


class TinyGemmLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` int4 in tinygemm's layout; activations are cast to bf16 and the
    result back to the input's dtype."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, out_features: int,
                 group_size: int, bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", None if bias is None else bias.to(torch.bfloat16))

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128) -> "TinyGemmLinear":
        w = linear.weight.detach()
        q, s, z = quantize(w.float(), bits=4, group_size=group_size)
        packed, sz = pack(*pad_k(q, s, z, group_size), group_size)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(packed, sz, w.shape[1], w.shape[0], group_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected shape (..., {self.in_features}) (in_features), got {tuple(x.shape)}")
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if padded_k(self.in_features) != self.in_features:  # the packer's K step; torchao pads the same way
            flat = torch.nn.functional.pad(flat, (0, padded_k(self.in_features) - self.in_features))
        mm = torch._weight_int4pack_mm if flat.is_cuda else torch._weight_int4pack_mm_for_cpu
        y = mm(flat, self.packed, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


def tinygemm_model(model: nn.Module, group_size: int = 128, skip: Sequence[str] = ("lm_head",)) -> nn.Module:
    """Replace (in place) every ``nn.Linear`` of ``model`` but those named in ``skip`` with a
    :class:`TinyGemmLinear`; returns ``model``. Cast the model to bf16 first (tinygemm's dtype)."""
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] not in skip]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, TinyGemmLinear.from_linear(linear, group_size))
    return model
