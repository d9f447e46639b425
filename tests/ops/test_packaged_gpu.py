"""A prebuilt kernel package serves the Llama-3 8B/70B shapes at M 1..4096 (fp16/bf16, int4/int8,
2/3-bit, 1:2-sparse 7-bit) with MIXED_GEMM_JIT=off, an empty cache, and nvcc and the CUTLASS headers
out of reach (tests/ops/packaged_check.py, in a fresh process). The package: the wheel named by
$MIXED_GEMM_KERNEL_WHEEL, else one already installed, else one built here with
`mixed-gemm build --package` (from the kernel cache; minutes of nvcc when that is cold). A wheel
is installed into a temporary folder. Without any of these (no nvcc to build one) the tests fail:
on an H100 this check does not skip."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mixed_gemm.compile import packages
from mixed_gemm.kernels import base

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[2]


def _env_without_toolchain(tmp_path, site) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not (Path(p) / "nvcc").exists())
    paths = [str(site)] if site else []
    # CUTLASS out of reach too, where it was put on PYTHONPATH (a carried wheel on the GPU machine).
    paths += [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                            if p and not (Path(p) / "cutlass_library").exists()]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(MIXED_GEMM_JIT="off", MIXED_GEMM_CACHE_DIR=str(tmp_path / "empty-cache"), PYTHONUNBUFFERED="1")
    return env


def _build_wheel(out: Path) -> Path:
    """`mixed-gemm build --package out --arch sm90a` with the toolchain of this environment, into
    its kernel cache ($MIXED_GEMM_CACHE_DIR or the default: warm, it takes seconds)."""
    from mixed_gemm.compile import BuildError, toolchain

    tools, missing = toolchain()
    if tools is None:
        pytest.fail(f"no sm90a kernel package: none installed, MIXED_GEMM_KERNEL_WHEEL unset, and none can be "
                    f"built here ({missing}); set MIXED_GEMM_KERNEL_WHEEL or pip install one", pytrace=False)
    env = dict(os.environ, MIXED_GEMM_JIT="block")
    proc = subprocess.run([sys.executable, "-m", "mixed_gemm.cli", "build", "--package", str(out), "--arch", "sm90a",
                           "--quiet"], env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    print(proc.stdout[-2000:])
    if proc.returncode != 0:
        raise BuildError(f"mixed-gemm build --package failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    (wheel,) = out.glob("mixed_gemm_kernels_sm90a-*.whl")
    return wheel


@pytest.fixture(scope="module")
def packaged_env(tmp_path_factory):
    """The environment of a user with only the kernel package: JIT off, empty cache, no nvcc."""
    if base.compute_capability(0) != (9, 0):
        pytest.skip("the shipped shapes are timed for the H100 (sm90a)")
    tmp_path = tmp_path_factory.mktemp("packaged")
    wheel = os.environ.get("MIXED_GEMM_KERNEL_WHEEL")
    if not wheel and not any(p.arch == "sm90a" and not p.problem for p in packages.installed()):
        wheel = str(_build_wheel(tmp_path / "dist"))
    site = None
    if wheel:
        site = tmp_path / "site"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(site), wheel], check=True)
    env = _env_without_toolchain(tmp_path, site)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    return env


def _run(env, args, timeout):
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stdout


def test_llama_shapes_from_the_package_without_a_toolchain(packaged_env):
    out = _run(packaged_env, [str(ROOT / "tests/ops/packaged_check.py")], timeout=900)
    assert "packaged: " in out and " 0 failed" in out


def test_bench_and_e2e_from_the_package_without_a_toolchain(packaged_env, tmp_path):
    """`mixed-gemm bench` and `mixed-gemm e2e` (fused projections, prefill, CUDA graphs, compiled
    generate) with zero compiles: with JIT off, any compile would fail the command."""
    out = _run(packaged_env, ["-m", "mixed_gemm.cli", "bench", "--model", "llama3-8b", "--ms", "1,16,64,4096",
                              "--plot", str(tmp_path / "bench.png")], timeout=600)
    assert "4096" in out
    _run(packaged_env, ["-m", "mixed_gemm.cli", "e2e", "--layers", "2", "--batches", "1", "--reps", "1",
                        "--plot", str(tmp_path / "e2e.png")], timeout=600)
