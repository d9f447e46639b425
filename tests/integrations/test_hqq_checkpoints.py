"""HQQ checkpoints (the ``hqq`` package's own save format, ``qmodel.pt``) into QuantLinear layers,
and ``save_quantized(format="hqq")`` back out, on the CPU reference path: a tiny Llama quantized
by hqq itself to 2, 3 and 4 bits, compared with hqq's own dequantized layers; 2/3-bit
``quantize_model`` round trips through both loaders."""
import pytest
import torch

pytest.importorskip("transformers")
hqq_base = pytest.importorskip("hqq.models.hf.base")
hqq_quantize = pytest.importorskip("hqq.core.quantize")

from mixed_gemm.integrations.hqq import load_hqq  # noqa: E402
from mixed_gemm.integrations.transformers import load_quantized, quantize_model, save_quantized  # noqa: E402
from mixed_gemm.nn import QuantLinear  # noqa: E402
from test_transformers import tiny_llama  # noqa: E402


def _hqq_model(bits, group, seed=0):
    model = tiny_llama(seed=seed, dtype=torch.float16)
    cfg = hqq_quantize.BaseQuantizeConfig(nbits=bits, group_size=group)
    hqq_base.AutoHQQHFModel.quantize_model(model, quant_config=cfg, compute_dtype=torch.float16, device="cpu")
    return model


@pytest.mark.parametrize("bits", (2, 3, 4))
def test_hqq_saved_checkpoint_loads_with_hqqs_weights(tmp_path, bits):
    ref = _hqq_model(bits, 32)  # K = 160 (down_proj): hqq groups rows of the flattened weight
    hqq_base.AutoHQQHFModel.save_quantized(ref, str(tmp_path))
    ours = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    layers = {n: m for n, m in ours.named_modules() if isinstance(m, QuantLinear)}
    assert len(layers) == 14 and all(m.bits == bits and m.zero_mode == "float" for m in layers.values())
    assert all(m.layout == ("lowbit" if bits < 4 else "sm80") for m in layers.values())
    for name, m in layers.items():
        want = ref.get_submodule(name).dequantize().float()  # hqq's own (q - z) s
        assert torch.allclose(m.dense_weight(), want, atol=2e-3 * want.abs().max().item(), rtol=0), name
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = ours(ids).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("bits", (2, 3))
def test_quantize_model_low_bits_saves_and_loads(tmp_path, bits):
    model = quantize_model(tiny_llama(seed=2), bits=bits, group_size=32, progress=False)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert all(m.layout == "lowbit" and m.bits == bits for m in layers.values())
    save_quantized(model, tmp_path, format="hqq")
    back = load_quantized(tmp_path, dtype=torch.float32, device="cpu", progress=False)
    for name, m in layers.items():
        assert torch.allclose(back.get_submodule(name).dense_weight(), m.dense_weight(), atol=1e-3, rtol=0), name
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=1e-3, rtol=1e-3)
    # hqq reads what we wrote: its dequantized layers equal ours
    theirs = hqq_base.AutoHQQHFModel.from_quantized(str(tmp_path), device="cpu", compute_dtype=torch.float16)
    for name, m in layers.items():
        want = theirs.get_submodule(name).dequantize().float()
        assert torch.allclose(m.dense_weight(), want, atol=2e-3 * want.abs().max().item(), rtol=0), name


def test_low_bit_gptq_and_sparse_saving_name_the_rule(tmp_path):
    model = quantize_model(tiny_llama(seed=4), bits=3, group_size=32, progress=False)
    with pytest.raises(ValueError, match="use format='hqq'"):
        save_quantized(model, tmp_path, format="gptq")
    with pytest.raises(ValueError, match="no qmodel.pt"):
        load_hqq(tmp_path / "missing")
