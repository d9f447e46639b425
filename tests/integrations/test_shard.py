"""Shard helpers on one process (mixed_gemm.integrations.shard): every format, both parallel
styles, the rules named up front, act-order regrouping, safetensors slices and per-rank slices.
The ranks' outputs are combined by hand here (concatenated / summed); tests/integrations/test_tp.py
runs the same over gloo with two processes."""
import re

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.integrations.shard import check_shardable, rank_shard, regroup, shard_checkpoint, shard_linear
from mixed_gemm.nn.parallel import ColumnParallelQuantLinear, RowParallelQuantLinear
from tolerance import assert_elementwise
from tp_cases import CASES, K, N, TP, make_layer, reference, shard_kwargs


def _combined(mods, x, style):
    if style == "column":
        return torch.cat([m(x) for m in mods], dim=-1)
    ks = x.shape[-1] // len(mods)
    for m in mods:
        m.reduce_results = False  # one process: sum the partial products by hand
    return sum(m(x[..., r * ks:(r + 1) * ks].contiguous()) for r, m in enumerate(mods))


@pytest.mark.parametrize("style", ("column", "row"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_shards_equal_unsharded(case, style):
    layer = make_layer(case)
    mods = [shard_linear(*layer.checkpoint, layer.bias, style=style, tp_rank=r, tp_size=TP, **shard_kwargs(case, layer))
            for r in range(TP)]
    kind = ColumnParallelQuantLinear if style == "column" else RowParallelQuantLinear
    assert all(isinstance(m, kind) for m in mods)
    if style == "column":
        assert [m.out_features for m in mods] == [N // TP] * TP and mods[1].full_out_features == N
    else:
        assert [m.in_features for m in mods] == [K // TP] * TP and mods[1].linear.bias is None  # bias once
    x = torch.randn(5, K)
    assert_elementwise(_combined(mods, x, style), reference(case, layer, x), K)


def test_column_shards_fuse_per_rank():
    """q_r | k_r | v_r of one rank concatenate (fuse_projections' concat) into the fused shard."""
    from mixed_gemm.integrations.fuse import concat

    case = CASES[0]
    layers = [make_layer(case, seed=i) for i in range(3)]
    x = torch.randn(2, K)
    for r in range(TP):
        parts = [shard_linear(*lay.checkpoint, lay.bias, style="column", tp_rank=r, tp_size=TP,
                              **shard_kwargs(case, lay)) for lay in layers]
        fused = concat(parts)
        assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))


@pytest.mark.parametrize("kw,msg", [
    (dict(n=131, style="column"), "N=131 into 2 equal shards"),
    (dict(n=136, style="column"), "N/tp_size=68 must be a multiple of 8 (format 'awq' packs 8 4-bit columns"),
    (dict(n=138, style="column", format="plain"), "N/tp_size=69 must be even"),
    (dict(k=264, style="row", format="plain"), "K/tp_size=132 must be a multiple of 8"),
    (dict(k=192, style="row"), "whole groups: K/tp_size=96 must be a multiple of group_size=64"),
    (dict(k=257, style="row"), "K=257 into 2 equal shards"),
    (dict(style="diagonal"), "style: expected one of ('column', 'row')"),
])
def test_rules_are_named(kw, msg):
    args = dict(n=N, k=K, style="row", tp_size=TP, format="awq", bits=4, group_size=64)
    args.update(kw)
    with pytest.raises(ValueError, match=re.escape(msg)):
        check_shardable(args.pop("n"), args.pop("k"), **args)


def test_rules_checked_before_reading():
    class Unreadable:  # a safetensors-like slice whose data must not be touched
        def __init__(self, shape):
            self.shape_ = shape

        def get_shape(self):
            return list(self.shape_)

        def __getitem__(self, index):
            raise AssertionError("read before the rules were checked")

    with pytest.raises(ValueError, match="tp_size: row-parallel shards K in whole groups"):
        shard_checkpoint(Unreadable((192, N // 8)), Unreadable((3, N)), Unreadable((3, N // 8)), style="row",
                         tp_rank=0, tp_size=2, format="awq", bits=4, group_size=64)
    with pytest.raises(ValueError, match="tp_rank, tp_size: expected tp_size >= 1 and 0 <= tp_rank < tp_size"):
        shard_checkpoint(Unreadable((K, N // 8)), Unreadable((4, N)), None, style="row", tp_rank=2, tp_size=2,
                         format="awq", bits=4, group_size=64)


def test_act_order_row_needs_integer_zeros():
    layer = make_layer(CASES[6])  # plain act-order
    with pytest.raises(ValueError, match="zero_mode: an act-order row-parallel shard is padded"):
        shard_checkpoint(layer.q, layer.s, layer.s * 0.5, style="row", tp_rank=0, tp_size=2, format="plain",
                         bits=4, group_size=128, g_idx=layer.g_idx, zero_mode="float")


def test_regroup_whole_groups_is_free_and_padding_is_zero():
    gen = torch.Generator().manual_seed(7)
    q = torch.randint(0, 16, (8, 128), generator=gen, dtype=torch.uint8)
    s = torch.rand(8, 4, generator=gen).half() + 0.5
    z = torch.randint(0, 16, (8, 4), generator=gen).half()
    whole = torch.arange(128) // 64 + 1  # groups 1 and 2 of 4, in order: nothing to do
    q2, s2, z2, g2, index = regroup(q, s, z, whole, group_size=64, bits=4)
    assert index is None and g2 == 64 and torch.equal(q2, q) and torch.equal(s2, s[:, 1:3])
    g_idx = torch.randint(0, 4, (128,), generator=gen)  # any membership: padded runs
    q2, s2, z2, g2, index = regroup(q, s, z, g_idx, group_size=64, bits=4)
    assert q2.shape[1] % g2 == 0 and 32 <= g2 <= 64 and index.shape == (q2.shape[1],)
    w2 = mg.reference.dequantize(q2, s2, z2, group_size=g2, bits=4)
    w = mg.reference.dequantize(q, s, z, group_size=64, bits=4, g_idx=g_idx)
    x = torch.randn(3, 128, generator=gen)
    torch.testing.assert_close(x[:, index] @ w2.T, x @ w.T, rtol=1e-6, atol=1e-5)
    counts = torch.bincount(index, minlength=128)  # every column read once, plus the padding's 0s
    assert torch.equal(counts[1:], torch.ones(127, dtype=torch.long))
    assert float(w2[:, torch.nonzero(index == 0).flatten()].abs().sum(1).min()) <= float(w[:, 0].abs().max())


def test_safetensors_slices_read_only_the_rank(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    case = CASES[3]  # gptq act-order
    layer = make_layer(case)
    qw, sc, qz = layer.checkpoint
    save_file({"qweight": qw, "scales": sc, "qzeros": qz, "g_idx": layer.g_idx}, str(tmp_path / "m.safetensors"))
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        sl = {k: f.get_slice(k) for k in f.keys()}
        for style in ("column", "row"):
            for r in range(TP):
                a = shard_checkpoint(sl["qweight"], sl["scales"], sl["qzeros"], style=style, tp_rank=r, tp_size=TP,
                                     **shard_kwargs(case, layer) | {"g_idx": sl["g_idx"]})
                b = shard_checkpoint(qw, sc, qz, style=style, tp_rank=r, tp_size=TP, **shard_kwargs(case, layer))
                for t, u in zip((a.qweight, a.scales, a.zeros, a.input_index), (b.qweight, b.scales, b.zeros,
                                                                                 b.input_index)):
                    assert (t is None and u is None) or torch.equal(t, u)


@pytest.mark.parametrize("case", [c for c in CASES if c.format in ("awq", "hqq")], ids=lambda c: c.name)
def test_from_rank_slices(case):
    """A checkpoint saved per rank (each rank's canonical slice packed by itself) gives the same
    layers as cutting the whole checkpoint."""
    layer = make_layer(case)
    x = torch.randn(4, K)
    for r in range(TP):
        n0, n1 = r * N // TP, (r + 1) * N // TP
        q, s, z = (None if t is None else t[n0:n1] for t in (layer.q, layer.s, layer.z))
        own = mg.pack(q, s, z, format=case.format, bits=case.bits, group_size=case.group_size)
        kw = shard_kwargs(case, layer) | {"shape": (n1 - n0, K) if case.format == "hqq" else None}
        sliced = shard_linear(*own, layer.bias[n0:n1], style="column", tp_rank=r, tp_size=TP, sliced=True, **kw)
        whole = shard_linear(*layer.checkpoint, layer.bias, style="column", tp_rank=r, tp_size=TP,
                             **shard_kwargs(case, layer))
        assert torch.equal(sliced(x), whole(x))
    with pytest.raises(ValueError, match="tp_size: column-parallel N/tp_size=68 must be a multiple of 8"):
        rank_shard(torch.zeros(K, 8, dtype=torch.int32), torch.ones(4, 68).half(), None, style="column", tp_rank=0,
                   tp_size=2, format="awq", bits=4, group_size=64)
