"""Kernel packages: a wheel built with nvcc on the CPU installs into a fresh folder and every entry is
found and verified without nvcc; packages come before the cache; bad packages (tampered,
truncated, another arch, a CUDA newer than the driver, two packages disagreeing on a kernel) warn,
are skipped, and the cache or nvcc comes next; JIT-off turns a compile into a named error."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mixed_gemm.compile import BuildError, JitDisabledError, build_fatbin, cache, lookup, packages
from mixed_gemm.compile.cache import locate
from mixed_gemm.compile.packages import KernelPackage, KernelPackageWarning
from mixed_gemm.compile.wheel import PackagedKernel, packaged_bytes, write_package

ROOT = Path(__file__).resolve().parents[2]
SRC = 'extern "C" __global__ void k(float* p) { p[0] = 1.f; }\n'
ARCH = ("-gencode=arch=compute_80,code=sm_80",)


# --- a real wheel, built with nvcc, installed into a fresh folder ------------------------------


@pytest.mark.nvcc
def test_wheel_installs_and_every_entry_verifies_without_nvcc(tmp_path, tmp_cache):
    """What CI checks: `mixed-gemm build --package` for a few small kernels, pip install into an
    empty folder, then in a fresh process with nvcc off PATH and an empty cache every kernel of
    the manifest is found (lookup) and loads through build_fatbin with MIXED_GEMM_JIT=off."""
    out = tmp_path / "dist"
    env = dict(os.environ, MIXED_GEMM_CACHE_DIR=str(tmp_cache))
    run = subprocess.run([sys.executable, "-m", "mixed_gemm.cli", "build", "--package", str(out), "--arch", "sm90a",
                          "--filter", "mg_dequant_f16", "--jobs", "2", "--quiet"], env=env, capture_output=True,
                         text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    wheels = list(out.glob("mixed_gemm_kernels_sm90a-*.whl"))
    assert len(wheels) == 1 and "kernels (6 dequant_mm)" in run.stdout
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheels[0])], check=True)
    check = r"""
import sys; sys.modules["cutlass_library"] = None
from mixed_gemm.compile import packages, lookup, build_spec, toolchain
from mixed_gemm.select.coverage import selectable
assert toolchain()[0] is None, toolchain()
(pkg,) = packages.installed()
assert pkg.arch == "sm90a" and not pkg.problem, pkg
names = set(pkg.kernels)
found = 0
for fam, c in selectable("sm90a"):
    if c.kernel_name in names:
        spec = fam.build_spec(c)
        path = build_spec(spec)  # MIXED_GEMM_JIT=off: a miss would raise
        assert path.is_relative_to(pkg.root) and path == lookup(spec.name, spec.source(), arch_flags=spec.arch_flags)
        found += 1
