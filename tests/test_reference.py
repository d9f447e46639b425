"""mixed_gemm.reference against naive Python loops on tiny shapes, plus its argument checks."""
from __future__ import annotations

import re
import zlib

import pytest
import torch

from mixed_gemm import reference as ref


@pytest.fixture
def gen(request):
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def tiny(gen, *, n=3, k=64, g=16, bits=4, sdtype=torch.float16, zmode="int-int"):
    ng = k // g
    q = torch.randint(0, 1 << bits, (n, k), generator=gen).to(torch.uint8)
    s = (torch.rand(n, ng, generator=gen) + 0.1).to(sdtype)
    if zmode == "int-int":
        z = torch.randint(0, 1 << bits, (n, ng), generator=gen).to(sdtype)
    elif zmode == "none":
        z = None
    else:  # float zeros / offsets
        z = (torch.randn(n, ng, generator=gen) * 3).to(sdtype)
    return q, s, z


def naive_dequant(q, s, z, *, g, bits, g_idx=None, zero_mode="int"):
    n, k = q.shape
    out = torch.empty(n, k, dtype=torch.float32)
    for i in range(n):
        for j in range(k):
            grp = int(g_idx[j]) if g_idx is not None else j // g
            sc = float(s[i, grp])
            if zero_mode == "offset":
                out[i, j] = torch.tensor(float(q[i, j]) * sc, dtype=torch.float32) + float(z[i, grp])
            else:
                zz = float(1 << (bits - 1)) if z is None else float(z[i, grp])
                out[i, j] = torch.tensor(float(q[i, j]) - zz, dtype=torch.float32) * torch.tensor(sc)
    return out


