"""nvcc compiles real catalog configs into a fatbin holding sm_80 and sm_90 code (CPU, no GPU needed)."""
import pytest

from mixed_gemm.build import build_fatbin, fatbin_targets, load_bytes
from mixed_gemm.codegen import KernelConfig, render


@pytest.mark.parametrize("config", [
    KernelConfig(bits=4, zero_mode="int", tile=(16, 64, 128), warps=(1, 1, 4)),
    KernelConfig(bits=8, zero_mode="sym", tile=(128, 128, 64), warps=(2, 2, 1)),
], ids=lambda c: c.name)
def test_compile_catalog_config(tmp_cache, config):
    data = load_bytes(build_fatbin(config.name, render(config)))
    targets = fatbin_targets(data)
    assert "sm_80" in targets and "sm_90" in targets
