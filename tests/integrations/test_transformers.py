"""transformers integration on the CPU reference path: quantize -> save -> load round trips."""
import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mixed_gemm.integrations.transformers import (  # noqa: E402
    load_quantized, parse_quant_config, quantize_model, save_quantized)
from mixed_gemm.nn import QuantLinear  # noqa: E402


def tiny_llama(seed=0, tie=True, dtype=torch.float32):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=128, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


@pytest.mark.parametrize("fmt,symmetric,group", [("awq", False, 32), ("awq", False, 128), ("gptq", True, 64),
                                                 ("gptq", False, 32)])
def test_quantize_save_load_round_trip(tmp_path, fmt, symmetric, group):
    model = tiny_llama()
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        dense_logits = model(ids).logits
    quantize_model(model, bits=4, group_size=group, symmetric=symmetric, progress=False)
    linears = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(linears) == 2 * 7 and not isinstance(model.lm_head, QuantLinear)
    with torch.no_grad():
        q_logits = model(ids).logits
    # RTN int4 on random weights: close to the dense model, not equal.
    assert ((q_logits - dense_logits).norm() / dense_logits.norm()).item() < 0.25
    save_quantized(model, tmp_path, format=fmt)
    qc = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == fmt and qc["group_size"] == group
    loaded = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    assert sum(isinstance(m, QuantLinear) for m in loaded.modules()) == len(linears)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()  # tied again
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, q_logits)  # the same integers, scales and zeros


