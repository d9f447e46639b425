"""The humming MoE peer of `mixed-gemm bench --moe --compare` on the CPU: the routing lists its
indexed GEMM reads, the layer composed from that GEMM (a float32 stand-in that reads the lists the
way humming's scheduler does) against the float32 reference, and the peer skipped with a note when
humming is missing, refuses the experts, fails or disagrees with mg.moe."""
from __future__ import annotations

import sys
import types

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.benchmark import moe_peer


def _ids(tokens, experts, top_k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(tokens, experts, generator=gen).topk(top_k, dim=-1).indices


@pytest.mark.parametrize("tokens,experts,top_k,block", [(1, 8, 2, 16), (7, 4, 2, 4), (33, 16, 6, 8), (64, 128, 8, 64)])
def test_align_blocks_lists_every_pair_once_under_its_expert(tokens, experts, top_k, block):
    ids = _ids(tokens, experts, top_k)
    sorted_ids, expert_ids, padded = moe_peer.align_blocks(ids, experts, block)
    pairs = tokens * top_k
    assert sorted_ids.dtype == expert_ids.dtype == padded.dtype == torch.int32
    assert sorted_ids.numel() % block == 0 and expert_ids.numel() == sorted_ids.numel() // block
    counts = torch.bincount(ids.reshape(-1), minlength=experts)
    assert padded.tolist() == [int(((counts + block - 1) // block * block).sum())]
    listed = sorted_ids[:padded.item()]
    real = listed[listed < pairs]
    assert sorted(real.tolist()) == list(range(pairs))  # each pair once
    assert (sorted_ids[padded.item():] == pairs).all()  # past the lists: padding only
    flat = ids.reshape(-1)
    for b in range(padded.item() // block):
        rows = listed[b * block:(b + 1) * block]
        rows = rows[rows < pairs].long()
        assert (flat[rows] == expert_ids[b]).all()  # a block's rows are its expert's
        assert torch.equal(rows, rows.sort().values)  # in pair order
    assert (expert_ids >= 0).all() and (expert_ids < experts).all()


class _Indexed:
    """humming's indexed GEMM in float32, as its kernel reads the lists (scheduler.cuh): block ``b``
    of ``sorted_ids`` holds rows of expert ``expert_ids[b]``, up to ``num_tokens_padded`` rows;
    a listed id below ``rows * top_k`` reads input row ``id // top_k`` and writes output row ``id``."""

    def __init__(self, w, block):
        self.w, self.block = w, block

    def __call__(self, x, *, sorted_ids, expert_ids, num_tokens_padded, top_k, compute_config, tuning_config):
        assert compute_config == {"gemm_type": "indexed"} and tuning_config == "tuning"
        out = torch.full((x.shape[0] * top_k, self.w.shape[1]), float("nan"))
        for b in range(int(num_tokens_padded.item()) // self.block):
            for i in sorted_ids[b * self.block:(b + 1) * self.block].tolist():
                if i < out.shape[0]:
                    out[i] = self.w[expert_ids[b]] @ x[i // top_k]
        return out


@pytest.mark.parametrize("blocks", [(4, 4), (4, 8)])
def test_the_composed_layer_matches_the_reference(blocks):
    experts, top_k, hidden, inter, tokens = 6, 3, 32, 16, 9
    gen = torch.Generator().manual_seed(1)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / 6  # gate rows, then up rows
    w2 = torch.randn(experts, hidden, inter, generator=gen) / 4
    x = torch.randn(tokens, hidden, generator=gen)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), -1)
    ids = _ids(tokens, experts, top_k, seed=3)

    def silu_mul(h):
        return torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]

    peer = moe_peer.HummingMoe((_Indexed(w13, blocks[0]), _Indexed(w2, blocks[1])), ("tuning", "tuning"),
                               {tokens * top_k: blocks}, silu_mul, experts)
    torch.testing.assert_close(peer(x, weights, ids), mg.reference.moe(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)


def test_tuning_intervals_cover_every_row_count():
    got = moe_peer.tuning_intervals([(128, "b"), (8, "a"), (32768, "c")])
    assert got == [[0, 8, "a"], [8, 128, "b"], [128, 1 << 30, "c"]]


def _experts(zero_mode="int"):
    return types.SimpleNamespace(bits=4, group_size=128, zero_mode=zero_mode)


def test_missing_humming_is_skipped_with_a_note(monkeypatch):
    for name in ("humming", "humming.layer"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError

    def never(*args):
        raise AssertionError("built a peer that should have been skipped")

    monkeypatch.setattr(moe_peer, "build", never)
    assert moe_peer.prepare(_experts(), _experts(), 2, [1]) == (
        None, "humming: humming-kernels is not installed (pip install humming-kernels); skipped")
    assert moe_peer.prepare(_experts("sym"), _experts(), 2, [1]) == (
        None, "humming: sym zeros: the MoE peer packs integer zero points")


def test_a_refused_build_is_a_note(monkeypatch):
    monkeypatch.setattr(moe_peer, "unavailable", lambda w13: None)

    def refuse(*args):
        raise AssertionError("no tile for N=1536\nsecond line")

    monkeypatch.setattr(moe_peer, "build", refuse)
    assert moe_peer.prepare(_experts(), _experts(), 8, [1]) == (None, "humming: AssertionError: no tile for N=1536")


def test_check_runs_the_peer_once_and_compares_with_mg():
    ref = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    ids = torch.zeros(4, 2, dtype=torch.long)
    assert moe_peer.check(lambda x, w, i: ref.clone(), None, None, ids, ref) == (True, {"humming_rel_err": 0.0})
    ran, notes = moe_peer.check(lambda x, w, i: ref * 1.05, None, None, ids, ref)
    assert ran and notes["humming_error"] == "humming: output differs from mg.moe's by 5.0% (relative) at 4 tokens"

    def fails(x, w, i):
        raise RuntimeError("launch failed")

    assert moe_peer.check(fails, None, None, ids, ref) == (
        False, {"humming_error": "humming: failed at 4 tokens: RuntimeError: launch failed"})
