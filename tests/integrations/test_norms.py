"""transformers' RMSNorms swapped for OneKernelRMSNorm (integrations.norms): which are swapped, that
each listed class computes what the swap assumes, and whole tiny models against their unswapped
selves."""
import importlib
import inspect

import pytest
import torch

from mixed_gemm.integrations.fuse import fuse_projections
from mixed_gemm.integrations.norms import RMS_NORMS, fuse_norms, one_kernel_norm, rms_norm
from mixed_gemm.nn import OneKernelRMSNorm

transformers = pytest.importorskip("transformers")
from tests.integrations.test_router_fuse import deepseek, mixtral, qwen3, randomize  # noqa: E402

MODULES = {"LlamaRMSNorm": "llama", "MistralRMSNorm": "mistral", "Qwen2RMSNorm": "qwen2", "Qwen3RMSNorm": "qwen3",
           "Qwen2MoeRMSNorm": "qwen2_moe", "Qwen3MoeRMSNorm": "qwen3_moe", "MixtralRMSNorm": "mixtral",
           "DeepseekV2RMSNorm": "deepseek_v2", "DeepseekV3RMSNorm": "deepseek_v3", "Phi3RMSNorm": "phi3",
           "GraniteMoeRMSNorm": "granitemoe"}


def _source(name):
    module = importlib.import_module(f"transformers.models.{MODULES[name]}.modeling_{MODULES[name]}")
    cls = getattr(module, name)
    return (inspect.getsource(cls.forward) + inspect.getsource(cls.__init__)).replace(name, "X")


@pytest.mark.parametrize("name", RMS_NORMS)
def test_every_listed_norm_is_llamas(name):
    """The swap assumes Llama's forward: a transformers release that changes one class fails here."""
    assert set(MODULES) == set(RMS_NORMS)
    assert _source(name) == _source("LlamaRMSNorm")


def norms(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]


@pytest.mark.parametrize("build", [qwen3, mixtral, deepseek])
def test_swapped_model_matches_the_original(build):
    torch.manual_seed(3)
    model = randomize(build())
    ids = torch.randint(0, 96, (2, 7))
    keys = list(model.state_dict())
    before = [n for n in norms(model) if not isinstance(n, OneKernelRMSNorm)]
    weights = {id(n.weight) for n in before}
    with torch.no_grad():
        want = model(ids).logits
    assert fuse_norms(model) == len(before) > 0
    after = norms(model)
    assert all(isinstance(n, OneKernelRMSNorm) for n in after) and {id(n.weight) for n in after} == weights
    assert list(model.state_dict()) == keys  # checkpoints load and save as before
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert fuse_norms(model) == 0  # idempotent


def test_qwen3_q_and_k_norms_are_swapped_and_counted():
    model = qwen3()
    layers = model.config.num_hidden_layers
    # input, post-attention, q and k norms a layer, and the final norm
    assert fuse_norms(model) == 4 * layers + 1
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_norm, OneKernelRMSNorm) and attn.q_norm.normalized_shape == (16,)


def test_hooked_or_patched_norms_stay():
    model = qwen3()
    layer = model.model.layers[0]
    seen = []
    layer.input_layernorm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    layer.post_attention_layernorm.forward = layer.post_attention_layernorm.forward  # a forward of its own
    n = fuse_norms(model)
    assert n == 4 * model.config.num_hidden_layers + 1 - 2
    assert not isinstance(layer.input_layernorm, OneKernelRMSNorm) and seen == []
    assert not isinstance(layer.post_attention_layernorm, OneKernelRMSNorm)
    with torch.no_grad():
        model(torch.randint(0, 96, (1, 3)))
    assert len(seen) == 1


def test_one_kernel_norm_and_rms_norm():
    model = qwen3()
    norm = model.model.layers[0].input_layernorm
    assert one_kernel_norm(norm)
    swapped = OneKernelRMSNorm(norm.weight, norm.variance_epsilon)
    assert one_kernel_norm(swapped) and not one_kernel_norm(torch.nn.LayerNorm(64))
    torch.manual_seed(4)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(3, 64)
    torch.testing.assert_close(rms_norm(swapped, x), norm(x), rtol=1e-5, atol=1e-5)
    seen = []
    swapped.register_forward_hook(lambda m, i, o: seen.append(1))
    rms_norm(swapped, x)
    assert seen == [1]  # a hooked norm runs as the module


def test_fuse_projections_swaps_norms_unless_told_not_to():
    a, b = qwen3(), qwen3()
    fuse_projections(a)
    fuse_projections(b, norms=False)
    assert all(isinstance(n, OneKernelRMSNorm) for n in norms(a))
    assert not any(isinstance(n, OneKernelRMSNorm) for n in norms(b))
