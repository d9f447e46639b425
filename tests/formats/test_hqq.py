"""format="hqq": the hqq package's bit-packed W_q with per-group scale and float zero point <->
canonical (q, s, z); exact inverses, and bit-equal with the hqq package itself when installed."""
import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.formats import hqq as H

BITS = (1, 2, 3, 4, 8)


def _canonical(n, k, bits, g, seed, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (n, k), generator=gen, dtype=torch.uint8)
    s = (torch.rand(n, k // g, generator=gen) + 0.5).to(dtype)
    z = (torch.rand(n, k // g, generator=gen) * (2**bits - 1)).to(dtype)  # HQQ: float zero points
    return q, s, z


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("g", [32, 64, -1])
def test_round_trips_are_exact(bits, g):
    n, k = 40, 256
    gg = k if g == -1 else g
    q, s, z = _canonical(n, k, bits, gg, seed=bits * 100 + gg)
    w_q, scale, zero = mg.pack(q, s, z, format="hqq", bits=bits, group_size=g, zero_mode="float")
    per, storage = H.PACKING[bits]
    rows = n * k // gg
    assert w_q.dtype == storage and tuple(w_q.shape) == (-(-rows // per), gg)
    assert tuple(scale.shape) == (rows, 1) == tuple(zero.shape)
    q2, s2, z2 = mg.unpack(w_q, scale, zero, format="hqq", bits=bits, group_size=g, shape=(n, k))
    assert torch.equal(q2, q) and torch.equal(s2, s) and torch.equal(z2, z)
    assert all(torch.equal(a, b) for a, b in zip(mg.pack(q2, s2, z2, format="hqq", bits=bits, group_size=g),
                                                  (w_q, scale, zero)))
    # HQQ's bytes viewed as floats (its view_as_float option) read back the same
    if storage == torch.uint8 and gg % 2 == 0:
        q3, _, _ = mg.unpack(w_q.view(torch.float16), scale, zero, format="hqq", bits=bits, group_size=g, shape=(n, k))
        assert torch.equal(q3, q)


@pytest.mark.parametrize("bits", BITS)
def test_equal_to_the_hqq_package(bits):
    """hqq's own quantizer and packer (axis=1): our unpack gives its codes, scales and zeros, and
    our dequantization its dequantization; our pack gives its bytes back."""
    quantize = pytest.importorskip("hqq.core.quantize")
    n, k, g = 48, 256, 64
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(bits))
    w_q, meta = quantize.Quantizer.quantize(w, nbits=bits, group_size=g, axis=1, optimize=False, device="cpu",
                                            compute_dtype=torch.float32)
    q, s, z = mg.unpack(w_q, meta["scale"], meta["zero"], format="hqq", bits=bits, group_size=g,
                        shape=tuple(meta["shape"]))
    theirs = quantize.Quantizer.dequantize(w_q, meta)
    ours = mg.reference.dequantize(q, s, z, group_size=g, bits=bits, zero_mode="float")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    repacked = mg.pack(q, s, z, format="hqq", bits=bits, group_size=g)
    assert torch.equal(repacked[0], w_q)
    bitpack = pytest.importorskip("hqq.core.bitpack").BitPack
    rows = q.reshape(-1, g)
    pack_fn = getattr(bitpack, f"pack_{bits}bit_{'32' if bits == 3 else 'u8'}")
    assert torch.equal(pack_fn(rows.clone()), repacked[0])


def test_rules_name_the_argument():
    q, s, z = _canonical(8, 64, 4, 32, seed=1)
    w_q, scale, zero = mg.pack(q, s, z, format="hqq", bits=4, group_size=32)
    with pytest.raises(ValueError, match="shape: format 'hqq' needs the weight's"):
        mg.unpack(w_q, scale, zero, format="hqq", bits=4, group_size=32)
    with pytest.raises(ValueError, match="shape: only format 'hqq' takes shape"):
        mg.unpack(q, s, z, format="plain", bits=4, group_size=32, shape=(8, 64))
    with pytest.raises(ValueError, match="scales: format 'hqq' holds one value per group"):
        mg.unpack(w_q, scale[:-1], zero, format="hqq", bits=4, group_size=32, shape=(8, 64))
    with pytest.raises(ValueError, match="qweight: format 'hqq' 4-bit packs 2 rows"):
        mg.unpack(w_q[:-1], scale, zero, format="hqq", bits=4, group_size=32, shape=(8, 64))
    with pytest.raises(ValueError, match="z: format 'hqq' stores a zero point"):
        mg.pack(q, s, None, format="hqq", bits=4, group_size=32)
    with pytest.raises(ValueError, match="bits: expected one of \\(4, 8\\) for format 'awq'"):
        mg.pack(q % 4, s, z, format="awq", bits=2, group_size=32)
    with pytest.raises(ValueError, match="bits: expected one of \\(1, 2, 3, 4, 8\\) for format 'hqq', got 5"):
        mg.pack(q, s, z, format="hqq", bits=5, group_size=32)


def test_prepack_reads_hqq_4bit_and_refuses_widths_without_kernels():
    q, s, z = _canonical(64, 256, 4, 64, seed=3)
    w_q, scale, zero = mg.pack(q, s, z, format="hqq", bits=4, group_size=64)
    w = mg.prepack(w_q, scale, zero, format="hqq", bits=4, group_size=64, shape=(64, 256), layout="sm80")
    assert w.zero_mode == "float"
    q2, s2, z2 = w.unpack()
    assert torch.equal(q2, q) and torch.equal(s2, s) and torch.equal(z2, z)
    q3, s3, z3 = _canonical(64, 256, 3, 64, seed=4)
    packed = mg.pack(q3, s3, z3, format="hqq", bits=3, group_size=64)
    w3 = mg.prepack(*packed, format="hqq", bits=3, group_size=64, shape=(64, 256))  # the lowbit layout
    assert (w3.layout, w3.zero_mode) == ("lowbit", "float")
    q4, s4, z4 = w3.unpack()
    assert torch.equal(q4, q3) and torch.equal(s4, s3) and torch.allclose(z4.float(), z3.float(), atol=2e-2)
    with pytest.raises(ValueError, match="layout: .* are packed into 'lowbit'"):
        mg.prepack(*packed, format="hqq", bits=3, group_size=64, shape=(64, 256), layout="sm90a")


@pytest.mark.parametrize("bits", [2, 3])
def test_quantize_low_bit(bits):
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(bits))
    q, s, z = mg.quantize(w, bits=bits, group_size=32)
    assert int(q.max()) < 2**bits and int(q.max()) == 2**bits - 1
    back = mg.reference.dequantize(q, s, z, group_size=32, bits=bits)
    assert (back - w).abs().max() <= s.float().max() * 0.51 + 1e-6  # round to nearest: half a step
