"""`mixed-gemm bench --moe` on the CPU: the roofs' bytes and FLOPs, the row and table built from
fake timings, the dense baselines against the float32 reference (so the GPU table compares with a
correct layer), and the command's argument errors."""
from __future__ import annotations

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.benchmark import moe as bench
from mixed_gemm.benchmark.moe import (MOE_MODELS, MoeShape, dense_gathered, dense_grouped, dense_loop, expert_bytes,
                                      random_routing)

MIXTRAL = MOE_MODELS["mixtral-8x7b"]


def _stacks(shape, seed=0):
    from mixed_gemm.formats import quantize
    from mixed_gemm.ops import prepack_experts

    gen = torch.Generator().manual_seed(seed)
    out = []
    for n, k, gate_up in ((2 * shape.inter, shape.hidden, True), (shape.hidden, shape.inter, False)):
        w = torch.randn(shape.experts, n, k, generator=gen)
        parts = [quantize(w[e]) for e in range(shape.experts)]
        out.append(prepack_experts(*(torch.stack([p[i] for p in parts]) for i in range(3)), gate_up=gate_up))
    return out


def test_int4_bytes_are_the_packed_codes_scales_and_zeros():
    shape = MoeShape(experts=2, top_k=2, hidden=256, inter=128)
    per = 3 * 256 * 128 // 2 + 2 * 2 * (3 * 256 * 128 // 128)
    assert expert_bytes(shape) == per == bench.packed_expert_bytes(*_stacks(shape))
    assert bench.touched_experts(torch.tensor([[0, 3], [3, 0], [5, 3]])) == 3
    assert bench.int4_floor_s(3, per, bandwidth=1e9) == pytest.approx(3 * per / 1e9)
    assert bench.int4_floor_s(3, per) == pytest.approx(3 * per / 3.0e12)  # the project's 3.0 TB/s
    assert MOE_MODELS["qwen3-30b-a3b"] == MoeShape(128, 8, 2048, 768)


def test_ideal_fp16_is_the_longer_of_bytes_and_flops():
    weights = 3 * 4096 * 14336
    # Mixtral decode: two touched experts' fp16 bytes at 3.0 TB/s bound it.
    assert bench.ideal_fp16_s(MIXTRAL, 1, 2) == pytest.approx(2 * weights * 2 / 3.0e12)
    # 4096 tokens: 8192 pairs' FLOPs at 740 TFLOP/s (3.9 ms) outlast the 8 experts' bytes (0.94 ms).
    assert bench.ideal_fp16_s(MIXTRAL, 4096, 8) == pytest.approx(2 * 4096 * 2 * weights / 740e12)
    assert bench.ideal_fp16_s(MIXTRAL, 4096, 8) > 8 * weights * 2 / 3.0e12


def _fake_timed(**extra):
    timed = {"mixed_gemm": (100e-6, "graph"), "dense loop": (700e-6, "eager"), "torch._grouped_mm": (900e-6, "eager")}
    timed.update(extra)
    return timed


def test_row_from_fake_timings():
    """The best fp16 path is picked among the fp16 paths only (never the int4 peer, here faster than
    all), and every ratio is the quotient of the right two times."""
    per = expert_bytes(MIXTRAL)
    row = bench.row_of("mixtral-8x7b", MIXTRAL, 1, 2, per, _fake_timed(humming=(50e-6, "graph")))
    ideal = bench.ideal_fp16_s(MIXTRAL, 1, 2)
    assert (row["dense"], row["dense_how"], row["mixed_gemm_how"]) == ("dense loop", "eager", "graph")
    assert row["speedup"] == pytest.approx(7.0)
    assert row["ideal_fp16_us"] == pytest.approx(ideal * 1e6) and row["vs_ideal_fp16"] == pytest.approx(ideal / 100e-6)
    assert row["floor_us"] == pytest.approx(2 * per / 3.0e12 * 1e6)
    assert row["share_of_floor"] == pytest.approx(2 * per / 3.0e12 / 100e-6)
    assert (row["humming_us"], row["humming_how"], row["vs_humming"]) == (pytest.approx(50.0), "graph", pytest.approx(0.5))
    assert row["fp16_paths_us"] == {"dense loop": pytest.approx(700.0), "torch._grouped_mm": pytest.approx(900.0)}
    assert row["touched_experts"] == 2 and row["tokens"] == 1


@pytest.mark.parametrize("compare", [False, True])
def test_table_lines_match_the_header(compare):
    per = expert_bytes(MIXTRAL)
    ran = bench.row_of("mixtral-8x7b", MIXTRAL, 16, 8, per, _fake_timed(humming=(50e-6, "graph")))
    skipped = bench.row_of("mixtral-8x7b", MIXTRAL, 16, 8, per, _fake_timed())
    skipped["humming_error"] = "humming: humming-kernels is not installed (pip install humming-kernels); skipped"
    head = bench.table_head(compare)
    widths = {line.count("|") for line in head + [bench.table_line(ran, compare), bench.table_line(skipped, compare)]}
    assert len(widths) == 1
    assert ("humming" in head[0]) == compare
    line = bench.table_line(ran, compare)
    assert "| 100.0 (g) | 700.0 (e) (dense loop) | 7.00x |" in line
    assert line.endswith("| 50.0 (g) | 0.50x |") if compare else "50.0" not in line
    if compare:
        assert bench.table_line(skipped, compare).endswith("| - | - |")
    assert bench.notes([ran, skipped, dict(skipped)]) == [skipped["humming_error"]]


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
        assert main(["bench", "--moe", "qwen3-30b-a3b", "--compare", "--breakdown", "--tokens", "1,4096"]) == 1


def test_layer_inputs_depend_on_the_token_count_alone():
    # A token count's activations and routing are the same whatever else one invocation measures
    # (the layer table and the stage breakdown of one run, two runs with other token lists).
    from types import SimpleNamespace

    shape = MoeShape(experts=16, top_k=4, hidden=64, inter=32)
    layer = SimpleNamespace(shape=shape, dense13=torch.zeros(1, dtype=torch.float16))
    x8, w8, ids8 = bench.layer_inputs(layer, 8, device="cpu")
    bench.layer_inputs(layer, 1, device="cpu")
    again = bench.layer_inputs(layer, 8, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip((x8, w8, ids8), again))
    assert x8.dtype == torch.float16 and x8.shape == (8, 64) and ids8.shape == (8, 4)
    assert torch.allclose(w8.sum(-1), torch.ones(8)) and int(ids8.max()) < 16
    assert not torch.equal(bench.layer_inputs(layer, 16, device="cpu")[2][:8], ids8)  # another count: another draw
