"""Round-to-nearest quantization: error bound, output contract, degenerate groups."""
from __future__ import annotations

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.formats import FORMATS as ALL_FORMATS, pack, quantize, unpack

# The dense formats that hold their own shape (hqq: test_hqq.py; sparse12: test_sparse12.py).
FORMATS = tuple(f for f in ALL_FORMATS if f not in ("hqq", "sparse12"))

N, K = 24, 256


def _bound_holds(w, q, s, z, *, bits, group_size):
    w_hat = mg.reference.dequantize(q, s, z, group_size=group_size, bits=bits)
    g = K if group_size == -1 else group_size
    half_s = s.float().repeat_interleave(g, dim=1) / 2
    err = (w.float() - w_hat).abs()
    return bool((err <= half_s * (1 + 1e-5) + 1e-7).all()), err


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_quantize_error_bound_and_contract(gen, dtype, bits, group_size, symmetric):
    w = (torch.randn(N, K, generator=gen) * 0.05).to(dtype)
    q, s, z = quantize(w, bits=bits, group_size=group_size, symmetric=symmetric)
    ng = 1 if group_size == -1 else K // group_size
    out_dtype = torch.float16 if dtype == torch.float32 else dtype
    assert q.dtype == torch.uint8 and q.shape == (N, K) and int(q.max()) < 2**bits
    assert s.dtype == out_dtype and s.shape == (N, ng) and bool((s > 0).all())
    if symmetric:
        assert z is None and int(q.min()) >= 1  # absmax / (2**(bits-1) - 1) never needs q = 0
    else:
        assert z.dtype == out_dtype and z.shape == (N, ng)
        assert torch.equal(z, z.round()) and 0 <= float(z.min()) and float(z.max()) <= 2**bits - 1
    ok, err = _bound_holds(w, q, s, z, bits=bits, group_size=group_size)
    assert ok, float(err.max())
    # the canonical output packs into every format
    for fmt in FORMATS:
        back = unpack(*pack(q, s, z, format=fmt, bits=bits, group_size=group_size),
                      format=fmt, bits=bits, group_size=group_size)
        assert torch.equal(back[0], q)


def test_quantize_uses_the_full_grid(gen):
    w = torch.randn(N, K, generator=gen, dtype=torch.float32)
    q, _, _ = quantize(w, bits=4, group_size=64)
    assert int(q.min()) == 0 and int(q.max()) == 15
    q8, _, _ = quantize(w, bits=8, group_size=64, symmetric=True)
    assert int(q8.min()) == 1 and int(q8.max()) == 255


def test_quantize_hand_example():
    # one group, min -0.9, max 2: s = 2.9 / 15 = 0.19333, z = round(0.9 / s) = round(4.66) = 5,
    # q = round(w / s) + z = [-5, 0, 3, 10] + 5
    w = torch.tensor([[-0.9, 0.0, 0.6, 2.0]])
    q, s, z = quantize(w, bits=4, group_size=-1)
    assert torch.allclose(s.float(), torch.tensor([[2.9 / 15]]), rtol=1e-3) and z.tolist() == [[5.0]]
    assert q.tolist() == [[0, 5, 8, 15]]
    # symmetric: s = 2 / 7, q = round(w / s) + 8 = [-3, 0, 2, 7] + 8
    qs, ss, zs = quantize(w, bits=4, group_size=-1, symmetric=True)
    assert zs is None and qs.tolist() == [[5, 8, 10, 15]]
    assert torch.allclose(ss.float(), torch.tensor([[2 / 7]]), rtol=1e-3)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_degenerate_groups(bits, symmetric):
    w = torch.zeros(4, 64, dtype=torch.bfloat16)
    w[1] = 0.75          # constant positive group
    w[2] = -3.0          # constant negative group
    w[3, :32] = 1e-30    # tiny but non-zero: s must stay > 0
    q, s, z = quantize(w, bits=bits, group_size=32, symmetric=symmetric)
    assert bool(torch.isfinite(s).all()) and bool((s > 0).all())
    assert z is None or bool(torch.isfinite(z).all())
    w_hat = mg.reference.dequantize(q, s, z, group_size=32, bits=bits)
    assert not bool(torch.isnan(w_hat).any())
    assert torch.equal(w_hat[0], torch.zeros(64))  # all-zero row dequantizes to exact zeros
    assert torch.allclose(w_hat[1:3], w[1:3].float(), rtol=1e-2)


def test_quantize_fp16_tiny_weights_keep_the_bound(gen):
    w = (torch.randn(4, 64, generator=gen) * 1e-6).to(torch.float16)  # scales in fp16 subnormals
    q, s, z = quantize(w, bits=4, group_size=32)
    w_hat = mg.reference.dequantize(q, s, z, group_size=32)
    assert bool(((w.float() - w_hat).abs() <= s.float().repeat_interleave(32, 1) / 2 + 1e-12).all())


def test_quantize_all_positive_group_keeps_the_bound():
    """Ranges are widened to include 0, so a group in [10, 11] still satisfies |err| <= s/2."""
    w = torch.linspace(10, 11, 64).reshape(1, 64)
    q, s, z = quantize(w, bits=4, group_size=-1)
    assert z.item() == 0
    w_hat = mg.reference.dequantize(q, s, z, group_size=-1)
    assert bool(((w - w_hat).abs() <= s.float() / 2 + 1e-6).all())


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_quantize_is_bit_identical_across_devices(gen, device, dtype, symmetric):
    w = (torch.randn(64, 512, generator=gen) * 0.02).to(dtype)
    for bits in (4, 8):
        for group_size in (32, 128, -1):
            want = quantize(w, bits=bits, group_size=group_size, symmetric=symmetric)
            got = quantize(w.to(device), bits=bits, group_size=group_size, symmetric=symmetric)
            for a, b in zip(want, got):
                assert (a is None and b is None) or (b.device.type == device and torch.equal(a, b.cpu()))
