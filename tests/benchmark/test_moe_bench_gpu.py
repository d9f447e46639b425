"""`mixed-gemm bench --moe` on a GPU, on a small layer: every column of a row is filled (humming's or
its note), humming's MoE path built from mg's codes computes mg.moe's layer, and the breakdown
accounts every kernel of a call to a stage. Run: ``python -m pytest -m gpu`` here."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SMALL = dict(experts=8, top_k=2, hidden=512, inter=256)


@pytest.fixture(scope="module")
def layer():
    from mixed_gemm.benchmark.moe import MoeShape, build_layer

    return build_layer("small", torch.float16, shape=MoeShape(**SMALL))


def test_rows_fill_every_column_or_a_note(layer):
    from mixed_gemm.benchmark import moe as bench

    rows = bench.bench_moe(layer, [1, 64], reps=3, compare=True, log=lambda line: None)
    assert [r["tokens"] for r in rows] == [1, 64]
    for r in rows:
        assert r["mixed_gemm_us"] > 0 and r["dense_us"] > 0 and r["ideal_fp16_us"] > 0 and r["floor_us"] > 0
        assert 1 <= r["touched_experts"] <= SMALL["experts"]
        assert ("humming_us" in r) or ("humming_error" in r)
        if "humming_rel_err" in r:
            assert r["humming_rel_err"] <= 0.02, r.get("humming_error")
        assert bench.table_line(r, True).count("|") == bench.table_head(True)[0].count("|")


@pytest.mark.parametrize("tokens", [1, 16, 200])
def test_humming_moe_computes_mgs_layer(layer, tokens):
    from mixed_gemm.benchmark import moe_peer
    from mixed_gemm.benchmark.moe import random_routing
    from mixed_gemm.benchmark.peers import rel_err
    from mixed_gemm.ops import moe

    peer, note = moe_peer.prepare(layer.w13, layer.w2, SMALL["top_k"], [tokens])
    if peer is None:
        pytest.skip(note)
    gen = torch.Generator().manual_seed(tokens)
    x = (torch.randn(tokens, SMALL["hidden"], generator=gen) / 4).to("cuda", torch.float16)
    weights, ids = random_routing(tokens, layer.shape, gen)
    assert rel_err(peer(x, weights, ids), moe(x, layer.w13, layer.w2, weights, ids)) <= 0.02


def test_breakdown_accounts_every_kernel(layer):
    from mixed_gemm.benchmark import moe_breakdown as bd

    rows = bd.breakdown(layer, [1, 256], replays=3)
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["stage_kernels"]["gate|up GEMM"] >= 1 and r["stage_kernels"]["down GEMM"] >= 1, r["names"]
        assert r["sum_us"] == pytest.approx(sum(r["stage_us"].values()))
        assert r["sum_us"] > 0 and len(r["replay_sum_us"]) == 3
        ratios = [total / span for total, span in zip(r["replay_sum_us"], r["replay_span_us"])]
        # Serialized kernels: a replay's sum fits its span (each kernel's timestamps carry a few tens
        # of ns of jitter, so a dozen kernels may overshoot by a little). The best of the replays:
        # beside 13 other test workers on the GPU one replay overshot by more (a kernel counted
        # twice would overshoot in all of them).
        assert all(t > 0 for t in r["replay_sum_us"]) and min(ratios) <= 1.03, ratios
    lines = bd.table(rows)
    assert sum(line.startswith("| 1 |") or line.startswith("| 256 |") for line in lines) == 2