def test_group_not_dividing_k_round_trips(tmp_path):
    """K = 160 (down_proj) at group 128: a shorter last group, loadable by load_quantized."""
    model = quantize_model(tiny_llama(), group_size=128, progress=False)
    down = model.model.layers[0].mlp.down_proj
    assert down.in_features == 160 and down.scales.shape[0] == 2
    save_quantized(model, tmp_path)
    loaded = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    ids = torch.randint(0, 256, (1, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("qc,msg", [
    ({"quant_method": "awq", "version": "gemv"}, "quantization_config.version"),
    ({"quant_method": "awq", "bits": 8}, "quantization_config.bits"),
    ({"quant_method": "gptq", "bits": 3}, "quantization_config.bits"),
    ({"quant_method": "gptq", "checkpoint_format": "marlin"}, "quantization_config.checkpoint_format"),
    ({"quant_method": "bitsandbytes"}, "quantization_config.quant_method"),
    ({"quant_method": "awq", "group_size": 0}, "quantization_config.group_size: expected -1"),
    ({"quant_method": "gptq", "group_size": -2}, "quantization_config.group_size: expected -1"),
    ({"quant_method": "gptq", "group_size": "128"}, "quantization_config.group_size: expected an int"),
    ({"quant_method": "gptq", "group_size": None}, "quantization_config.group_size: expected an int"),
    ({"quant_method": "gptq", "bits": True}, "quantization_config.bits: expected an int"),
    ({"quant_method": "gptq", "sym": "false"}, "quantization_config.sym: expected true or false"),
    ({"quant_method": "gptq", "desc_act": 1}, "quantization_config.desc_act: expected true or false"),
    ({"quant_method": "awq", "zero_point": None}, "quantization_config.zero_point: expected true or false"),
    ({"quant_method": "awq", "modules_to_not_convert": "lm_head"}, "quantization_config.modules_to_not_convert"),
])
def test_unsupported_settings(qc, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_quant_config(qc)


def test_valid_settings_parse():
    assert parse_quant_config({"quant_method": "gptq", "group_size": -1, "bits": 8, "sym": False,
                               "checkpoint_format": None, "modules_to_not_convert": None}) == dict(
        format="gptq", bits=8, group_size=-1, symmetric=False, act_order=False, skip=())
    assert parse_quant_config({"quant_method": "awq", "modules_to_not_convert": ["lm_head"]})["skip"] == ("lm_head",)


def test_group_size_zero_checkpoint_is_rejected_before_loading(tmp_path):
    """group_size 0 used to reach the layer constructors and raise ZeroDivisionError."""
    save_quantized(quantize_model(tiny_llama(), group_size=32, progress=False), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["group_size"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=re.escape("quantization_config.group_size: expected -1")):
        load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)


def test_load_errors(tmp_path):
    tiny_llama().config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no quantization_config"):
        load_quantized(tmp_path, device="cpu")
    model = quantize_model(tiny_llama(), progress=False)
    with pytest.raises(ValueError, match="format"):
        save_quantized(model, tmp_path / "x", format="exl2")


def test_fuse_projections_keeps_logits(monkeypatch):
    from mixed_gemm.integrations.fuse import FusedGateUpMLP, FusedQKV, QKVSlice, fuse_projections

    model = tiny_llama(seed=3)
    quantize_model(model, bits=4, group_size=32, progress=False)
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
    assert fuse_projections(model) == 2 * 2  # q|k|v and gate|up in each of 2 layers
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, FusedQKV) and isinstance(layer.self_attn.v_proj, QKVSlice)
    assert isinstance(layer.mlp, FusedGateUpMLP) and layer.mlp.gate_up.out_features == 2 * 160
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 2 * 4  # qkv, o, gate_up, down
    with torch.no_grad():
        after = model(ids).logits
        again = model(ids).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    assert torch.equal(after, again)
    assert layer.self_attn.q_proj._handover.value is None  # nothing kept between forwards
    # A slice called on another input computes its own projection rather than a stale hand-over.
    x = torch.randn(1, 3, 64)
    head = layer.self_attn.q_proj
    head(torch.randn(1, 3, 64))
    torch.testing.assert_close(layer.self_attn.k_proj(x), head.split(x)[1])
    assert fuse_projections(model) == 0  # idempotent


def test_fuse_residual_keeps_logits_hooks_and_generate():
    from mixed_gemm.integrations.fuse import SkipProj, fuse_projections, fuse_residual

    model = tiny_llama(seed=5)
    quantize_model(model, bits=4, group_size=32, progress=False)
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        before = model(ids, output_hidden_states=True)
        tokens = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert fuse_projections(model, residual=True) == 2 * 2
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.o_proj, SkipProj) and isinstance(layer.mlp.down_proj, SkipProj)
    assert type(layer).__name__ == "LlamaDecoderLayer" and "forward" in vars(layer)  # class and hooks kept
    with torch.no_grad():
        after = model(ids, output_hidden_states=True)
        fused_tokens = model.generate(ids, max_new_tokens=4, do_sample=False)
    torch.testing.assert_close(after.logits, before.logits, rtol=0, atol=1e-5)
    for a, b in zip(after.hidden_states, before.hidden_states):  # per-layer outputs still recorded
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert torch.equal(fused_tokens, tokens)
    assert layer.self_attn.o_proj._handover.value is None and layer.mlp.down_proj._handover.value is None
    # Dynamo traces the in-place hand-overs in one graph (the GPU suite compiles with Inductor).
    with torch.no_grad():
        traced = torch.compile(model, backend="eager", fullgraph=True)(ids).logits
    torch.testing.assert_close(traced, after.logits, rtol=0, atol=1e-5)
    assert layer.self_attn.o_proj._handover.value is None and layer.self_attn.q_proj._handover.value is None
    x = torch.randn(1, 3, 64)  # called outside the layer: the plain projection
    torch.testing.assert_close(layer.self_attn.o_proj(x), layer.self_attn.o_proj.proj(x))
    assert fuse_residual(model) == 0  # idempotent
    # The norms run as one rms_norm each; a norm with a hook runs as the module (its hook fires).
    assert layer._mg_norms == (layer.input_layernorm, layer.post_attention_layernorm)
    seen = []
    layer.post_attention_layernorm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        hooked = model(ids).logits
    assert len(seen) == 1
    torch.testing.assert_close(hooked, after.logits, rtol=0, atol=1e-5)


def test_quant_linear_residual_on_the_reference_path():
    lin = torch.nn.Linear(64, 48, bias=True)
    mod = QuantLinear.from_linear(lin, bits=4, group_size=32)
    x, r = torch.randn(2, 5, 64).half(), torch.randn(2, 5, 48).half()
    expect = (torch.nn.functional.linear(x.float(), mod.dense_weight(), mod.bias.float()) + r.float()).half()
    assert torch.equal(mod(x, residual=r), expect)
    with pytest.raises(ValueError, match="residual"):
        mod(x, residual=r[..., :47])


@pytest.mark.parametrize("symmetric", [False, True])
def test_one_sm90a_copy_quantizes_saves_and_fuses_like_sm80(tmp_path, symmetric):
    """A model quantized into the sm90a layout alone (the H100's one-copy weight) holds the same
    integers, scales and zeros as the sm80 one: equal logits on the reference path, an equal
    checkpoint, and fusing re-packs it in its own layout."""
    from mixed_gemm.integrations.fuse import fuse_projections

    ids = torch.randint(0, 256, (2, 7))
    a, b = tiny_llama(seed=5), tiny_llama(seed=5)
    quantize_model(a, bits=4, group_size=32, symmetric=symmetric, progress=False, layout="sm80")
    quantize_model(b, bits=4, group_size=32, symmetric=symmetric, progress=False, layout="sm90a")
    assert {m.layout for m in b.modules() if isinstance(m, QuantLinear)} == {"sm90a"}
    with torch.no_grad():
        la, lb = a(ids).logits, b(ids).logits
    assert torch.equal(la, lb)
    save_quantized(b, tmp_path, format="awq")
    loaded = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, la)
    assert fuse_projections(b) == 2 * 2
    assert {m.layout for m in b.modules() if isinstance(m, QuantLinear)} == {"sm90a"}
    with torch.no_grad():
        torch.testing.assert_close(b(ids).logits, la, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind, bits, group, tol", [("int8", 8, -1, 0.02), ("int4", 4, 128, 0.25)])
@pytest.mark.parametrize("tie", [True, False])
def test_quantized_lm_head(kind, bits, group, tol, tie, tmp_path):
    """lm_head='int8' (per channel) / 'int4' (g128): the head becomes a QuantLinear, a tied head is
    untied with the embeddings left dense, and the logits stay near those of the model with only
    its body quantized (the head's accuracy cost on this tiny random model: int8 within 2%, int4
    within 25%)."""
    model = tiny_llama(tie=tie)
    embed = model.model.embed_tokens.weight.detach().clone()
    ids = torch.randint(0, 256, (2, 9))
    quantize_model(model, progress=False)
    with torch.no_grad():
        body_only = model(ids).logits
    quantize_model(model, progress=False, lm_head=kind)  # the body is quantized already: only the head changes
    assert isinstance(model.lm_head, QuantLinear) and (model.lm_head.bits, model.lm_head.group_size) == (bits, group)
    assert not model.config.tie_word_embeddings and torch.equal(model.model.embed_tokens.weight, embed)
    with torch.no_grad():
        logits = model(ids).logits
    assert 0 < ((logits - body_only).norm() / body_only.norm()).item() < tol
    if kind == "int8":  # two kinds in one model: no AWQ/GPTQ checkpoint holds that
        with pytest.raises(ValueError, match="a checkpoint holds one bits/group_size/zero kind"):
            save_quantized(model, tmp_path)
        return
    save_quantized(model, tmp_path)  # an int4 g128 head is one more layer of the checkpoint's kind
    loaded = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    assert isinstance(loaded.lm_head, QuantLinear)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, logits)


def test_quantized_lm_head_rules():
    with pytest.raises(ValueError, match=r"lm_head: expected None or one of \('int8', 'int4'\), got 'fp8'"):
        quantize_model(tiny_llama(), progress=False, lm_head="fp8")


def test_experts_switch_off_only_once_every_experts_module_is_replaced():
    """quantize_model marks a mixture-of-experts model's experts implementation "eager" once no
    transformers experts module is left (generate's grouped_mm -> batched_mm switch walks every module
    twice a call and has nothing to switch); with one left, the model keeps grouped_mm."""
    from mixed_gemm.integrations.transformers import no_experts_switch
    from test_router_fuse import qwen3

    model = qwen3()
    assert model.get_experts_implementation() == {"": "grouped_mm"} and not no_experts_switch(model)
    quantize_model(model, bits=4, group_size=32, progress=False)
    assert model.get_experts_implementation() == {"": "eager"} and not no_experts_switch(model)
    partial = quantize_model(qwen3(), bits=4, group_size=32, progress=False, skip=("lm_head", "layers.1.mlp.experts"))
    assert partial.get_experts_implementation() == {"": "grouped_mm"}
    assert not no_experts_switch(tiny_llama(seed=1))  # no experts at all
