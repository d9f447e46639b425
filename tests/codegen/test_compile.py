"""nvcc compiles real catalog configs into a fatbin holding sm_80 and sm_90 code (CPU, no GPU needed)."""
import pytest

from mixed_gemm.build import build_fatbin, fatbin_targets, load_bytes
from mixed_gemm.codegen import KernelConfig, render
from mixed_gemm.codegen.config import DequantConfig

# A representative subset of the catalog: both dtypes, both widths, all four zero modes, the
# decode and the prefill shapes, and a dequantize kernel.
SUBSET = [
    KernelConfig(bits=4, zero_mode="int", tile=(16, 64, 128), warps=(1, 1, 4)),
    KernelConfig(bits=8, zero_mode="sym", tile=(128, 128, 64), warps=(2, 2, 1)),
    KernelConfig(dtype="bf16", bits=4, zero_mode="float", tile=(128, 256, 64), warps=(2, 4, 1), stages=3),
    KernelConfig(dtype="bf16", bits=8, zero_mode="offset", tile=(16, 128, 128), warps=(1, 2, 2)),
    DequantConfig("bf16", 8, "int"),
]


@pytest.mark.parametrize("config", SUBSET, ids=lambda c: c.kernel_name)
def test_compile_catalog_config(tmp_cache, config):
    data = load_bytes(build_fatbin(config.kernel_name, render(config)))
    targets = fatbin_targets(data)
    assert "sm_80" in targets and "sm_90" in targets
