"""QuantExperts in transformers' mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V2; tiny random configs, CPU): quantize_model replaces every experts module and keeps
the routers; logits equal a dequantized twin (the same model with each weight's round-to-nearest
value, dequantized by the float32 reference from the canonical codes, put into transformers' own
modules); state_dict round trip; the activation rule."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

import mixed_gemm as mg  # noqa: E402
from mixed_gemm.integrations.transformers import quantize_model  # noqa: E402
from mixed_gemm.nn import QuantExperts, QuantLinear  # noqa: E402

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
CONFIGS = {
    "mixtral": lambda: transformers.MixtralConfig(**COMMON, intermediate_size=64, num_key_value_heads=2,
                                                  num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                                     num_experts=8, num_experts_per_tok=2, num_key_value_heads=2,
                                                     head_dim=16, decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                                     shared_expert_intermediate_size=64, num_experts=4,
                                                     num_experts_per_tok=2, num_key_value_heads=2,
                                                     decoder_sparse_step=1, mlp_only_layers=[]),
    "deepseek_v2": lambda: transformers.DeepseekV2Config(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                                         n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                                         num_key_value_heads=4, first_k_dense_replace=0,
                                                         kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8,
                                                         qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1),
}


def tiny(arch):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(CONFIGS[arch]()).eval()


def _rtn_dense(w: torch.Tensor, dtype: torch.dtype, group_size: int) -> torch.Tensor:
    """float32 ``(N, K)``: ``w`` quantized round-to-nearest (int4 with zeros, as quantize_model is
    called below) and dequantized by the reference from the canonical ``(q, s, z)``, scales rounded
    to the layer's ``dtype`` as it stores them."""
    q, s, z = mg.quantize(w, bits=4, group_size=group_size)
    return mg.reference.dequantize(q, s.to(dtype), z, group_size=group_size, bits=4)


def dequantized_twin(original, quantized, group_size=32):
    """``original`` with every weight that ``quantized`` holds quantized replaced by its float32
    reference value (:func:`_rtn_dense` of the original weight), in transformers' own modules. Built
    from the original weights and the canonical codes, never from what the quantized layers unpack,
    so a packing bug that unpacking mirrors cannot make the twin agree."""
    twin = copy.deepcopy(original)
    for name, mod in quantized.named_modules():
        if isinstance(mod, QuantExperts):
            source, target = original.get_submodule(name), twin.get_submodule(name)
            dtype = mod.w13_scales.dtype
            for proj in ("gate_up_proj", "down_proj"):
                w = getattr(source, proj).detach()
                getattr(target, proj).data.copy_(torch.stack([_rtn_dense(w[e], dtype, group_size)
                                                              for e in range(w.shape[0])]))
        elif isinstance(mod, QuantLinear):
            w = original.get_submodule(name).weight.detach()
            twin.get_submodule(name).weight.data.copy_(_rtn_dense(w, mod.scales.dtype, group_size))
    return twin


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_quantized_moe_model_equals_its_dequantized_twin(arch):
    model = tiny(arch)
    experts_names = [n for n, m in model.named_modules() if type(m).__name__.endswith("Experts")]
    quantized = quantize_model(copy.deepcopy(model), bits=4, group_size=32, progress=False)
    assert experts_names and all(isinstance(quantized.get_submodule(n), QuantExperts) for n in experts_names)
    # routers and the shared-expert gate keep the model's dtype (not QuantLinear)
    assert not any(isinstance(m, QuantLinear) for n, m in quantized.named_modules()
                   if n.endswith((".gate", ".shared_expert_gate")))
    twin = dequantized_twin(model, quantized)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = quantized(ids).logits, twin(ids).logits
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * want.abs().max().item())


def test_state_dict_round_trip_and_repr():
    quantized = quantize_model(tiny("mixtral"), bits=4, group_size=32, progress=False)
    experts = quantized.model.layers[0].mlp.experts
    other = copy.deepcopy(experts)
    for buf in other.buffers():
        buf.zero_()
    other.load_state_dict(experts.state_dict())
    x = torch.randn(5, 64)
    ids, weights = torch.randint(0, 4, (5, 2)), torch.rand(5, 2)
    assert torch.equal(other(x, ids, weights), experts(x, ids, weights))
    assert "num_experts=4" in repr(experts) and "group_size=32" in repr(experts)


