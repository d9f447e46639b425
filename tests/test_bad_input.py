"""Bad input at every public tensor entry point raises a ValueError/TypeError naming the argument
and the rule, before anything is launched (checkpoint files: tests/integrations/test_checkpoint_errors.py).

``CASES`` is the table: (entry point, kind of defect) -> the bad call, the exception, and the words
its message must hold (the argument's name first). Each row runs on the CPU where it applies and
on the GPU (``-m gpu``), where a correct call checked against the float32 reference follows every
rejected one, so a check that let a launch through would show as a broken CUDA context.
``ACCEPTED`` lists the defects that are not errors by design (a layer takes strided inputs as
``nn.Linear`` does, zero rows are a valid batch), each checked against the reference.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import pytest
import torch
from torch import nn

import mixed_gemm as mg
from mixed_gemm.integrations.shard import shard_linear
from mixed_gemm.nn import QuantLinear

N, K, G = 64, 128, 32
F16 = torch.float16
NAN, INF = float("nan"), float("inf")


# ------------------------------------------------------------------ valid inputs, on a device
def weight(dev) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(N, K, generator=gen).half().to(dev)


def canon(dev):
    """A valid canonical ``(q, s, z)`` at group G."""
    return mg.quantize(weight(dev), group_size=G)


def awq(dev):
    return mg.pack(*canon(dev), format="awq", group_size=G)


def packed(dev) -> mg.PackedWeight:
    return mg.prepack(*canon(dev), format="plain", group_size=G)


def layer(dev, **kw) -> QuantLinear:
    return QuantLinear.from_checkpoint(*canon(dev), format="plain", bits=4, group_size=G, **kw)


def act(dev, rows=3, k=K, dtype=F16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    return torch.randn(rows, k, generator=gen).to(dtype).to(dev)


def poke(t: torch.Tensor, value, index=(0, 0)) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def other(dev) -> str:
    """A device the tensors are not on: meta on the CPU, the CPU on the GPU."""
    return "meta" if dev == "cpu" else "cpu"


def with_q(dev, fn):
    q, s, z = canon(dev)
    return fn(q, s, z)


def misaligned(dev, rows=3) -> torch.Tensor:
    """A contiguous (rows, K) fp16 view whose data pointer is 2 bytes past a 16-byte boundary."""
    return torch.empty(rows * K + 1, dtype=F16, device=dev)[1:].view(rows, K).normal_()


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Case:
    entry: str
    kind: str
    call: Callable[[str], object]
    exc: type
    needles: Sequence[str]  # the argument's name (and rule) the message names
    where: str = "both"  # "cpu", "gpu" or "both"


def plain(q, s, z, **kw):
    return mg.prepack(q, s, z, **{"format": "plain", "group_size": G, **kw})


CASES = [
    # --- quantize(w) ---
    Case("quantize", "type", lambda d: mg.quantize([[1.0]]), TypeError, ["w: expected a torch.Tensor"]),
    Case("quantize", "dtype", lambda d: mg.quantize(weight(d).int()), TypeError, ["w: expected dtype"]),
    Case("quantize", "rank", lambda d: mg.quantize(weight(d)[0]), ValueError, ["w: expected a 2-D tensor"]),
    Case("quantize", "empty", lambda d: mg.quantize(weight(d)[:0]), ValueError, ["w: expected a non-empty"]),
    Case("quantize", "nan", lambda d: mg.quantize(poke(weight(d), NAN), group_size=G), ValueError,
         ["w: expected finite"]),
    Case("quantize", "inf", lambda d: mg.quantize(poke(weight(d), -INF), group_size=G), ValueError,
         ["w: expected finite"]),
    Case("quantize", "bits", lambda d: mg.quantize(weight(d), bits=5), ValueError, ["bits: expected one of"]),
    Case("quantize", "group", lambda d: mg.quantize(weight(d), group_size=0), ValueError, ["group_size: expected -1"]),
    # --- pack(q, s, z) ---
    Case("pack", "dtype", lambda d: with_q(d, lambda q, s, z: mg.pack(q.int(), s, z, format="awq", group_size=G)),
         TypeError, ["q: expected dtype torch.uint8"]),
    Case("pack", "dtype-z", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s, z.float(), format="awq", group_size=G)),
         TypeError, ["z: expected dtype torch.float16 (same as s)"]),
    Case("pack", "device", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s, z.to(other(d)), format="awq",
                                                                        group_size=G)),
         ValueError, ["z: expected the same device as q"]),
    Case("pack", "rank", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s[0], None, format="awq", group_size=G)),
         ValueError, ["s: expected a 2-D tensor"]),
    Case("pack", "shape", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s[:-1], z[:-1], format="awq", group_size=G)),
         ValueError, ["q: expected shape"]),
    Case("pack", "empty", lambda d: with_q(d, lambda q, s, z: mg.pack(q[:0], s[:0], z[:0], format="awq",
                                                                       group_size=G)),
         ValueError, ["q: expected a non-empty"]),
    Case("pack", "nan-s", lambda d: with_q(d, lambda q, s, z: mg.pack(q, poke(s, NAN), z, format="awq",
                                                                       group_size=G)),
         ValueError, ["s: expected finite values", "first at (0, 0)"]),
    Case("pack", "inf-s", lambda d: with_q(d, lambda q, s, z: mg.pack(q, poke(s, INF, (3, 1)), z, format="gptq",
                                                                       group_size=G)),
         ValueError, ["s: expected finite values", "first at (3, 1)"]),
    Case("pack", "nan-z-int", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s, poke(z, NAN), format="awq",
                                                                           group_size=G)),
         ValueError, ["z: expected finite integer values"]),
    Case("pack", "inf-z-float", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s, poke(z, INF), format="plain",
                                                                             group_size=G, zero_mode="float")),
         ValueError, ["z: expected finite values"]),
    Case("pack", "range-q", lambda d: with_q(d, lambda q, s, z: mg.pack(poke(q, 16), s, z, format="awq",
                                                                         group_size=G)),
         ValueError, ["q: expected values in [0, 16)"]),
    Case("pack", "range-z", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s, poke(z, 16), format="gptq",
                                                                         group_size=G)),
         ValueError, ["z: expected values in [0, 16)"]),
    Case("pack", "group", lambda d: with_q(d, lambda q, s, z: mg.pack(q, s, z, format="awq", group_size=2 * G)),
         ValueError, ["s: expected shape", "group_size=64"]),
    # --- unpack(qweight, scales, zeros) ---
    Case("unpack", "dtype", lambda d: mg.unpack(awq(d)[0].float(), *awq(d)[1:], format="awq", group_size=G),
         TypeError, ["qweight: expected dtype torch.int32"]),
    Case("unpack", "device", lambda d: mg.unpack(awq(d)[0], awq(d)[1].to(other(d)), awq(d)[2], format="awq",
                                                 group_size=G),
         ValueError, ["scales: expected the same device as qweight"]),
    Case("unpack", "rank", lambda d: mg.unpack(awq(d)[0][0], *awq(d)[1:], format="awq", group_size=G),
         ValueError, ["qweight: expected a 2-D tensor"]),
    Case("unpack", "shape", lambda d: mg.unpack(awq(d)[0], awq(d)[1][:, :-8], awq(d)[2], format="awq", group_size=G),
         ValueError, ["scales: expected shape"]),
    Case("unpack", "empty", lambda d: mg.unpack(awq(d)[0][:0], *awq(d)[1:], format="awq", group_size=G),
         ValueError, ["qweight: expected a non-empty"]),
    Case("unpack", "nan-scales", lambda d: mg.unpack(awq(d)[0], poke(awq(d)[1], NAN), awq(d)[2], format="awq",
                                                     group_size=G),
         ValueError, ["scales: expected finite values"]),
    Case("unpack", "inf-scales-gptq",
         lambda d: mg.unpack(*(lambda c: (c[0], poke(c[1], INF), c[2]))(mg.pack(*canon(d), format="gptq",
                                                                                group_size=G)),
                             format="gptq", group_size=G),
         ValueError, ["scales: expected finite values"]),
    Case("unpack", "nan-scales-hqq",
         lambda d: mg.unpack(*(lambda c: (c[0], poke(c[1], NAN), c[2]))(mg.pack(*canon(d), format="hqq",
                                                                                group_size=G)),
                             format="hqq", group_size=G, shape=(N, K)),
         ValueError, ["scales: expected finite values"]),
    Case("unpack", "nan-zeros-hqq",
         lambda d: mg.unpack(*(lambda c: (c[0], c[1], poke(c[2], NAN)))(mg.pack(*canon(d), format="hqq",
                                                                                group_size=G)),
                             format="hqq", group_size=G, shape=(N, K)),
         ValueError, ["zeros: expected finite values"]),
    Case("unpack", "range-plain", lambda d: with_q(d, lambda q, s, z: mg.unpack(poke(q, 200), s, z, format="plain",
                                                                                 group_size=G)),
         ValueError, ["qweight: expected values in [0, 16)"]),
    Case("unpack", "group", lambda d: mg.unpack(*awq(d), format="awq", group_size=2 * G), ValueError,
         ["scales: expected shape", "group_size=64"]),
    # --- prepack(qweight, scales, zeros) ---
    Case("prepack", "nan-scales", lambda d: with_q(d, lambda q, s, z: plain(q, poke(s, NAN), z)), ValueError,
         ["scales: expected finite values"]),
    Case("prepack", "nan-scales-float-zeros",
         lambda d: with_q(d, lambda q, s, z: plain(q, poke(s, NAN), z, zero_mode="float")), ValueError,
         ["scales: expected finite values"]),
    Case("prepack", "inf-zeros-float", lambda d: with_q(d, lambda q, s, z: plain(q, s, poke(z, -INF),
                                                                                  zero_mode="float")),
         ValueError, ["zeros: expected finite values"]),
    Case("prepack", "nan-offsets", lambda d: with_q(d, lambda q, s, z: plain(q, s, poke(z, NAN), zero_mode="offset")),
         ValueError, ["zeros: expected finite values"]),
    Case("prepack", "inf-scales-awq", lambda d: mg.prepack(awq(d)[0], poke(awq(d)[1], INF), awq(d)[2], group_size=G),
         ValueError, ["scales: expected finite values"]),
    Case("prepack", "dtype", lambda d: with_q(d, lambda q, s, z: plain(q, s, z, dtype=torch.float32)), TypeError,
         ["dtype: must be torch.float16 or torch.bfloat16"]),
    Case("prepack", "dtype-qweight", lambda d: with_q(d, lambda q, s, z: plain(q.int(), s, z)), TypeError,
         ["qweight: expected dtype torch.uint8"]),
    Case("prepack", "device", lambda d: with_q(d, lambda q, s, z: plain(q, s.to(other(d)), z)), ValueError,
         ["scales: expected the same device as qweight"]),
    Case("prepack", "rank", lambda d: with_q(d, lambda q, s, z: plain(q[None], s, z)), ValueError,
         ["qweight: expected a 2-D tensor"]),
    Case("prepack", "shape-N", lambda d: with_q(d, lambda q, s, z: plain(q[:-1], s[:-1], z[:-1])), ValueError,
         ["N: must be even"]),
    Case("prepack", "shape-K", lambda d: with_q(d, lambda q, s, z: plain(q[:, :-4], s, z)), ValueError,
         ["K: must be a multiple of 8"]),
    Case("prepack", "stride", lambda d: with_q(d, lambda q, s, z: plain(q, s.t(), z.t())), ValueError,
         ["scales: expected shape"]),
    Case("prepack", "empty", lambda d: with_q(d, lambda q, s, z: plain(q[:0], s[:0], z[:0])), ValueError,
         ["qweight: expected a non-empty"]),
    Case("prepack", "range-q", lambda d: with_q(d, lambda q, s, z: plain(poke(q, 16), s, z)), ValueError,
         ["qweight: expected values in [0, 16)"]),
    Case("prepack", "range-zeros", lambda d: with_q(d, lambda q, s, z: plain(q, s, poke(z, 16))), ValueError,
         ["zeros: expected values in [0, 16)"]),
    Case("prepack", "group-rule", lambda d: mg.prepack(*mg.quantize(weight(d), group_size=48), format="plain",
                                                       group_size=48),
         ValueError, ["group_size: must be -1 or a power of two >= 32"]),
    Case("prepack", "group-mismatch", lambda d: with_q(d, lambda q, s, z: plain(q, s, z, group_size=2 * G)),
         ValueError, ["scales: expected shape", "group_size=64"]),
    Case("prepack", "g_idx", lambda d: with_q(d, lambda q, s, z: plain(q, s, z, g_idx=torch.zeros(K, dtype=torch.int32,
                                                                                                  device=d))),
         ValueError, ["g_idx: every group must have exactly group_size=32"]),
    # --- matmul(x, w) ---
    Case("matmul", "type-x", lambda d: mg.matmul([[0.0] * K], packed(d)), TypeError, ["x: expected a torch.Tensor"]),
    Case("matmul", "type-w", lambda d: mg.matmul(act(d), "weight"), TypeError, ["w: expected a PackedWeight"]),
    Case("matmul", "extra-scales", lambda d: mg.matmul(act(d), packed(d), canon(d)[1]), ValueError,
         ["scales/zeros: pass them to prepack()"]),
    Case("matmul", "raw-nan-scales", lambda d: mg.matmul(act(d), awq(d)[0], poke(awq(d)[1], NAN), awq(d)[2],
                                                         group_size=G),
         ValueError, ["scales: expected finite values"]),
    Case("matmul", "raw-no-scales", lambda d: mg.matmul(act(d), awq(d)[0]), ValueError, ["scales: required"]),
    Case("matmul", "device", lambda d: mg.matmul(act(d).to(other(d)), packed(d)), ValueError,
         ["x: must be on the weight's device"]),
    Case("matmul", "cpu", lambda d: mg.matmul(act(d), packed(d)), ValueError, ["x: must be a CUDA tensor"], "cpu"),
    Case("matmul", "dtype", lambda d: mg.matmul(act(d, dtype=torch.float32), packed(d)), TypeError,
         ["x: expected dtype torch.float16"], "gpu"),
    Case("matmul", "dtype-int", lambda d: mg.matmul(act(d).int(), packed(d)), TypeError,
         ["x: expected dtype torch.float16"], "gpu"),
    Case("matmul", "rank", lambda d: mg.matmul(act(d)[0, 0], packed(d)), ValueError,
         ["x: last dimension must equal the weight's K=128"], "gpu"),
    Case("matmul", "shape", lambda d: mg.matmul(act(d, k=K + 8), packed(d)), ValueError,
         ["x: last dimension must equal the weight's K=128"], "gpu"),
    Case("matmul", "stride", lambda d: mg.matmul(act(d, rows=K, k=K).t(), packed(d)), ValueError,
         ["x: must be contiguous"], "gpu"),
    Case("matmul", "alignment", lambda d: mg.matmul(misaligned(d), packed(d)), ValueError,
         ["x: data pointer must be 16-byte aligned"], "gpu"),
    Case("matmul", "bias-type", lambda d: mg.matmul(act(d), packed(d), bias=[0.0] * N), TypeError, ["bias"], "gpu"),
    Case("matmul", "bias-shape", lambda d: mg.matmul(act(d), packed(d), bias=torch.zeros(N + 2, dtype=F16, device=d)),
         ValueError, ["bias: expected a torch.float16 (64,) tensor"], "gpu"),
    Case("matmul", "out-shape", lambda d: mg.matmul(act(d), packed(d), out=torch.empty(3, N + 2, dtype=F16, device=d)),
         ValueError, ["out: expected a contiguous"], "gpu"),
    Case("matmul", "out-dtype", lambda d: mg.matmul(act(d), packed(d), out=torch.empty(3, N, device=d)),
         ValueError, ["out: expected a contiguous", "torch.float16"], "gpu"),
    Case("matmul", "residual-shape",
         lambda d: mg.matmul(act(d), packed(d), residual=torch.zeros(3, N + 2, dtype=F16, device=d)),
         ValueError, ["residual: expected"], "gpu"),
    # --- dequantize(w) ---
    Case("dequantize", "type", lambda d: mg.dequantize(canon(d)[0]), TypeError, ["w: expected a PackedWeight"]),
    Case("dequantize", "cpu", lambda d: mg.dequantize(packed(d)), ValueError, ["w: must be on a CUDA device"], "cpu"),
    Case("dequantize", "out-type", lambda d: mg.dequantize(packed(d), out=[0.0]), TypeError,
         ["out: expected a torch.Tensor"], "gpu"),
    Case("dequantize", "out-shape", lambda d: mg.dequantize(packed(d), out=torch.empty(N, K + 8, dtype=F16, device=d)),
         ValueError, ["out: expected a contiguous torch.float16 tensor of shape (64, 128)"], "gpu"),
    Case("dequantize", "out-dtype", lambda d: mg.dequantize(packed(d), out=torch.empty(N, K, device=d)),
         ValueError, ["out: expected a contiguous torch.float16"], "gpu"),
    Case("dequantize", "out-stride", lambda d: mg.dequantize(packed(d), out=torch.empty(K, N, dtype=F16, device=d).t()),
         ValueError, ["out: expected a contiguous"], "gpu"),
    # --- silu_mul_matmul(x, w) ---
    Case("silu_mul_matmul", "type-w", lambda d: mg.silu_mul_matmul(act(d), layer(d)), TypeError,
         ["w: expected a PackedWeight"]),
    Case("silu_mul_matmul", "type-x", lambda d: mg.silu_mul_matmul([[0.0] * K], packed(d)), TypeError,
         ["x: expected a torch.Tensor"]),
    Case("silu_mul_matmul", "device", lambda d: mg.silu_mul_matmul(act(d).to(other(d)), packed(d)), ValueError,
         ["x: must be on the weight's device"]),
    Case("silu_mul_matmul", "shape", lambda d: mg.silu_mul_matmul(act(d, k=K - 8), packed(d)), ValueError,
         ["x: last dimension must equal the weight's K=128"]),
    Case("silu_mul_matmul", "rank", lambda d: mg.silu_mul_matmul(act(d)[0, 0], packed(d)), ValueError,
         ["x: last dimension must equal the weight's K=128"]),
    Case("silu_mul_matmul", "dtype", lambda d: mg.silu_mul_matmul(act(d, dtype=torch.bfloat16), packed(d)), TypeError,
         ["x: expected dtype torch.float16"]),
    Case("silu_mul_matmul", "cpu", lambda d: mg.silu_mul_matmul(act(d), packed(d)), ValueError,
         ["x: must be a CUDA tensor"], "cpu"),
    # --- QuantLinear(...) and its forward ---
    Case("QuantLinear()", "type", lambda d: QuantLinear("128", N), TypeError, ["in_features: expected an int"]),
    Case("QuantLinear()", "in_features", lambda d: QuantLinear(K - 4, N), ValueError,
         ["in_features: expected K > 0, a multiple of 8"]),
    Case("QuantLinear()", "empty", lambda d: QuantLinear(K, 0), ValueError, ["out_features: expected N > 0"]),
    Case("QuantLinear()", "out_features", lambda d: QuantLinear(K, N - 1), ValueError,
         ["out_features: expected N > 0, even"]),
    Case("QuantLinear()", "bits", lambda d: QuantLinear(K, N, bits=5), ValueError, ["bits: expected one of"]),
    Case("QuantLinear()", "group", lambda d: QuantLinear(K, N, group_size=0), ValueError,
         ["group_size: expected -1 or a positive int"]),
    Case("QuantLinear()", "group-rule", lambda d: QuantLinear(K, N, group_size=48), ValueError,
         ["group_size: must be -1, >= in_features or a power of two >= 32"]),
    Case("QuantLinear()", "zero_mode", lambda d: QuantLinear(K, N, zero_mode="asym"), ValueError, ["zero_mode"]),
    Case("QuantLinear()", "format", lambda d: QuantLinear(K, N, format="exl2"), ValueError, ["format: expected one of"]),
    Case("QuantLinear()", "dtype", lambda d: QuantLinear(K, N, dtype=torch.float32), TypeError,
         ["dtype: must be torch.float16 or torch.bfloat16"]),
    Case("QuantLinear()", "layout", lambda d: QuantLinear(K, N, layout="hopper"), ValueError, ["layout: must be one of"]),
    Case("QuantLinear()", "layout-bits", lambda d: QuantLinear(K, N, bits=3), ValueError,
         ["layout:", "'lowbit'", "bits=3"]),
    Case("QuantLinear()", "nan-checkpoint", lambda d: with_q(d, lambda q, s, z: QuantLinear.from_checkpoint(
        q, poke(s, NAN), z, format="plain", bits=4, group_size=G)), ValueError, ["scales: expected finite values"]),
    Case("QuantLinear()", "nan-state_dict",
         lambda d: QuantLinear(K, N, group_size=G, device=d).load_state_dict(
             {k: (poke(v, NAN) if k == "scales" else v) for k, v in layer(d).state_dict().items()}),
         ValueError, ["scales: expected finite values"]),
    Case("QuantLinear()", "bias-shape", lambda d: layer(d, bias=torch.zeros(N + 2, dtype=F16, device=d)), ValueError,
         ["bias: expected shape (64,) (out_features)"]),
    Case("QuantLinear()", "bias-nan", lambda d: layer(d, bias=poke(torch.zeros(N, dtype=F16, device=d), NAN, 3)),
         ValueError, ["bias: expected finite values"]),
    Case("QuantLinear()", "bias-dtype", lambda d: layer(d, bias=torch.zeros(N, dtype=torch.int32, device=d)), TypeError,
         ["bias: expected a floating-point tensor"]),
    Case("QuantLinear.forward", "type", lambda d: layer(d)([[0.0] * K]), TypeError, ["x: expected a torch.Tensor"]),
    Case("QuantLinear.forward", "dtype", lambda d: layer(d)(act(d).int()), TypeError,
         ["x: expected dtype torch.float16, torch.bfloat16 or torch.float32"], "cpu"),
    Case("QuantLinear.forward", "dtype-double", lambda d: layer(d)(act(d).double()), TypeError,
         ["x: expected dtype"], "cpu"),
    Case("QuantLinear.forward", "dtype-kernel", lambda d: layer(d)(act(d, dtype=torch.float32)), TypeError,
         ["x: expected dtype torch.float16"], "gpu"),
    Case("QuantLinear.forward", "shape", lambda d: layer(d)(act(d, k=K - 28)), ValueError,
         ["x: last dimension must equal in_features=128"], "cpu"),
    Case("QuantLinear.forward", "shape-kernel", lambda d: layer(d)(act(d, k=K - 28)), ValueError,
         ["x: last dimension must equal the weight's K=128"], "gpu"),
    Case("QuantLinear.forward", "rank", lambda d: layer(d)(act(d)[0, 0]), ValueError,
         ["x: last dimension must equal in_features=128"], "cpu"),
    Case("QuantLinear.forward", "device", lambda d: layer(d)(act(d).to(other(d))), ValueError,
         ["x: must be on the layer's device"]),
    Case("QuantLinear.forward", "residual", lambda d: layer(d)(act(d), residual=torch.zeros(3, N + 2, dtype=F16,
                                                                                           device=d)),
         ValueError, ["residual: expected"]),
    # --- shard_linear(qweight, scales, zeros, ...) ---
    Case("shard_linear", "type", lambda d: shard_linear([[0]], *awq(d)[1:], style="column", tp_rank=0, tp_size=2,
                                                        format="awq", group_size=G),
         TypeError, ["qweight: expected a torch.Tensor or a safetensors slice"]),
    Case("shard_linear", "rank", lambda d: shard_linear(awq(d)[0][0], *awq(d)[1:], style="column", tp_rank=0,
                                                        tp_size=2, format="awq", group_size=G),
         ValueError, ["qweight: expected a 2-D tensor"]),
    Case("shard_linear", "format", lambda d: shard_linear(*awq(d), style="column", tp_rank=0, tp_size=2,
                                                          format="marlin", group_size=G),
         ValueError, ["format: expected one of"]),
    Case("shard_linear", "bits", lambda d: shard_linear(*awq(d), style="column", tp_rank=0, tp_size=2, format="awq",
                                                        bits=3, group_size=G),
         ValueError, ["bits: expected one of (4, 8) for format 'awq'"]),
    Case("shard_linear", "style", lambda d: shard_linear(*awq(d), style="diagonal", tp_rank=0, tp_size=2,
                                                         format="awq", group_size=G),
         ValueError, ["style: expected one of"]),
    Case("shard_linear", "tp_rank", lambda d: shard_linear(*awq(d), style="column", tp_rank=2, tp_size=2, format="awq",
                                                           group_size=G),
         ValueError, ["tp_rank, tp_size: expected"]),
    Case("shard_linear", "tp_size-type", lambda d: shard_linear(*awq(d), style="row", tp_rank=0, tp_size=2.0,
                                                                format="awq", group_size=G),
         TypeError, ["tp_size: expected an int"]),
    Case("shard_linear", "shape", lambda d: shard_linear(*awq(d), style="column", tp_rank=0, tp_size=3, format="awq",
                                                         group_size=G),
         ValueError, ["tp_size: column-parallel splits N=64 into 3 equal shards"]),
    Case("shard_linear", "group", lambda d: shard_linear(*awq(d), style="row", tp_rank=0, tp_size=8, format="awq",
                                                         group_size=G),
         ValueError, ["tp_size: row-parallel shards K in whole groups"]),
    Case("shard_linear", "group-mismatch", lambda d: shard_linear(*awq(d), style="column", tp_rank=0, tp_size=2,
                                                                  format="awq", group_size=2 * G),
         ValueError, ["scales: expected shape", "group_size=64"]),
    Case("shard_linear", "nan", lambda d: shard_linear(awq(d)[0], poke(awq(d)[1], NAN, (1, 40)), awq(d)[2],
                                                       style="column", tp_rank=1, tp_size=2, format="awq",
                                                       group_size=G),
         ValueError, ["scales: expected finite values"]),
    Case("shard_linear", "range", lambda d: with_q(d, lambda q, s, z: shard_linear(
        poke(q, 17), s, z, style="row", tp_rank=0, tp_size=2, format="plain", group_size=G)),
         ValueError, ["qweight: expected values in [0, 16)"]),
    Case("shard_linear", "range-g_idx", lambda d: shard_linear(
        *mg.pack(*canon(d), format="gptq", group_size=G), style="row", tp_rank=1, tp_size=2, format="gptq",
        group_size=G, g_idx=poke(torch.arange(K, device=d) // G, K, 70)),
         ValueError, ["g_idx: expected values in [0, 4)"]),
    Case("shard_linear", "device", lambda d: shard_linear(awq(d)[0], awq(d)[1].to(other(d)), awq(d)[2], style="column",
                                                          tp_rank=0, tp_size=2, format="awq", group_size=G),
         ValueError, ["scales: expected the same device as qweight"]),
    Case("shard_linear", "dtype", lambda d: shard_linear(*awq(d), style="column", tp_rank=0, tp_size=2, format="awq",
                                                         group_size=G, dtype=torch.float32),
         TypeError, ["dtype: must be torch.float16 or torch.bfloat16"]),
    Case("shard_linear", "empty", lambda d: shard_linear(awq(d)[0][:0], *awq(d)[1:], style="column", tp_rank=0,
                                                         tp_size=2, format="awq", group_size=G),
         ValueError, ["qweight"]),
    Case("shard_linear", "bias", lambda d: shard_linear(*awq(d), torch.zeros(N + 4, dtype=F16, device=d), style="row",
                                                        tp_rank=0, tp_size=2, format="awq", group_size=G),
         ValueError, ["bias: expected shape (64,)"]),
]


def _ids(cases):
    return [f"{c.entry}-{c.kind}" for c in cases]


def _check(case: Case, dev: str) -> None:
    with pytest.raises(case.exc) as info:
        case.call(dev)
    message = str(info.value)
    for needle in case.needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert re.match(r"^[\w.\[\], '()/-]+:", message), f"the message names no argument first: {message!r}"


CPU_CASES = [c for c in CASES if c.where in ("cpu", "both")]
GPU_CASES = [c for c in CASES if c.where in ("gpu", "both")]


def test_table_ids_are_unique():
    assert len(set(_ids(CASES))) == len(CASES)


@pytest.mark.parametrize("case", CPU_CASES, ids=_ids(CPU_CASES))
def test_bad_input_cpu(case):
    _check(case, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=_ids(GPU_CASES))
def test_bad_input_gpu(case):
    from cuda_check import assert_cuda_usable

    _check(case, "cuda")
    assert_cuda_usable()


# ------------------------------------------------------------------ not errors, by design
def _reference(dev, x, bias=None):
    q, s, z = canon(dev)
    return mg.reference.matmul(x, q, s, z, group_size=G, bias=bias)


def _strided_layer(dev):
    x = act(dev, rows=2 * K, k=K)[::2]  # every other row: a non-contiguous (K, K) view
    assert not x.is_contiguous()
    return layer(dev)(x), _reference(dev, x)


def _empty_layer(dev):
    x = act(dev, rows=0)
    return layer(dev)(x), _reference(dev, x)


def _float32_layer(dev):
    x = act(dev, dtype=torch.float32)
    return layer(dev)(x), _reference(dev, x)


def _quantize_strided(dev):
    w = weight(dev)
    strided = torch.empty(K, N, dtype=F16, device=dev).t().copy_(w)
    return torch.stack([t.float() for t in mg.quantize(strided, group_size=G)[1:]]), \
        torch.stack([t.float() for t in mg.quantize(w, group_size=G)[1:]])


def _prepack_strided(dev):
    q, s, z = canon(dev)
    s2, z2 = (torch.empty(t.shape[::-1], dtype=t.dtype, device=dev).t().copy_(t) for t in (s, z))
    assert not s2.is_contiguous()
    w, w2 = plain(q, s, z), plain(q, s2, z2)
    return torch.cat([w2.scales.float().flatten(), w2.zeros.float().flatten(), w2.b.float().flatten()]), \
        torch.cat([w.scales.float().flatten(), w.zeros.float().flatten(), w.b.float().flatten()])


def _empty_matmul(dev):
    return mg.matmul(act(dev, rows=0), packed(dev)), _reference(dev, act(dev, rows=0))


def _strided_silu_mul(rows):
    """Either path (the grouped kernel at <= 4 rows, matmul above) gives what a contiguous x gives."""
    def call(dev):
        x = act(dev, rows=rows, k=2 * K)[:, ::2]
        w = packed(dev)
        return mg.silu_mul_matmul(x, w), mg.silu_mul_matmul(x.contiguous(), w).float()
    return call


ACCEPTED = {  # defect -> (devices, a call returning (result, float32 reference))
    "QuantLinear.forward-stride": ("both", _strided_layer),
    "QuantLinear.forward-empty": ("both", _empty_layer),
    "QuantLinear.forward-float32-cpu": ("cpu", _float32_layer),
    "quantize-stride": ("both", _quantize_strided),
    "prepack-stride": ("both", _prepack_strided),
    "matmul-empty": ("gpu", _empty_matmul),
    "silu_mul_matmul-stride-grouped": ("gpu", _strided_silu_mul(4)),
    "silu_mul_matmul-stride-matmul": ("gpu", _strided_silu_mul(8)),
}


def _accepted(name, dev):
    from tolerance import assert_elementwise

    y, ref = ACCEPTED[name][1](dev)
    assert y.shape == ref.shape
    if y.dtype == torch.float32:  # the CPU reference path and quantize: float32 results
        torch.testing.assert_close(y, ref)
    else:
        assert_elementwise(y, ref, K)


@pytest.mark.parametrize("name", [n for n, (w, _) in ACCEPTED.items() if w in ("cpu", "both")])
def test_accepted_cpu(name):
    _accepted(name, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n, (w, _) in ACCEPTED.items() if w in ("gpu", "both")])
def test_accepted_gpu(name):
    _accepted(name, "cuda")


def test_layer_error_is_raised_before_the_reference_weight_is_built():
    """The CPU path checks x before computing (and caching) the dense weight."""
    ql = layer("cpu")
    with pytest.raises(ValueError, match="in_features"):
        ql(act("cpu", k=K - 8))
    assert ql._dense is None


def test_nn_linear_still_builds():
    assert isinstance(QuantLinear.from_linear(nn.Linear(K, N).half(), group_size=G), QuantLinear)
