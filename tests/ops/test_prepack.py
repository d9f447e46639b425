"""prepack / PackedWeight on the CPU: layout round trip through every checkpoint scheme, and rules."""
import pytest
import torch

import mixed_gemm as mg
from weights import SCHEMES, random_weight


@pytest.mark.parametrize("scheme,fmt,bits,sym", SCHEMES)
@pytest.mark.parametrize("n,k,group_size", [(256, 256, 128), (200, 96, 32), (64, 1536, -1), (136, 576, 64)])
def test_prepack_round_trip(scheme, fmt, bits, sym, n, k, group_size):
    (q, s, z), packed = random_weight(n, k, fmt=fmt, bits=bits, symmetric=sym, group_size=group_size,
                                      device="cpu", seed=n + k)
    w = mg.prepack(*packed, format=fmt, bits=bits, group_size=group_size)
    assert (w.n, w.k, w.bits) == (n, k, bits)
    assert w.group_size == (k if group_size == -1 else group_size)
    assert w.zero_mode == ("sym" if sym else "int")
    assert w.n_pad % 64 == 0 and w.k16 == (k + 15) // 16
    q2, s2, z2 = w.unpack()
    assert torch.equal(q2, q) and torch.equal(s2, s)
    assert (z2 is None) == sym and (sym or torch.equal(z2, z))
    assert "PackedWeight(n=" in repr(w)


def test_group_shift():
    _, packed = random_weight(128, 256, fmt="awq", bits=4, symmetric=False, group_size=64, device="cpu", seed=3)
    assert mg.prepack(*packed, format="awq", bits=4, group_size=64).group_shift == 6
    _, packed = random_weight(128, 256, fmt="awq", bits=4, symmetric=False, group_size=-1, device="cpu", seed=3)
    assert mg.prepack(*packed, format="awq", bits=4, group_size=-1).group_shift == 30


def test_prepack_rules():
    q = torch.randint(0, 16, (64, 48), dtype=torch.uint8)
    s = torch.rand(64, 3).half() + 0.1
    with pytest.raises(ValueError, match="group_size: must be -1 or a power of two >= 32"):
        mg.prepack(q, s, None, format="plain", bits=4, group_size=16)
    q = torch.randint(0, 16, (64, 36), dtype=torch.uint8)
    with pytest.raises(ValueError, match="K: must be a multiple of 8"):
        mg.prepack(q, torch.rand(64, 1).half(), None, format="plain", bits=4, group_size=-1)
    with pytest.raises(TypeError, match="dtype: must be torch.float16 or torch.bfloat16"):
        mg.prepack(q, torch.rand(64, 1).half(), None, format="plain", bits=4, group_size=-1, dtype=torch.float32)
    with pytest.raises(ValueError, match="zero_mode"):
        mg.prepack(q, torch.rand(64, 1).half(), None, format="plain", bits=4, group_size=-1, zero_mode="hqq")
    with pytest.raises(ValueError, match="zero_mode: format 'awq' stores integer zero points"):
        mg.prepack(torch.zeros(36, 8, dtype=torch.int32), torch.rand(1, 64).half(), None, format="awq",
                   bits=4, group_size=-1, zero_mode="float")
    q = torch.randint(0, 16, (64, 64), dtype=torch.uint8)
    uneven = torch.tensor([0] * 40 + [1] * 24, dtype=torch.int32)
    with pytest.raises(ValueError, match="g_idx: every group must have exactly group_size=32"):
        mg.prepack(q, torch.rand(64, 2).half(), None, format="plain", bits=4, group_size=32, g_idx=uneven)


