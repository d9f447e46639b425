"""Finding nvcc and CUTLASS, the flag set, and the fatbin reader."""
from __future__ import annotations

import importlib.metadata
import re
import struct

import pytest

from mixed_gemm import _paths
from mixed_gemm.compile import (
    FATBIN_MAGIC,
    BuildError,
    compile_cubin,
    compile_flags,
    cutlass_include_dir,
    cutlass_version,
    fatbin_targets,
    find_nvcc,
    key_flags,
    nvcc_version,
    ptxas_usage,
)


requires_nvcc = pytest.mark.nvcc  # skipped without nvcc (tests/conftest.py)


def make_fake_nvcc(root, version="12.4.131"):
    """``root/bin/nvcc``: a shell script answering ``--version`` like the real one."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvcc"
    major_minor = ".".join(version.split(".")[:2])
    exe.write_text(
        "#!/bin/sh\n"
        'echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        f'echo "Cuda compilation tools, release {major_minor}, V{version}"\n'
    )
    exe.chmod(0o755)
    return exe


@pytest.fixture
def no_nvcc_env(tmp_path, monkeypatch):
    """No CUDA_HOME/CUDA_PATH, and a PATH holding only an empty directory."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path


def test_cuda_home_first(no_nvcc_env, monkeypatch):
    home = make_fake_nvcc(no_nvcc_env / "home")
    cuda_path = make_fake_nvcc(no_nvcc_env / "cpath")
    on_path = make_fake_nvcc(no_nvcc_env / "onpath")
    monkeypatch.setenv("CUDA_HOME", str(home.parent.parent))
    monkeypatch.setenv("CUDA_PATH", str(cuda_path.parent.parent))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_nvcc() == home


def test_cuda_path_second(no_nvcc_env, monkeypatch):
    cuda_path = make_fake_nvcc(no_nvcc_env / "cpath")
    on_path = make_fake_nvcc(no_nvcc_env / "onpath")
    monkeypatch.setenv("CUDA_PATH", str(cuda_path.parent.parent))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_nvcc() == cuda_path


def test_path_fallback_past_a_cuda_home_without_nvcc(no_nvcc_env, monkeypatch):
    (no_nvcc_env / "broken" / "bin").mkdir(parents=True)
    (no_nvcc_env / "broken" / "bin" / "nvcc").write_text("not executable")  # mode 0644: skipped
    on_path = make_fake_nvcc(no_nvcc_env / "onpath")
    monkeypatch.setenv("CUDA_HOME", str(no_nvcc_env / "broken"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_nvcc() == on_path


def test_not_found(no_nvcc_env, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(no_nvcc_env / "nowhere"))
    with pytest.raises(BuildError, match="nvcc not found") as info:
        find_nvcc()
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "CUDA_HOME" in message and "PATH" in message and str(no_nvcc_env / "nowhere") in message


def test_nvcc_version_follows_the_nvcc_found(no_nvcc_env, monkeypatch):
    a = make_fake_nvcc(no_nvcc_env / "a", "12.4.131")
    b = make_fake_nvcc(no_nvcc_env / "b", "12.8.93")
    monkeypatch.setenv("CUDA_HOME", str(a.parent.parent))
    assert nvcc_version() == "12.4.131"
    monkeypatch.setenv("CUDA_HOME", str(b.parent.parent))
    assert nvcc_version() == "12.8.93"  # cached per path, not once per process


@requires_nvcc
def test_real_nvcc_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", nvcc_version())


def test_cutlass_headers():
    include = cutlass_include_dir()
    assert (include / "cutlass" / "cutlass.h").is_file()
    assert (include / "cute" / "tensor.hpp").is_file()
    version = cutlass_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    # The wheel's own version is MAJOR.MINOR.PATCH[.POST]; the header must agree with it.
    assert importlib.metadata.version("nvidia-cutlass").startswith(version)


def test_compile_flags():
    arch = ["-gencode=arch=compute_90a,code=sm_90a"]
    flags = compile_flags(arch_flags=arch)
    assert flags[:5] == ["-std=c++17", "-O3", "--fatbin", "--expt-relaxed-constexpr", "-DNDEBUG"]
    assert f"-I{cutlass_include_dir()}" in flags
    assert f"-I{_paths.templates_dir()}" in flags
    assert flags[-1:] == arch  # the family's arch flags, nothing global
    assert not any(f.startswith("-Xptxas") for f in flags)
    verbose = compile_flags(["-DFOO=1", "-lineinfo"], arch_flags=arch, verbose=True)
    assert "-Xptxas=-v" in verbose and verbose[-2:] == ["-DFOO=1", "-lineinfo"]
    # The key's flags need no toolchain: no include directories.
    assert key_flags(["-DFOO=1"], arch_flags=arch) == [f for f in flags if not f.startswith("-I")] + ["-DFOO=1"]


@requires_nvcc
def test_compile_cubin(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('#include <cutlass/cutlass.h>\nextern "C" __global__ void k(float* p) {}\n')
    out = compile_cubin(src, arch="sm_90")
    assert out == tmp_path / "k.sm_90.cubin"
    assert out.read_bytes()[:4] == b"\x7fELF"


@requires_nvcc
def test_ptxas_usage(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* p, int n) { float a[4];'
                   ' for (int i = 0; i < 4; ++i) a[i] = p[threadIdx.x + i * n];'
                   ' p[threadIdx.x] = a[0] * a[1] + a[2] * a[3]; }\n')
    regs, spilled = ptxas_usage(src, arch="sm_90a")
    assert 4 <= regs <= 32 and spilled == 0
    (tmp_path / "bad.cu").write_text("__global__ void k() { not_declared_anywhere(); }\n")
    with pytest.raises(BuildError, match="not_declared_anywhere"):
        ptxas_usage(tmp_path / "bad.cu")


@requires_nvcc
def test_compile_cubin_error(tmp_path):
    src = tmp_path / "bad.cu"
    src.write_text("__global__ void k() { not_declared_anywhere(); }\n")
    with pytest.raises(BuildError, match="not_declared_anywhere") as info:
        compile_cubin(src, tmp_path / "bad.cubin")
    assert str(src) in str(info.value) and info.value.source_path == src


def _fake_fatbin(entries):
    body = b""
    for kind, arch, payload in entries:
        header = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + bytes(12)
        header += struct.pack("<I", arch) + bytes(32)
        body += header + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def test_fatbin_targets_synthetic():
    data = _fake_fatbin([(2, 80, b"\x7fELF" + bytes(60)), (1, 90, b"ptx" + bytes(5))])
    assert fatbin_targets(data) == ["sm_80", "compute_90"]
    with pytest.raises(ValueError, match="truncated"):
        fatbin_targets(data[:-1])
    with pytest.raises(ValueError, match="magic"):
        fatbin_targets(b"\x7fELF" + data[4:])
    with pytest.raises(ValueError):
        fatbin_targets(b"")
