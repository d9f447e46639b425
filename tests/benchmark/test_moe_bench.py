"""`mixed-gemm bench --moe` on the CPU: the floor's bytes, the dense baselines against the float32
reference (so the GPU table compares with a correct layer), and the command's argument errors."""
from __future__ import annotations

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.benchmark.moe import (MOE_MODELS, MoeShape, dense_gathered, dense_grouped, dense_loop, expert_bytes,
                                      random_routing, routed_floor_s)


def test_floor_counts_each_routed_expert_once():
    shape = MoeShape(experts=8, top_k=2, hidden=256, inter=128)
    per = 3 * 256 * 128 // 2 + 2 * 2 * (3 * 256 * 128 // 128)
    assert expert_bytes(shape) == per
    ids = torch.tensor([[0, 3], [3, 0], [5, 3]])
    assert routed_floor_s(shape, ids, bandwidth=1e9) == pytest.approx(3 * per / 1e9)
    assert MOE_MODELS["qwen3-30b-a3b"] == MoeShape(128, 8, 2048, 768)


def _layer(seed=0, t=7):
    shape = MoeShape(experts=4, top_k=2, hidden=64, inter=32)
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(4, 64, 64, generator=gen) / 8
    w2 = torch.randn(4, 64, 32, generator=gen) / 6
    x = torch.randn(t, 64, generator=gen)
    weights, ids = random_routing(t, shape, gen, device="cpu")
    return x, w13, w2, weights, ids


def test_dense_loop_matches_reference():
    x, w13, w2, weights, ids = _layer()
    torch.testing.assert_close(dense_loop(x, w13, w2, weights, ids), mg.reference.moe(x, w13, w2, weights, ids),
                               rtol=1e-5, atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(7))


def test_dense_gathered_matches_reference():
    x, w13, w2, weights, ids = _layer(seed=2)
    torch.testing.assert_close(dense_gathered(x, w13, w2, weights, ids), mg.reference.moe(x, w13, w2, weights, ids),
                               rtol=1e-5, atol=1e-5)


def test_dense_grouped_matches_reference_where_torch_runs_it():
    """Skipped only where this torch lacks ``torch._grouped_mm`` or has no CPU kernel for it (the
    dispatcher's NotImplementedError naming the op and the CPU backend); any other error fails."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip(f"torch {torch.__version__} has no torch._grouped_mm")
    x, w13, w2, weights, ids = _layer(seed=1)
    try:
        got = dense_grouped(x, w13.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous(), weights, ids)
    except NotImplementedError as exc:
        if "_grouped_mm" not in str(exc) or "CPU" not in str(exc):
            raise
        pytest.skip(f"torch {torch.__version__} has no CPU kernel for torch._grouped_mm")
    torch.testing.assert_close(got, mg.reference.moe(x, w13, w2, weights, ids), rtol=1e-4, atol=1e-4)


def test_command_errors(capsys):
    from mixed_gemm.cli import main

    assert main(["bench", "--moe", "mixtral-8x7b,nope"]) == 2
    assert "--moe takes comma-separated presets from mixtral-8x7b" in capsys.readouterr().err
    assert main(["bench", "--moe", "mixtral-8x7b", "--tokens", "1,x"]) == 2
    if not torch.cuda.is_available():
        assert main(["bench", "--moe", "mixtral-8x7b"]) == 1
