"""1:2-sparse 7-bit weights: sparsify_quantize keeps one of each pair along K, the canonical form
reads exactly (zeros included) through the reference, format="sparse12" packs a byte per pair
(value | position << 7) with an exact inverse, and a dense pair is refused by name."""
import pytest
import torch

import mixed_gemm as mg


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("g", [32, 128, -1])
def test_sparsify_quantize_keeps_the_larger_of_each_pair(symmetric, g):
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(g + symmetric))
    q, s, z = mg.sparsify_quantize(w, group_size=g, symmetric=symmetric)
    gg = 256 if g == -1 else g
    dense = mg.reference.dequantize(q, s, z, group_size=g, bits=7)
    pairs, wp = dense.reshape(24, 128, 2), w.reshape(24, 128, 2)
    assert bool(((pairs[..., 0] == 0) | (pairs[..., 1] == 0)).all())  # exactly zero, one per pair at least
    keep_first = wp[..., 0].abs() >= wp[..., 1].abs()
    kept = torch.where(keep_first, wp[..., 0], wp[..., 1])
    got = torch.where(keep_first, pairs[..., 0], pairs[..., 1])
    step = s.float().repeat_interleave(gg, dim=1)[:, ::2]
    assert bool(((got - kept).abs() <= 0.51 * step + 1e-6).all())  # 7-bit round to nearest
    assert int(q.max()) < 128


@pytest.mark.parametrize("symmetric", [False, True])
def test_sparse12_pack_unpack_exact(symmetric):
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(7)).half()
    q, s, z = mg.sparsify_quantize(w, group_size=64, symmetric=symmetric)
    qw, sc, zs = mg.pack(q, s, z, format="sparse12", bits=7, group_size=64)
    assert qw.dtype == torch.uint8 and tuple(qw.shape) == (16, 64) and sc is s and zs is z
    q2, s2, z2 = mg.unpack(qw, sc, zs, format="sparse12", bits=7, group_size=64)
    assert torch.equal(q2, q) and torch.equal(s2, s) and (z2 is None) == symmetric
    assert torch.equal(mg.pack(q2, s2, z2, format="sparse12", bits=7, group_size=64)[0], qw)
    # the byte: the kept code in bits 0-6, bit 7 set when the first of the pair is kept
    zero = 64 if symmetric else int(z[0, 0])
    a, b = int(q[0, 0]), int(q[0, 1])
    byte = int(qw[0, 0])
    assert byte == ((a | 0x80) if (a != zero or b == zero) else b)


def test_dense_pairs_and_bad_widths_are_refused():
    q, s, z = mg.quantize(torch.randn(8, 64, generator=torch.Generator().manual_seed(1)), bits=7, group_size=32)
    with pytest.raises(ValueError, match="q: format 'sparse12' needs one zero code .* row \\d+, columns \\d+ and \\d+"):
        mg.pack(q, s, z, format="sparse12", bits=7, group_size=32)
    with pytest.raises(ValueError, match="bits: expected one of \\(7,\\) for format 'sparse12', got 4"):
        mg.pack(q % 16, s, z, format="sparse12", bits=4, group_size=32)
    with pytest.raises(ValueError, match="group_size: a pair must not straddle groups"):
        mg.sparsify_quantize(torch.randn(4, 66), group_size=33)
    sq = mg.sparsify_quantize(torch.randn(8, 64), group_size=32)
    packed = mg.pack(*sq, format="sparse12", bits=7, group_size=32)
    w = mg.prepack(*packed, format="sparse12", bits=7, group_size=32)  # the lowbit layout, one byte per pair
    assert w.layout == "lowbit" and torch.equal(w.unpack()[0], sq[0])
    for bits in (5, 6):  # no width of their own: named by the rule
        with pytest.raises(ValueError, match=rf"bits: expected one of \(1, 2, 3, 4, 7, 8\) .*got {bits}"):
            mg.prepack(sq[0] % 32, sq[1], sq[2] % 32, format="plain", bits=bits, group_size=32)