assert found == len(names) == 6, (found, names)
print("verified", found)
"""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PATH=os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "nvcc").exists()),
               PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), MIXED_GEMM_JIT="off",
               MIXED_GEMM_CACHE_DIR=str(tmp_path / "empty"))
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", check], env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "verified 6" in proc.stdout, proc.stderr
    manifest = json.loads(next(site.glob("mixed_gemm_kernels_sm90a/manifest.json")).read_text())
    assert manifest["toolchain"]["nvcc"] and set(manifest["kernels"]) == {n for n in manifest["kernels"]}


# --- fake packages, in process ------------------------------------------------------------------


@pytest.fixture
def fake_compiler(monkeypatch):
    """build_fatbin without nvcc: 'compiles' write a fatbin-shaped file and are counted."""
    built = []

    def compile_fatbin(src, out, flags, **kw):
        built.append(Path(src).stem)
        Path(out).write_bytes(_fatbin(("sm_80",), b"cache"))

    monkeypatch.setattr(cache, "compile_fatbin", compile_fatbin)
    monkeypatch.setattr(cache, "toolchain", lambda: ({"nvcc": "13.0.88", "cutlass": "4.2.0"}, ""))
    monkeypatch.setattr(cache, "find_nvcc", lambda: Path("/fake/nvcc"))
    return built


def _fatbin(archs, payload: bytes) -> bytes:
    """A minimal well-formed fatbin holding one ELF entry per arch (what fatbin_targets reads)."""
    import struct

    body = b""
    for arch in archs:
        num = int(arch.split("_")[1])
        data = payload.ljust(16, b"\0")
        header = struct.pack("<HHIQ", 2, 0x101, 64, len(data)) + b"\0" * 12 + struct.pack("<I", num) + b"\0" * 32
        body += header[:64] + data
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _package(root: Path, name: str, *, kernels, arch="sm80", nvcc="13.0.88", dist=None) -> KernelPackage:
    """A package folder with ``kernels`` = {kernel name: bytes}, keyed for SRC/ARCH."""
    root.mkdir(parents=True, exist_ok=True)
    entries = {}
    for kname, data in kernels.items():
        key = locate(kname, SRC, ARCH)[0]
        file = f"kernels/{kname}-{key[:16]}.fatbin"
        (root / file).parent.mkdir(exist_ok=True)
        (root / file).write_bytes(data)
        entries[kname] = {"key": key, "file": file, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": 1, "distribution": dist or name, "version": "0.1.0", "arch": arch,
                "toolchain": {"nvcc": nvcc, "cutlass": "4.2.0"}, "kernels": entries}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return KernelPackage(distribution=dist or name, version="0.1.0", arch=arch, root=root,
                         toolchain=manifest["toolchain"], kernels=entries)


@pytest.fixture
def installed(monkeypatch):
    """Set the installed packages: installed([pkg, ...])."""
    def set_packages(pkgs):
        packages._VERIFIED.clear()  # what refresh() forgets, with installed() patched
        packages._REPORTED.clear()
        monkeypatch.setattr(packages, "installed", lambda: tuple(pkgs))
    yield set_packages
    monkeypatch.undo()
    packages.refresh()


def test_package_comes_before_cache_and_compile(tmp_path, tmp_cache, fake_compiler, installed):
    good = _fatbin(("sm_80",), b"packaged")
    pkg = _package(tmp_path / "p", "mixed-gemm-kernels-sm80", kernels={"k": good})
    installed([pkg])
    path = build_fatbin("k", SRC, arch_flags=ARCH)
    assert path.read_bytes() == good and path.is_relative_to(pkg.root) and fake_compiler == []
    assert lookup("k", SRC, arch_flags=ARCH) == path
    assert lookup("other", SRC, arch_flags=ARCH) is None  # not packaged, not cached
    # Another source (a newer template) has another key: the package does not serve it.
    assert build_fatbin("k", SRC + "// v2\n", arch_flags=ARCH).is_relative_to(tmp_cache) and fake_compiler == ["k"]


@pytest.mark.parametrize("damage", ["truncated", "tampered", "wrong arch", "malformed"])
def test_a_damaged_entry_warns_and_falls_back(tmp_path, tmp_cache, fake_compiler, installed, damage):
    good = _fatbin(("sm_80",), b"packaged")
    pkg = _package(tmp_path / "p", "kp", kernels={"k": good})
    file = pkg.root / pkg.kernels["k"]["file"]
    if damage == "truncated":
        file.write_bytes(good[:-5])
    elif damage == "tampered":
        file.write_bytes(good[:-1] + b"X")
    else:  # a manifest that matches bytes that do not hold the arch the flags build
        data = _fatbin(("sm_90",), b"packaged") if damage == "wrong arch" else b"not a fatbin at all"
        file.write_bytes(data)
        pkg.kernels["k"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    installed([pkg])
    with pytest.warns(KernelPackageWarning, match=r"kp: k skipped: .*(truncated|sha256|holds|malformed)"):
        path = build_fatbin("k", SRC, arch_flags=ARCH)
    assert path.is_relative_to(tmp_cache) and fake_compiler == ["k"]  # the cache, built by nvcc
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported once per process
        assert build_fatbin("k", SRC, arch_flags=ARCH) == path


def test_two_packages_disagreeing_on_a_kernel_serve_neither(tmp_path, tmp_cache, fake_compiler, installed):
    a = _package(tmp_path / "a", "kp-a", kernels={"k": _fatbin(("sm_80",), b"one")})
    b = _package(tmp_path / "b", "kp-b", kernels={"k": _fatbin(("sm_80",), b"two")})
    same = _package(tmp_path / "c", "kp-c", kernels={"k": _fatbin(("sm_80",), b"one")})
    installed([a, same])  # identical bytes: no conflict
    assert build_fatbin("k", SRC, arch_flags=ARCH).is_relative_to(a.root)
    installed([a, b])
    with pytest.warns(KernelPackageWarning, match="kp-a 0.1.0, kp-b 0.1.0 hold different binaries for k"):
        assert build_fatbin("k", SRC, arch_flags=ARCH).is_relative_to(tmp_cache)


def test_a_package_built_by_a_newer_cuda_than_the_driver_is_skipped(tmp_path, monkeypatch):
    root = tmp_path / "pkg"
    _package(root, "kp", kernels={"k": _fatbin(("sm_80",), b"x")}, nvcc="14.1.2")
    monkeypatch.setattr(packages, "_driver_cuda", lambda: (13, 0))
    monkeypatch.setattr(packages.util, "find_spec", lambda name: type("S", (), {"submodule_search_locations": [str(root)]}))
    with pytest.warns(KernelPackageWarning, match=r"nvcc 14.1.2, newer than this driver's CUDA 13.0"):
        pkg = packages._read("kp", "kp_module")
    assert pkg.problem and "SKIPPED" in pkg.describe()
    monkeypatch.setattr(packages, "_driver_cuda", lambda: (13, 0))
    with pytest.warns(KernelPackageWarning, match="unreadable manifest.json"):
        (root / "manifest.json").write_text("{not json")
        assert packages._read("kp", "kp_module") is None


def test_jit_off_names_the_kernel_and_the_ways_to_get_it(tmp_cache, fake_compiler, installed, monkeypatch):
    installed([])
    monkeypatch.setenv("MIXED_GEMM_JIT", "off")
    with pytest.raises(JitDisabledError, match=r"k: not in an installed kernel package \(none installed\).*"
                                                r"MIXED_GEMM_JIT=off forbids compiling it.*--package"):
        build_fatbin("k", SRC, arch_flags=ARCH)
    assert fake_compiler == [] and issubclass(JitDisabledError, BuildError)
    monkeypatch.setenv("MIXED_GEMM_JIT", "block")
    path = build_fatbin("k", SRC, arch_flags=ARCH)  # now it may compile, into the cache
    monkeypatch.setenv("MIXED_GEMM_JIT", "0")
    assert build_fatbin("k", SRC, arch_flags=ARCH) == path  # a cached kernel needs no compile


def test_write_package_refuses_nothing(tmp_path):
    with pytest.raises(ValueError, match="at least one kernel"):
        write_package(tmp_path, "sm80", [], {"nvcc": "13.0", "cutlass": "4.2"})


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("strip") is None, reason="needs cc and strip")
def test_a_packaged_library_is_stripped_and_still_binds(tmp_path):
    """A kernel library goes into a package without its static symbols: smaller, the manifest's
    sha256 is the stored file's, and ctypes still finds the exported C functions."""
    import ctypes

    src = tmp_path / "lib.c"
    src.write_text("static int helper(int v) { return v + 1; }\nint mg_probe(int v) { return 2 * helper(v); }\n")
    lib = tmp_path / "k.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True)
    stored = packaged_bytes(lib)
    assert 0 < len(stored) < lib.stat().st_size
    assert packaged_bytes(lib) == stored  # the same bytes every time: one sha256 per build
    wheel = write_package(tmp_path / "dist", "sm90a", [PackagedKernel("k", "ab" * 32, lib)],
                          {"nvcc": "13.0.88", "cutlass": "4.2.0"})
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        manifest = json.loads(zf.read("mixed_gemm_kernels_sm90a/manifest.json"))
        entry = manifest["kernels"]["k"]
        data = zf.read(f"mixed_gemm_kernels_sm90a/{entry['file']}")
    assert data == stored and entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
    copy = tmp_path / "stored.so"
    copy.write_bytes(data)
    assert ctypes.CDLL(str(copy)).mg_probe(20) == 42


