"""nvcc compiles a representative subset of the catalogs into fatbins holding sm_80 and sm_90 code
(CPU, no GPU needed): both dtypes, both widths, all four zero modes, decode and prefill tiles, and a
dequantize kernel."""
import pytest

from mixed_gemm.compile import build_spec, fatbin_targets, load_bytes
from mixed_gemm.kernels import family_of
from mixed_gemm.kernels.dequant_mm import DequantMMConfig
from mixed_gemm.kernels.moe_sm80 import MoeSm80Config
from mixed_gemm.kernels.sm80 import Sm80Config

SUBSET = [
    Sm80Config(bits=4, zero_mode="int", tile=(16, 64, 128), warps=(1, 1, 4)),
    Sm80Config(bits=8, zero_mode="sym", tile=(128, 128, 64), warps=(2, 2, 1)),
    Sm80Config(dtype="bf16", bits=4, zero_mode="float", tile=(128, 256, 64), warps=(2, 4, 1), stages=3),
    Sm80Config(dtype="bf16", bits=8, zero_mode="offset", tile=(16, 128, 128), warps=(1, 2, 2)),
    DequantMMConfig("bf16", 8, "int"),
    # moe_sm80 fused: A rows gathered in the cp.async loads, fp32 atomics (red.v2 on sm_90), the sort
    MoeSm80Config(dtype="bf16", bits=4, tile=(128, 128, 64), warps=(2, 2, 1), stages=4, fused=True),
]


@pytest.mark.nvcc
@pytest.mark.parametrize("config", SUBSET, ids=lambda c: c.kernel_name)
def test_compile_catalog_config(tmp_cache, config):
    targets = fatbin_targets(load_bytes(build_spec(family_of(config).build_spec(config))))
    assert targets == ["sm_80", "compute_90", "sm_90"]