def test_minus_one_contributes_nothing():
    """transformers' experts take the same routing convention as mg.moe: an index of -1 (an expert
    on another rank) adds nothing and its weight is never read (NaN here); a token of only -1 slots
    gets a zero row. Against the same module with those pairs sent to expert 0 at weight 0."""
    experts = quantize_model(tiny("mixtral"), bits=4, group_size=32, progress=False).model.layers[0].mlp.experts
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 64, generator=gen)
    ids, weights = torch.randint(0, 4, (6, 2), generator=gen), torch.rand(6, 2, generator=gen)
    ids[1], ids[3, 0] = -1, -1
    away = ids == -1
    got = experts(x, ids, weights.masked_fill(away, float("nan")))
    want = experts(x, ids.masked_fill(away, 0), weights.masked_fill(away, 0))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got[1] == 0).all() and not got.isnan().any()


def test_only_silu_experts():
    experts = tiny("mixtral").model.layers[0].mlp.experts
    experts.act_fn = nn.GELU()
    with pytest.raises(ValueError, match="fuse SiLU\\(gate\\) \\* up; this module's activation is GELU"):
        QuantExperts.from_experts(experts)
    with pytest.raises(TypeError, match="3-D gate_up_proj"):
        QuantExperts.from_experts(nn.Linear(4, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_quantized_moe_model_on_gpu_equals_its_dequantized_twin(arch):
    model = tiny(arch).half().cuda()
    quantized = quantize_model(copy.deepcopy(model), bits=4, group_size=32, progress=False)
    twin = dequantized_twin(model, quantized)
    ids = torch.randint(0, 128, (3, 5), generator=torch.Generator().manual_seed(2)).cuda()
    with torch.no_grad():
        got, want = quantized(ids).logits.float(), twin(ids).logits.float()
    assert not got.isnan().any()
    assert (got - want).norm() / want.norm() < 1e-2


@pytest.mark.parametrize("arch, fmt", [("mixtral", "awq"), ("qwen2_moe", "gptq"), ("deepseek_v2", "awq"),
                                       ("qwen3_moe", "gptq")])
def test_checkpoint_round_trip(arch, fmt, tmp_path):
    """save_quantized writes each expert's gate/up/down as AutoAWQ/GPTQ do (per-expert modules);
    load_quantized stacks them back into QuantExperts: the same logits."""
    from mixed_gemm.integrations.transformers import load_quantized, save_quantized

    quantized = quantize_model(tiny(arch), bits=4, group_size=32, progress=False)
    save_quantized(quantized, tmp_path, format=fmt)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.mlp.experts.3.up_proj.qweight" in keys and not any("gate_up_proj" in k for k in keys)
    loaded = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    assert isinstance(loaded.model.layers[1].mlp.experts, QuantExperts)
    # every experts module replaced: generate's grouped_mm -> batched_mm switch has nothing to switch
    assert "grouped_mm" not in quantized.get_experts_implementation().values()
    assert "grouped_mm" not in loaded.get_experts_implementation().values()
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, quantized(ids).logits, rtol=0, atol=1e-4)


def test_mixtral_original_expert_names_load(tmp_path):
    """Mixtral checkpoints name experts block_sparse_moe.experts.<e>.w1/w3/w2 (gate, up, down)."""
    from safetensors.torch import load_file, save_file

    from mixed_gemm.integrations.transformers import load_quantized, save_quantized

    quantized = quantize_model(tiny("mixtral"), bits=4, group_size=32, progress=False)
    save_quantized(quantized, tmp_path, format="awq")
    tensors = load_file(str(tmp_path / "model.safetensors"))
    rename = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    renamed = {}
    for key, t in tensors.items():
        parts = key.split(".")
        if "experts" in parts and parts[-2] in rename:
            parts[parts.index("mlp")] = "block_sparse_moe"
            parts[-2] = rename[parts[-2]]
        renamed[".".join(parts)] = t
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    loaded = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, quantized(ids).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_fuse_projections_keeps_moe_models_equal(arch):
    from mixed_gemm.integrations.transformers import fuse_projections

    model = quantize_model(tiny(arch), bits=4, group_size=32, progress=False)
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = model(ids).logits
        fuse_projections(model)
        after = model(ids).logits
    assert torch.equal(before, after)
