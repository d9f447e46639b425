"""Families on the GPU: what runs is explainable, every family's catalog kernel computes the
reference, the layout is recorded, and a cached kernel loads without nvcc or the CUTLASS headers."""
import json
import os
import subprocess
import sys

import pytest
import torch

import mixed_gemm as mg
from mixed_gemm.kernels import FAMILIES, available
from weights import random_weight, rel_err, seed_of

pytestmark = pytest.mark.gpu


def _weight(n=1024, k=2048, g=128, seed=0, layout="auto"):
    (q, s, z), packed = random_weight(n, k, fmt="awq", bits=4, symmetric=False, group_size=g, device="cuda",
                                      seed=seed)
    return (q, s, z), mg.prepack(*packed, format="awq", bits=4, group_size=g, layout=layout)


def test_prepack_records_the_devices_layout():
    _, w = _weight()
    hopper = mg.kernels.compute_capability(0) == (9, 0)
    expect = "sm90a" if hopper else "sm80"  # one copy on every device
    assert w.layout == mg.kernels.layout_for(0) == expect and len(w.aux) == 0
    assert f"layout='{expect}'" in repr(w)
    runs = [f.name for f, (ok, _) in available(0) if ok]
    assert runs == [f.name for f in FAMILIES if hopper or f.name not in ("sm90s", "sm90a")]  # the others run on sm_80+


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_each_family_computes_the_reference(fam):
    """One catalog kernel of each family, forced through config=, on fresh random data."""
    config = next(c for c in fam.catalog() if (c.dtype, c.bits, c.zero_mode) == ("f16", 4, "int"))
    (q, s, z), w = _weight(seed=seed_of(fam.name), layout=fam.layout_of(config))
    for m in (1, 37) if fam.name != "gemv" else (1, config.tokens):
        x = torch.randn(m, 2048, device="cuda").half()
        out = torch.full((m, 1024), float("nan"), device="cuda", dtype=torch.float16)
        mg.matmul(x, w, config=config, out=out)
        assert rel_err(out, mg.reference.matmul(x, q, s, z, group_size=128, bits=4), 2048) <= 2e-3


def test_explain_names_family_schedule_and_source(monkeypatch):
    monkeypatch.setenv(mg.select.PROFILE_ENV, os.devnull)  # an empty file: no profile...
    monkeypatch.setattr(mg.select.selection, "device_profile", lambda i: None)  # ...so heuristics decide
    mg.select.clear_selection()
    try:
        _, w = _weight(n=4096, k=4096)
        small, big = mg.explain(1, w), mg.explain(torch.empty(3000, 4096, device="cuda").half(), w)
        if mg.kernels.compute_capability(0) == (9, 0):  # gemv reads the sm90a copy at M=1; wgmma takes large M
            assert (small.family.name, small.source) == ("gemv", "heuristic") and small.schedule.startswith("gemv:m8")
            assert big.family.name == "sm90a" and big.schedule.startswith("sm90a:t128x256x64_coop")
        else:
            assert (small.family.name, small.source) == ("sm80", "heuristic") and small.schedule.startswith("sm80:t16x")
            assert (big.family.name, big.schedule) == ("dequant_mm", "dequant_mm:dequant_mm")
        assert mg.explain(1, w) is small  # the one selection cache: matmul reads the same entry
        with pytest.raises(TypeError, match="x_or_m"):
            mg.explain(0, w)
    finally:
        mg.select.clear_selection()


_RUN = """
import json, sys, torch
import cutlass_library
hide = sys.argv[2] == "hide"
if hide:
    cutlass_library.source_path = "/nonexistent/cutlass"  # CUTLASS headers gone
import mixed_gemm as mg
from mixed_gemm.compile import BuildError, cutlass_include_dir, find_nvcc
for probe in (find_nvcc, cutlass_include_dir) if hide else ():
    try:
        probe(); sys.exit(probe.__name__ + " still works")
    except BuildError:
        pass
torch.manual_seed(0)
q = torch.randint(0, 16, (512, 1024), dtype=torch.uint8, device="cuda")
s = (torch.rand(512, 8, device="cuda") * 0.01 + 0.005).half()
z = torch.randint(0, 16, (512, 8), device="cuda").half()
w = mg.prepack(q, s, z, format="plain", bits=4, group_size=128, layout="sm80")  # the sm80 kernel's
x = torch.randn(5, 1024, device="cuda").half()
y = mg.matmul(x, w, config=mg.KernelConfig.from_schedule(sys.argv[1]))
ref = mg.reference.matmul(x, q, s, z, group_size=128, bits=4)
print(json.dumps({"err": ((y.float() - ref).norm() / ref.norm()).item()}))
"""


def test_cached_kernel_loads_without_nvcc_and_cutlass(tmp_path):
    schedule = "t16x64x128_w1x1x4_s4"
    env = dict(os.environ, MIXED_GEMM_CACHE_DIR=str(tmp_path / "cache"))
    warm = subprocess.run([sys.executable, "-c", _RUN, schedule, "build"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]  # built into the fresh cache with the toolchain
    from mixed_gemm.compile import find_nvcc

    nvcc_dir = str(find_nvcc().parent)
    hidden = {k: v for k, v in env.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    hidden["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                     if p and p != nvcc_dir and not os.path.exists(os.path.join(p, "nvcc")))
    cold = subprocess.run([sys.executable, "-c", _RUN, schedule, "hide"], env=hidden, capture_output=True, text=True,
                          timeout=600)
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert json.loads(cold.stdout.strip().splitlines()[-1])["err"] < 2e-3