def test_a_packaged_fatbin_is_stored_as_built(tmp_path):
    blob = tmp_path / "k.fatbin"
    blob.write_bytes(bytes(range(256)) * 4)
    assert packaged_bytes(blob) == blob.read_bytes()


def test_write_package_makes_a_wheel_with_the_entry_point(tmp_path, tmp_cache, fake_compiler):
    path = build_fatbin("k", SRC, arch_flags=ARCH)
    key = locate("k", SRC, ARCH)[0]
    wheel = write_package(tmp_path / "dist", "sm80", [PackagedKernel("k", key, path)],
                          {"nvcc": "13.0.88", "cutlass": "4.2.0"})
    assert wheel.name.startswith("mixed_gemm_kernels_sm80-") and wheel.name.endswith("-py3-none-any.whl")
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        eps = next(n for n in names if n.endswith("entry_points.txt"))
        assert "[mixed_gemm.kernels]\nsm80 = mixed_gemm_kernels_sm80" in zf.read(eps).decode()
        manifest = json.loads(zf.read("mixed_gemm_kernels_sm80/manifest.json"))
    assert manifest["kernels"]["k"]["key"] == key and manifest["arch"] == "sm80"
    assert f"mixed_gemm_kernels_sm80/{manifest['kernels']['k']['file']}" in names
    shutil.rmtree(tmp_path / "dist")
