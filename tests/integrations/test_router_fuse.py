"""transformers' routers replaced by TopKRouter (integrations.router): which are replaced, and
that the replacement computes what each router computes (CPU: torch ops; GPU: the kernel, whole
tiny models against their unfused selves)."""
import pytest
import torch

from mixed_gemm.integrations.router import fuse_routers, fused_router
from mixed_gemm.nn import TopKRouter

transformers = pytest.importorskip("transformers")


def qwen3(norm_topk_prob=True):
    cfg = transformers.Qwen3MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      num_experts=16, num_experts_per_tok=4, vocab_size=96,
                                      norm_topk_prob=norm_topk_prob)
    return transformers.Qwen3MoeForCausalLM(cfg)


def mixtral():
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2, vocab_size=96)
    return transformers.MixtralForCausalLM(cfg)


def deepseek(topk_method="greedy"):
    cfg = transformers.DeepseekV2Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                        n_routed_experts=16, num_experts_per_tok=3, n_shared_experts=1,
                                        first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=None,
                                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, vocab_size=96,
                                        topk_method=topk_method, n_group=4, topk_group=2, routed_scaling_factor=1.5)
    return transformers.DeepseekV2ForCausalLM(cfg)


def routers(model):
    return [m.gate for m in model.modules() if isinstance(getattr(m, "gate", None), torch.nn.Module)
            and not isinstance(m.gate, TopKRouter) and type(m.gate).__name__.endswith(("TopKRouter", "TopkRouter"))]


def randomize(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return model.eval()


@pytest.mark.parametrize("build, renorm", [(qwen3, True), (lambda: qwen3(norm_topk_prob=False), False),
                                           (mixtral, True), (deepseek, False)])
def test_fused_router_matches_the_original_cpu(build, renorm):
    model = randomize(build())
    originals = routers(model)
    assert originals and fuse_routers(model) == len(originals)
    assert not routers(model)
    for original in originals:
        fused = fused_router(original)
        assert isinstance(fused, TopKRouter) and fused.renormalize == renorm and fused.weight is original.weight
        x = torch.randn(2, 3, original.weight.shape[1])
        with torch.no_grad():
            want, got = original(x), fused(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2].sort(-1).values, want[2].sort(-1).values)
        order = got[2].argsort(-1)
        want_scores = want[1].gather(-1, want[2].argsort(-1))
        torch.testing.assert_close(got[1].gather(-1, order), want_scores, rtol=1e-6, atol=0)
        assert got[1].dtype == want[1].dtype and got[2].dtype == torch.int64


def test_unsupported_routers_stay():
    model = randomize(deepseek("group_limited_greedy"))
    assert fuse_routers(model) == 0 and routers(model)
    model = randomize(qwen3())
    gate, count = routers(model)[0], len(routers(model))
    gate.register_forward_hook(lambda *a: None)
    assert fused_router(gate) is None and fuse_routers(model) == count - 1 and routers(model) == [gate]
    assert fused_router(torch.nn.Linear(4, 4)) is None


def test_counters_are_not_checkpointed():
    model = randomize(qwen3())
    fuse_routers(model)
    assert not any(k.endswith("counters") for k in model.state_dict())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("build", [qwen3, mixtral, deepseek])
@pytest.mark.parametrize("tokens", [1, 7])
def test_fused_model_matches_the_original_gpu(build, tokens):
    model = randomize(build()).cuda().half()
    ids = torch.randint(0, 96, (1, tokens), device="cuda")
    with torch.no_grad():
        want = model(ids, use_cache=False).logits.float()
        fuse_routers(model)
        got = model(ids, use_cache=False).logits.float()
    # The kernel's logits may differ from cuBLAS's in the last bit, which can swap a near-tie at
    # the k-th expert; with random weights that changes a token's output by far less than this.
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02)