def test_act_order_prepack_reorders_k():
    n, k, g = 128, 256, 64
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    s = torch.rand(n, k // g, generator=gen).half() + 0.1
    z = torch.randint(0, 16, (n, k // g), generator=gen).half()
    g_idx = (torch.arange(k) // g)[torch.randperm(k, generator=gen)].int()
    packed = mg.pack(q, s, z, format="gptq", bits=4, group_size=g, g_idx=g_idx)
    w = mg.prepack(*packed, format="gptq", bits=4, group_size=g, g_idx=g_idx)
    q2, s2, z2 = w.unpack()
    assert torch.equal(q2, q[:, w.perm]) and torch.equal(s2, s) and torch.equal(z2, z)
    assert torch.equal(g_idx[w.perm].long(), torch.arange(k) // g)  # groups contiguous after reorder


def test_zero_modes():
    q = torch.randint(0, 16, (64, 64), dtype=torch.uint8)
    s = torch.rand(64, 2).half() + 0.1
    assert mg.prepack(q, s, torch.full((64, 2), 3.0).half(), format="plain", group_size=32).zero_mode == "int"
    with pytest.raises(ValueError, match="zeros: expected integer values"):
        mg.prepack(q, s, torch.full((64, 2), 3.5).half(), format="plain", group_size=32)
    w = mg.prepack(q, s, torch.full((64, 2), 3.5).half(), format="plain", group_size=32, zero_mode="float")
    assert w.zero_mode == "float"
    w = mg.prepack(q, s, -torch.rand(64, 2).half(), format="plain", group_size=32, zero_mode="offset")
    assert w.zero_mode == "offset"
    assert mg.prepack(q, s, None, format="plain", group_size=32, dtype=torch.bfloat16).scales.dtype == torch.bfloat16


def test_matmul_rejects_cpu_input_before_launch():
    _, packed = random_weight(128, 256, fmt="awq", bits=4, symmetric=False, group_size=128, device="cpu", seed=9)
    w = mg.prepack(*packed, format="awq", bits=4, group_size=128)
    with pytest.raises(ValueError, match="x: must be a CUDA tensor"):
        mg.matmul(torch.randn(4, 256).half(), w)
    with pytest.raises(ValueError, match="scales/zeros"):
        mg.matmul(torch.randn(4, 256).half(), w, packed[1])


def test_prepack_layout_argument():
    q = torch.randint(0, 16, (64, 128), dtype=torch.uint8)
    s = torch.rand(64, 1) + 0.5
    w = mg.prepack(q, s, None, format="plain", bits=4, group_size=-1)
    assert w.layout == "sm80"  # "auto" on the CPU: the first family's layout
    assert mg.prepack(q, s, None, format="plain", bits=4, group_size=-1, layout="sm80").layout == "sm80"
    with pytest.raises(ValueError, match="layout: must be one of .* got 'hopper'"):
        mg.prepack(q, s, None, format="plain", bits=4, group_size=-1, layout="hopper")
    q2, s2, z2 = w.unpack()
    assert torch.equal(q2, q) and z2 is None


def test_prepack_two_layouts_on_the_cpu_and_quant_linear_round_trip():
    """``layout="sm80+sm90a"`` (what an H100 gets): the aux copy is the sm90a packing of the same
    weight, unpack reads the primary copy exactly, and QuantLinear carries both in its state dict."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randint(0, 16, (96, 256), generator=gen, dtype=torch.uint8)
    s = torch.rand(96, 2, generator=gen) + 0.5
    z = torch.randint(0, 16, (96, 2), generator=gen).float()
    w = mg.prepack(q, s, z, format="plain", bits=4, group_size=128, layout="sm80+sm90a")
    assert w.layouts == ("sm80", "sm90a") and w.parts["sm90a"].n_pad == 96
    b, sp, zp = w.aux
    assert torch.equal(mg.kernels.sm90a.layout.unpack_b(b, 4, 96, 256), q)
    assert torch.equal(sp[:, :96].t().float(), s.half().float())
    expect = ((8 - z) * s.half().float()).half()
    assert torch.equal(zp[:, :96].t(), expect)  # additive zero: (2^(bits-1) - z) s, rounded once
    q2, s2, z2 = w.unpack()
    assert torch.equal(q2, q) and torch.equal(z2.float(), z)
    with pytest.raises(ValueError, match="aux: layout 'sm80\\+sm90a' needs 3 aux tensors"):
        mg.ops.packed_view(w.b, w.scales, w.zeros, None, 96, 256, 4, 128, "int", "sm80+sm90a")
    from mixed_gemm.nn import QuantLinear

    lin = QuantLinear.from_packed(w)
    sd = lin.state_dict()
    assert {"aux_b", "aux_scales", "aux_zeros"} <= set(sd)
    other = QuantLinear(256, 96, bits=4, group_size=128, layout="sm80+sm90a")
    other.load_state_dict(sd)
    assert other.packed().parts["sm90a"].key[-4:] == (96, 256, 128, 96) and torch.equal(other.aux_b, b)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mode", ["sym", "int", "float", "offset"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_one_sm90a_copy_unpacks_and_fits_the_byte_budget(bits, mode, dtype):
    """``layout="sm90a"`` (what an H100 gets): one copy, within 1.05x of the packed codes plus
    scales and zeros; the stored additive zero is ``z'`` of the layout's formula, rounded once;
    unpack gives the codes and scales exactly, integer zeros exactly, float zeros and offsets
    within the rounding of ``z'`` (a bound per element, far below any zero or offset: a dropped
    offset or a scale from the wrong group fails); QuantLinear round-trips it through its state
    dict."""
    gen = torch.Generator().manual_seed(bits * 10 + len(mode))
    n, k, g = 96, 256, 64
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    s = (torch.rand(n, k // g, generator=gen) + 0.5) / 2**bits
    z = {"sym": None, "int": torch.randint(0, 2**bits, (n, k // g), generator=gen).float(),
         "float": torch.rand(n, k // g, generator=gen) * 2**bits,
         "offset": -torch.rand(n, k // g, generator=gen)}[mode]
    w = mg.prepack(q, s, z, format="plain", bits=bits, group_size=g, zero_mode="int" if mode == "sym" else mode,
                   dtype=dtype, layout="sm90a")
    assert w.layouts == ("sm90a",) and w.aux == () and w.zero_mode == mode and w.zeros is not None
    codes = n * k * bits // 8
    params = 2 * (k // g) * n * (1 if mode == "sym" else 2)
    assert w.nbytes <= 1.05 * (codes + params) + 2 * 16 * (k // g) * 2  # + the padding of N to 16
    # z' (kernels/sm90a/layout.py): w = (q - 2**(bits-1)) s + z', from the stored s and z, in float32.
    half = 2 ** (bits - 1)
    s16 = s.to(dtype).float()
    z16 = None if z is None else z.to(dtype).float()
    additive = (torch.zeros_like(s16) if mode == "sym" else half * s16 + z16 if mode == "offset"
                else (half - z16) * s16)
    assert torch.equal(w.zeros[:, :n].t(), additive.to(dtype))
    q2, s2, z2 = w.unpack()
    assert torch.equal(q2, q) and torch.equal(s2, s.to(dtype))
    if mode == "sym":
        assert z2 is None
    elif mode == "int":
        assert torch.equal(z2.float(), z)
    else:
        # The error of z' (half an ulp, eps |z'|) carried back through the recovery, plus z's own
        # rounding to dtype (eps |z|); for float zeros z' / s is (2**(bits-1) - z) (1 + eps).
        eps = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
        carried = additive.abs() if mode == "offset" else (half - z16).abs()
        bound = eps * (carried + z16.abs()) * 1.01 + 1e-6
        err = (z2.float() - z16).abs()
        assert (err <= bound).all(), f"worst {(err - bound).max().item():.3g} over the bound"
    from mixed_gemm.nn import QuantLinear

    lin = QuantLinear.from_packed(w)
    other = QuantLinear(k, n, bits=bits, group_size=g, zero_mode=mode, dtype=dtype, layout="sm90a")
    other.load_state_dict(lin.state_dict())
    assert torch.equal(other.packed().unpack()[0], q) and other.packed().layout == "sm90a"
