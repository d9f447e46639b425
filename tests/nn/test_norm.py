"""OneKernelRMSNorm against transformers' RMSNorm steps (fp32 statistics) on fresh random inputs."""
import pytest
import torch

from mixed_gemm.nn import OneKernelRMSNorm


def transformers_rms_norm(weight, eps, x):
    """transformers' LlamaRMSNorm.forward, step for step."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_matches_transformers_steps(dtype, atol):
    torch.manual_seed(0)
    weight = torch.randn(96).to(dtype)
    norm = OneKernelRMSNorm(weight, 1e-6)
    assert norm.weight.data_ptr() == weight.data_ptr()  # shared, not copied
    x = torch.randn(3, 5, 96).to(dtype) * 3
    want = transformers_rms_norm(norm.weight, 1e-6, x).float()
    got = norm(x)
    assert got.dtype == dtype and got.shape == x.shape
    # The weight multiplies before the one rounding: at most an ulp or so from transformers.
    torch.testing.assert_close(got.float(), want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=atol)
    # Against the float32 reference of the same definition, element-wise.
    ref = weight.float() * x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(got.float(), ref, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=atol)


def test_weight_of_another_dtype_takes_transformers_steps_exactly():
    torch.manual_seed(1)
    weight = torch.randn(64)  # fp32 weight, fp16 input: transformers promotes the product
    norm = OneKernelRMSNorm(weight, 1e-5)
    x = torch.randn(4, 64).half()
    got = norm(x)
    assert got.dtype == torch.float32
    assert torch.equal(got, transformers_rms_norm(norm.weight, 1e-5, x))


def test_is_a_torch_rms_norm_with_transformers_eps_name():
    norm = OneKernelRMSNorm(torch.ones(8), 1e-6)
    assert isinstance(norm, torch.nn.RMSNorm) and norm.variance_epsilon == norm.eps == 1e-6
    assert norm.normalized_shape == (8,) and [n for n, _ in norm.named_parameters()] == ["weight"]
    assert "eps=1e-06" in repr(norm)


@pytest.mark.parametrize("weight, eps, match", [
    (torch.ones(2, 8), 1e-6, r"weight: expected a 1-D tensor"),
    ([1.0, 2.0], 1e-6, r"weight: expected a 1-D tensor"),
    (torch.ones(8), -1.0, r"eps: expected a float >= 0, got -1.0"),
    (torch.ones(8), True, r"eps: expected a float >= 0, got True"),
])
def test_bad_arguments(weight, eps, match):
    with pytest.raises(ValueError, match=match):
        OneKernelRMSNorm(weight, eps)