@pytest.mark.parametrize("zmode", ["int-int", "none", "float"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("sdtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dequantize_matches_loop(gen, sdtype, bits, zmode):
    q, s, z = tiny(gen, bits=bits, sdtype=sdtype, zmode=zmode)
    got = ref.dequantize(q, s, z, group_size=16, bits=bits)
    assert got.dtype == torch.float32 and got.shape == (3, 64)
    torch.testing.assert_close(got, naive_dequant(q, s, z, g=16, bits=bits), rtol=1e-6, atol=1e-6)


def test_dequantize_offset_mode_matches_loop(gen):
    q, s, m = tiny(gen, zmode="float", sdtype=torch.bfloat16)
    got = ref.dequantize(q, s, m, group_size=16, zero_mode="offset")
    torch.testing.assert_close(got, naive_dequant(q, s, m, g=16, bits=4, zero_mode="offset"),
                               rtol=1e-6, atol=1e-6)


def test_offset_mode_equals_int_mode_with_m_equal_minus_z_s(gen):
    q, s, z = tiny(gen, sdtype=torch.float32)
    a = ref.dequantize(q, s, z, group_size=16)
    b = ref.dequantize(q, s, -z * s, group_size=16, zero_mode="offset")
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)


def test_dequantize_group_size_minus_one_and_g_idx(gen):
    q, s, z = tiny(gen, g=64)
    torch.testing.assert_close(ref.dequantize(q, s, z, group_size=-1), naive_dequant(q, s, z, g=64, bits=4))
    q, s, z = tiny(gen, g=16)
    g_idx = torch.randint(0, 4, (64,), generator=gen, dtype=torch.int32)
    got = ref.dequantize(q, s, z, group_size=16, g_idx=g_idx)
    torch.testing.assert_close(got, naive_dequant(q, s, z, g=16, bits=4, g_idx=g_idx))


def test_dequantize_symmetric_hand_values():
    q = torch.tensor([[0, 8, 15]], dtype=torch.uint8)
    s = torch.tensor([[0.5]], dtype=torch.float16)
    assert ref.dequantize(q, s, None, group_size=-1).tolist() == [[-4.0, 0.0, 3.5]]
    q8 = torch.tensor([[0, 128, 255]], dtype=torch.uint8)
    assert ref.dequantize(q8, s, None, group_size=-1, bits=8).tolist() == [[-64.0, 0.0, 63.5]]


@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_matches_loop(gen, with_bias):
    q, s, z = tiny(gen)
    x = torch.randn(2, 5, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(3, generator=gen).half() if with_bias else None
    got = ref.matmul(x, q, s, z, group_size=16, bias=bias)
    assert got.dtype == torch.float32 and got.shape == (2, 5, 3)
    w = naive_dequant(q, s, z, g=16, bits=4)
    xf = x.float()
    expected = torch.empty(2, 5, 3)
    for b in range(2):
        for m in range(5):
            for n in range(3):
                acc = sum(float(xf[b, m, kk]) * float(w[n, kk]) for kk in range(64))
                expected[b, m, n] = acc + (float(bias[n]) if with_bias else 0.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_matmul_1d_x_and_g_idx_and_offset(gen):
    q, s, z = tiny(gen, zmode="float", sdtype=torch.float32)
    g_idx = torch.randint(0, 4, (64,), generator=gen)
    x = torch.randn(64, generator=gen)
    got = ref.matmul(x, q, s, z, group_size=16, g_idx=g_idx, zero_mode="offset")
    w = ref.dequantize(q, s, z, group_size=16, g_idx=g_idx, zero_mode="offset")
    assert got.shape == (3,)
    torch.testing.assert_close(got, w @ x)


def _q(n=3, k=64):
    return torch.zeros(n, k, dtype=torch.uint8)


def _s(n=3, ng=4, dtype=torch.float16):
    return torch.ones(n, ng, dtype=dtype)


ERRORS = {
    "q-type": (lambda: ref.dequantize([[0]], _s(), None, group_size=16), TypeError, "q: expected a torch.Tensor"),
    "q-float": (lambda: ref.dequantize(_q().float(), _s(), None, group_size=16), TypeError, "q: expected an integer tensor"),
    "q-ndim": (lambda: ref.dequantize(_q()[0], _s(), None, group_size=16), ValueError, "q: expected a 2-D"),
    "q-empty": (lambda: ref.dequantize(_q(k=0), _s(ng=1), None, group_size=-1), ValueError,
                "q: expected a non-empty"),
    "q-range": (lambda: ref.dequantize(_q() + 16, _s(), None, group_size=16), ValueError,
                "q: expected values in [0, 16) for bits=4"),
    "s-int": (lambda: ref.dequantize(_q(), _s().int(), None, group_size=16), TypeError, "s: expected a floating-point tensor"),
    "s-shape": (lambda: ref.dequantize(_q(), _s(ng=3), None, group_size=16), ValueError,
                "s: expected shape (3, 4)"),
    "z-shape": (lambda: ref.dequantize(_q(), _s(), _s(ng=2), group_size=16), ValueError,
                "z: expected shape (3, 4) (same as s)"),
    "z-bool": (lambda: ref.dequantize(_q(), _s(), _s().bool(), group_size=16), TypeError, "z: expected a real-valued tensor"),
    "bits": (lambda: ref.dequantize(_q(), _s(), None, group_size=16, bits=9), ValueError, "bits: expected an int"),
    "group-size": (lambda: ref.dequantize(_q(), _s(), None, group_size=0), ValueError, "group_size: expected -1"),
    "group-count": (lambda: ref.dequantize(_q(), _s(), None, group_size=24), ValueError,
                    "(N, ceil(K / group_size))"),
    "zero-mode": (lambda: ref.dequantize(_q(), _s(), None, group_size=16, zero_mode="hqq"), ValueError,
                  "zero_mode: expected one of"),
    "offset-needs-z": (lambda: ref.dequantize(_q(), _s(), None, group_size=16, zero_mode="offset"), ValueError,
                       "z: zero_mode='offset' needs"),
    "device": (lambda: ref.dequantize(_q(), _s().to("meta"), None, group_size=16), ValueError,
               "s: expected device cpu (same as q)"),
    "g_idx-shape": (lambda: ref.dequantize(_q(), _s(), None, group_size=16, g_idx=torch.zeros(63, dtype=torch.int32)),
                    ValueError, "g_idx: expected shape (64,)"),
    "g_idx-range": (lambda: ref.dequantize(_q(), _s(), None, group_size=16, g_idx=torch.full((64,), 4)),
                    ValueError, "g_idx: expected values in [0, 4)"),
    "g_idx-float": (lambda: ref.dequantize(_q(), _s(), None, group_size=16, g_idx=torch.zeros(64)),
                    TypeError, "g_idx: expected an integer tensor"),
    "x-K": (lambda: ref.matmul(torch.ones(2, 32), _q(), _s(), None, group_size=16), ValueError,
            "x: expected shape (..., 64)"),
    "x-int": (lambda: ref.matmul(torch.ones(2, 64, dtype=torch.int32), _q(), _s(), None, group_size=16),
              TypeError, "x: expected a floating-point tensor"),
    "x-device": (lambda: ref.matmul(torch.ones(2, 64, device="meta"), _q(), _s(), None, group_size=16),
                 ValueError, "x: expected device cpu"),
    "bias-shape": (lambda: ref.matmul(torch.ones(2, 64), _q(), _s(), None, group_size=16, bias=torch.ones(4)),
                   ValueError, "bias: expected shape (3,)"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_reference_errors(case):
    fn, exc, msg = ERRORS[case]
    with pytest.raises(exc, match=re.escape(msg)):
        fn()


# --- mixture of experts ---------------------------------------------------------------------------


def _moe_inputs(gen, t=5, h=16, inter=8, e=4, top_k=2):
    x = torch.randn(t, h, generator=gen).half()
    w13 = torch.randn(e, 2 * inter, h, generator=gen) / h**0.5
    w2 = torch.randn(e, h, inter, generator=gen) / inter**0.5
    ids = torch.rand(t, e, generator=gen).topk(top_k, dim=1).indices
    weights = torch.rand(t, top_k, generator=gen).softmax(dim=1)
    return x, w13, w2, weights, ids


def test_moe_matches_a_token_loop(gen):
    x, w13, w2, weights, ids = _moe_inputs(gen)
    want = torch.zeros(x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w13[e] @ x[t].float()).chunk(2)
            want[t] += weights[t, j] * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    got = ref.moe(x, w13, w2, weights, ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_moe_edge_cases(gen):
    x, w13, w2, weights, ids = _moe_inputs(gen)
    # every pair on one expert equals that expert's dense MLP times the summed weights
    one = torch.full_like(ids, 2)
    dense = ref.moe(x, w13[2:3], w2[2:3], weights, torch.zeros_like(ids))
    torch.testing.assert_close(ref.moe(x, w13, w2, weights, one), dense)
    assert ref.moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, x.shape[1])  # no tokens
    # -1 (an expert on another rank): the pair adds nothing, its weight is never read
    away = torch.zeros_like(ids, dtype=torch.bool)
    away[0], away[2, 1] = True, True
    got = ref.moe(x, w13, w2, weights.masked_fill(away, float("nan")), ids.masked_fill(away, -1))
    torch.testing.assert_close(got, ref.moe(x, w13, w2, weights.masked_fill(away, 0), ids), rtol=1e-5, atol=1e-6)
    assert (got[0] == 0).all()


@pytest.mark.parametrize("change, exc, msg", [
    (dict(ids=torch.tensor([[0, 4]] * 5)), ValueError, r"topk_ids: expert ids must lie in \[0, 4\) \(E\) or be -1 .*got 4"),
    (dict(ids=torch.tensor([[0, -2]] * 5)), ValueError, "got -2"),
    (dict(w2=torch.zeros(4, 16, 9)), ValueError, r"w2: expected shape \(4, 16, 8\) \(E, H, I\)"),
    (dict(w13=torch.zeros(4, 15, 16)), ValueError, "w13: expected .E, 2I, H. with an even"),
    (dict(w13=torch.zeros(4, 16, 17)), ValueError, r"w13: expected shape \(E, 2I, 16\)"),
    (dict(weights=torch.rand(5, 3)), ValueError, "topk_ids, topk_weights: expected equal"),
    (dict(ids=torch.rand(5, 2)), TypeError, "topk_ids: expected an integer tensor"),
])
def test_moe_bad_arguments_name_the_rule(gen, change, exc, msg):
    x, w13, w2, weights, ids = _moe_inputs(gen)
    args = dict(w13=w13, w2=w2, weights=weights, ids=ids)
    args.update(change)
    with pytest.raises(exc, match=msg):
        ref.moe(x, args["w13"], args["w2"], args["weights"], args["ids"])
