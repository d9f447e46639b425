"""Compiled generation on the GPU: transformers' static-cache ``generate`` (torch.compile with
CUDA-graph trees) and ``torch.compile(mode="reduce-overhead", fullgraph=True)`` run QuantLinear
models for every family and split-K mode, equal to the eager run, across M-bucket changes."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import mixed_gemm as mg  # noqa: E402
from mixed_gemm.integrations.transformers import quantize_model  # noqa: E402
from mixed_gemm.select import SCHEDULE_ENV  # noqa: E402

pytestmark = pytest.mark.gpu

# Every launch path: fused / parallel (second kernel) / serial split-K, no split, dequant + cuBLAS.
SCHEDULES = [None, "sm80:t16x64x128_w1x1x4_s4_kfused4", "sm80:t16x64x128_w1x1x4_s4_kparallel2",
             "sm80:t16x64x128_w1x1x4_s4_kserial2", "sm80:t64x128x64_w2x2x1_s4", "dequant_mm:dequant_mm"]
if torch.cuda.is_available() and mg.kernels.compute_capability(0) == (9, 0):
    # The Hopper family: ctypes-launched CUTLASS 3.x kernels, cached Params, split-K workspace memsets.
    SCHEDULES += ["sm90a:t128x64x64_coop_c1x1_s0_split2", "sm90a:t64x128x64_pp_c1x1_s0"]


def quantized_llama(layers=2, seed=0, schedule=None):
    # Forced sm80 schedules need that layout; otherwise the device's (the H100: sm90a, whose M <= 32
    # calls run the gemv family).
    layout = "sm80" if schedule and (schedule.startswith("sm80:") or schedule == "dequant_mm:dequant_mm") else "auto"
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).half().cuda().eval()
    quantize_model(model, bits=4, group_size=64, progress=False, layout=layout)
    return model


@pytest.fixture
def schedule(request, monkeypatch):
    """Force one schedule for every QuantLinear (None: profile/heuristics), fresh selection."""
    if request.param is None:
        monkeypatch.delenv(SCHEDULE_ENV, raising=False)
    else:
        monkeypatch.setenv(SCHEDULE_ENV, request.param)
    mg.select.clear_selection()
    torch._dynamo.reset()
    yield request.param
    mg.select.clear_selection()
    torch._dynamo.reset()


@pytest.mark.parametrize("schedule", SCHEDULES, indirect=True)
def test_reduce_overhead_fullgraph_matches_eager_across_m_buckets(schedule):
    model = quantized_llama(schedule=schedule)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for batch, seq in [(1, 1), (1, 1), (3, 5), (3, 5), (1, 1), (8, 9), (8, 9), (1, 1)]:  # buckets 1, 16, 128, 1
            ids = torch.randint(0, 512, (batch, seq), device="cuda")
            eager = model(ids).logits
            for _ in range(2):  # warm-up/record, then replay
                got = compiled(ids).logits.clone()
            torch.testing.assert_close(got, eager, rtol=0, atol=2e-2 * eager.abs().max().item())
            assert got.argmax(-1).eq(eager.argmax(-1)).float().mean() >= 0.95


@pytest.mark.parametrize("schedule", [None, "sm80:t16x64x128_w1x1x4_s4_kfused4"], indirect=True)
def test_static_cache_generate_matches_eager(schedule):
    model = quantized_llama(schedule=schedule)
    ids = torch.randint(0, 512, (2, 7), device="cuda")
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        eager = model.generate(ids, **kw)
        for _ in range(2):  # the second run replays the recorded graphs
            static = model.generate(ids, cache_implementation="static", **kw)
    assert static.shape == eager.shape
    # Compiled RMSNorm/rotary round differently from eager: greedy tokens may part once logits tie.
    assert static[:, :ids.shape[1] + 4].equal(eager[:, :ids.shape[1] + 4])
    assert static.eq(eager).float().mean() >= 0.9
    # A later eager model still runs: the graph trees were not left broken.
    fp16 = transformers.LlamaForCausalLM(model.config).half().cuda().eval()
    with torch.no_grad():
        fp16.generate(ids, cache_implementation="static", **kw)


def _check_fused_against_plain(model, ids, fuse, max_new_tokens, static_runs):
    """Logits and greedy tokens of ``model`` before ``fuse(model)``; after it: eager logits equal
    them, reduce-overhead fullgraph equals the fused eager run, static-cache generate (run
    ``static_runs`` times: the later ones replay the recorded graphs) keeps the first tokens."""
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        plain = model(ids).logits
        plain_tokens = model.generate(ids, **kw)
        fuse(model)
        fused = model(ids).logits
        torch.testing.assert_close(fused, plain, rtol=0, atol=1e-2 * plain.abs().max().item())
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            got = compiled(ids).logits.clone()
        torch.testing.assert_close(got, fused, rtol=0, atol=2e-2 * fused.abs().max().item())
        for _ in range(static_runs):
            static = model.generate(ids, cache_implementation="static", **kw)
    assert static[:, :ids.shape[1] + 4].equal(plain_tokens[:, :ids.shape[1] + 4])


def test_fused_projections_eager_compiled_and_generate():
    from mixed_gemm.integrations.fuse import fuse_projections

    mg.select.clear_selection()
    torch._dynamo.reset()
    model = quantized_llama(seed=4)
    ids = torch.randint(0, 512, (3, 6), device="cuda")

    def fuse(m):
        assert fuse_projections(m) == 2 * 2

    _check_fused_against_plain(model, ids, fuse, max_new_tokens=10, static_runs=2)
    torch._dynamo.reset()


@pytest.mark.parametrize("schedule", SCHEDULES, indirect=True)
def test_residual_fused_eager_compiled_and_generate(schedule):
    """Skip connections in the o_proj/down_proj epilogues (or the add after, per family): eager,
    reduce-overhead fullgraph (graph trees: no handed-over tensor outlives a forward), static-cache
    generate."""
    from mixed_gemm.integrations.fuse import fuse_projections

    model = quantized_llama(seed=6, schedule=schedule)
    ids = torch.randint(0, 512, (2, 5), device="cuda")
    _check_fused_against_plain(model, ids, lambda m: fuse_projections(m, residual=True), max_new_tokens=8,
                               static_runs=1)
