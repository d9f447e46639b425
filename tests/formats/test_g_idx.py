"""GPTQ act-order: g_idx round trip, expand_groups / make_g_idx, and the reference with g_idx."""
from __future__ import annotations

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.formats import expand_groups, make_g_idx, pack, unpack


def act_order_g_idx(gen, k, g):
    """GPTQ act-order index: groups of g over a random permutation of K (g_idx[perm[i]] = i // g)."""
    perm = torch.randperm(k, generator=gen)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = torch.arange(k, dtype=torch.int32) // g
    return g_idx


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2", "plain"])
def test_g_idx_round_trip(gen, canonical, fmt, bits):
    n, k, g = 32, 256, 64
    q, s, z = canonical(n, k, bits=bits, group_size=g)
    g_idx = act_order_g_idx(gen, k, g)
    assert not torch.equal(g_idx, make_g_idx(k, g))
    packed = pack(q, s, z, format=fmt, bits=bits, group_size=g, g_idx=g_idx)
    q2, s2, z2 = unpack(*packed, format=fmt, bits=bits, group_size=g, g_idx=g_idx)
    # q stays in the original K order; s, z stay indexed by group
    assert torch.equal(q2, q) and torch.equal(s2, s) and torch.equal(z2, z)
    assert s2.shape == (n, k // g)


def test_g_idx_dequant_matches_per_element_groups(gen, canonical):
    n, k, g = 8, 128, 32
    q, s, z = canonical(n, k, group_size=g)
    g_idx = act_order_g_idx(gen, k, g)
    w = mg.reference.dequantize(q, s, z, group_size=g, g_idx=g_idx)
    for kk in range(k):  # column k uses group g_idx[k]
        grp = int(g_idx[kk])
        assert torch.equal(w[:, kk], (q[:, kk].float() - z[:, grp].float()) * s[:, grp].float())


def test_trivial_g_idx_is_the_same_as_none(canonical):
    q, s, z = canonical(8, 128, group_size=32)
    a = mg.reference.dequantize(q, s, z, group_size=32, g_idx=make_g_idx(128, 32))
    assert torch.equal(a, mg.reference.dequantize(q, s, z, group_size=32))


def test_make_g_idx():
    assert make_g_idx(8, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert make_g_idx(6, -1).tolist() == [0] * 6
    assert make_g_idx(8, 2).dtype == torch.int32
    assert make_g_idx(10, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]  # a shorter last group
    with pytest.raises(ValueError, match="k: expected a positive int"):
        make_g_idx(0, 4)


def test_expand_groups(gen):
    t = torch.rand(3, 4, generator=gen).half()
    g_idx = torch.tensor([3, 0, 0, 2, 1], dtype=torch.int64)
    out = expand_groups(t, g_idx)
    assert out.shape == (3, 5) and out.dtype == t.dtype
    assert torch.equal(out, torch.stack([t[:, i] for i in g_idx.tolist()], dim=1))
    with pytest.raises(ValueError, match="g_idx: expected values in \\[0, 4\\)"):
        expand_groups(t, torch.tensor([4]))
    with pytest.raises(TypeError, match="g_idx: expected dtype"):
        expand_groups(t, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="t: expected a 2-D tensor"):
        expand_groups(t[0], g_idx)
