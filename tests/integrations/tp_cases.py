"""Random quantized layers in every checkpoint format, for the tensor-parallel tests (one process
and gloo): the canonical weight (the reference's operands) and its checkpoint tensors."""
from __future__ import annotations

import zlib
from typing import NamedTuple, Optional

import torch

import mixed_gemm as mg
from mixed_gemm.nn import QuantLinear

N, K, TP = 128, 256, 2


class Case(NamedTuple):
    name: str
    format: str
    bits: int
    group_size: int
    symmetric: bool = False
    act_order: bool = False
    zero_mode: str = "int"  # "float": hqq's zeros; "offset": w = q s + m (plain)


CASES = (
    Case("awq4_g64", "awq", 4, 64),
    Case("awq4_sym_g32", "awq", 4, 32, symmetric=True),
    Case("gptq4_g64", "gptq", 4, 64),
    Case("gptq4_act_order_g64", "gptq", 4, 64, act_order=True),
    Case("gptq8_v2_sym_act_order_g32", "gptq_v2", 8, 32, symmetric=True, act_order=True),
    Case("gptq4_per_channel", "gptq", 4, -1),
    Case("plain4_act_order_g128", "plain", 4, 128, act_order=True),
    Case("plain4_offset_g64", "plain", 4, 64, zero_mode="offset"),
    Case("plain3_lowbit_g32", "plain", 3, 32),
    Case("hqq4_g64", "hqq", 4, 64, zero_mode="float"),
    Case("hqq2_lowbit_g64", "hqq", 2, 64, zero_mode="float"),
    Case("sparse12_g64", "sparse12", 7, 64),
)


class Layer(NamedTuple):
    q: torch.Tensor
    s: torch.Tensor
    z: Optional[torch.Tensor]
    g_idx: Optional[torch.Tensor]
    bias: torch.Tensor
    checkpoint: tuple  # (qweight, scales, zeros) in the case's format
    shape: Optional[tuple]  # hqq's (N, K)


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def make_layer(case: Case, n: int = N, k: int = K, seed: int = 0) -> Layer:
    gen = torch.Generator().manual_seed(seed_of(case.name, n, k, seed))
    g = k if case.group_size == -1 else case.group_size
    ng = k // g
    if case.format == "sparse12":
        q, s, z = mg.sparsify_quantize(torch.randn(n, k, generator=gen).half(), group_size=case.group_size)
    else:
        q = torch.randint(0, 1 << case.bits, (n, k), generator=gen, dtype=torch.uint8)
        s = ((torch.rand(n, ng, generator=gen) + 0.5) * (2.0 / ((1 << case.bits) * k**0.5))).half()
        z = None
        if case.zero_mode == "float":
            z = (torch.rand(n, ng, generator=gen) * ((1 << case.bits) - 1)).half()
        elif case.zero_mode == "offset":
            z = (torch.randn(n, ng, generator=gen) * s.float()).half()
        elif not case.symmetric:
            z = torch.randint(0, 1 << case.bits, (n, ng), generator=gen).half()
    g_idx = None
    if case.act_order:
        g_idx = (torch.arange(k) // g)[torch.randperm(k, generator=gen)].int()
    mode = "int" if case.zero_mode == "float" and case.format != "plain" else case.zero_mode
    ckpt = mg.pack(q, s, z, format=case.format, bits=case.bits, group_size=case.group_size, g_idx=g_idx,
                   zero_mode=mode)
    bias = torch.randn(n, generator=gen).half()
    return Layer(q, s, z, g_idx, bias, ckpt, (n, k) if case.format == "hqq" else None)


def reference(case: Case, layer: Layer, x: torch.Tensor) -> torch.Tensor:
    """The float32 reference of the unsharded layer: ``x @ W.T + bias`` with ``W`` the weight an
    unsharded QuantLinear of the whole checkpoint holds (the exact canonical weight, except where
    the layout stores float zeros folded into fp16 ``z'``: lowbit/hqq, checked against it too)."""
    full = QuantLinear.from_checkpoint(*layer.checkpoint, layer.bias, **shard_kwargs(case, layer))
    exact = mg.reference.dequantize(layer.q, layer.s, layer.z, group_size=case.group_size, bits=case.bits,
                                    g_idx=layer.g_idx, zero_mode="offset" if case.zero_mode == "offset" else "int")
    w = full.dense_weight()
    atol = 0 if full.layout != "lowbit" or case.zero_mode == "int" else 2e-3 * float(exact.abs().max())
    torch.testing.assert_close(w, exact, rtol=0, atol=atol)
    return torch.nn.functional.linear(x.float(), w, layer.bias.float())


def shard_kwargs(case: Case, layer: Layer) -> dict:
    return dict(format=case.format, bits=case.bits, group_size=case.group_size, g_idx=layer.g_idx,
                zero_mode="int" if case.format == "hqq" else case.zero_mode, shape=layer.shape)
