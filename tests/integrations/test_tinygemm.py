"""The tinygemm peer layer (mixed_gemm.integrations.tinygemm) on the CPU, through tinygemm's CPU
kernel: the same codes as mixed_gemm's quantizer, element-wise against the float32 reference;
shape rules; model conversion skips lm_head."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import mixed_gemm as mg
from mixed_gemm.formats.tinygemm import check_shape, pack
from mixed_gemm.integrations.tinygemm import TinyGemmLinear, tinygemm_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerance import assert_elementwise  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(torch, "_weight_int4pack_mm_for_cpu"),
                                reason="this torch has no tinygemm CPU kernel")


@pytest.mark.parametrize("n, k, group, m", [(64, 256, 128, 1), (128, 512, 64, 5), (256, 1024, 32, 17)])
def test_matches_the_reference_on_the_same_codes(n, k, group, m):
    gen = torch.Generator().manual_seed(n + k + group)
    linear = nn.Linear(k, n, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) / k**0.5)
        linear.bias.copy_(torch.randn(n, generator=gen))
    layer = TinyGemmLinear.from_linear(linear, group)
    q, s, z = mg.quantize(linear.weight.detach().float(), bits=4, group_size=group)
    x = torch.randn(m, k, generator=gen).bfloat16()
    y = layer(x)
    # tinygemm keeps scales and zeros in bf16: the reference uses the same rounded values.
    sz = pack(q, s, z, group)[1].float()
    w = (q.float() - 8) * sz[..., 0].t().repeat_interleave(group, 1) + sz[..., 1].t().repeat_interleave(group, 1)
    ref = x.float() @ w.t() + linear.bias.detach().bfloat16().float()
    assert y.dtype == torch.bfloat16 and not y.isnan().any()
    assert_elementwise(y, ref, k)


@pytest.mark.parametrize("k, group", [(576, 64), (576, 128), (200, 32)])
def test_k_off_the_packers_step_is_padded(k, group):
    """K not a multiple of 128 (SmolLM2's 576; a ragged last group at 128): codes and x are
    zero-padded as torchao pads in_features, and the result is the unpadded product."""
    from mixed_gemm.formats.tinygemm import pad_k, padded_k

    gen = torch.Generator().manual_seed(k + group)
    linear = nn.Linear(k, 64, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(64, k, generator=gen) / k**0.5)
    layer = TinyGemmLinear.from_linear(linear, group)
    q, s, z = pad_k(*mg.quantize(linear.weight.detach().float(), bits=4, group_size=group), group)
    assert q.shape[1] == padded_k(k) and padded_k(k) % 128 == 0
    sz = pack(q, s, z, group)[1].float()
    w = (q.float() - 8) * sz[..., 0].t().repeat_interleave(group, 1) + sz[..., 1].t().repeat_interleave(group, 1)
    x = torch.randn(3, k, generator=gen).bfloat16()
    y = layer(x)
    assert y.shape == (3, 64) and not y.isnan().any()
    assert_elementwise(y, x.float() @ w[:, :k].t(), k)


def test_shape_rules_are_named():
    with pytest.raises(ValueError, match="K=200: tinygemm needs a multiple of 128"):
        check_shape(64, 200, 128)
    with pytest.raises(ValueError, match="N=60: tinygemm needs a multiple of 8"):
        check_shape(60, 256, 128)
    with pytest.raises(ValueError, match="group_size: tinygemm takes 32, 64, 128 or 256"):
        check_shape(64, 256, 48)
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 256\)"):
        TinyGemmLinear.from_linear(nn.Linear(256, 64), 128)(torch.randn(2, 128).bfloat16())


def test_model_conversion_skips_lm_head():
    model = nn.Sequential()
    model.add_module("up", nn.Linear(256, 128))
    model.add_module("lm_head", nn.Linear(128, 64))
    tinygemm_model(model, 128)
    assert isinstance(model.up, TinyGemmLinear) and isinstance(model.lm_head, nn.Linear)
    out = model.lm_head(model.up(torch.randn(3, 256).bfloat16()).float())
    assert out.shape == (3, 64)
