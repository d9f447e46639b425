"""Writing a kernel package: verified binaries + ``manifest.json`` as an installable wheel.

The wheel itself is built by setuptools (``pip wheel`` on a generated project, rendered from
``templates/package/``), so its metadata, RECORD and entry points are what pip expects. One
distribution per arch (``mixed-gemm-kernels-sm90a``) keeps the Python package small; the reader
is :mod:`.packages`.
"""
from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, NamedTuple

from ..codegen import render_template
from ..version import __version__
from .errors import BuildError
from .packages import ENTRY_POINT_GROUP, FORMAT, MANIFEST


class PackagedKernel(NamedTuple):
    name: str
    key: str
    path: Path  # a verified binary (from the cache, or another package)


def distribution_name(arch: str) -> str:
    return f"mixed-gemm-kernels-{arch}"


def module_name(arch: str) -> str:
    return f"mixed_gemm_kernels_{arch}"


def platform_tag(has_host_code: bool) -> str:
    """``any`` for fatbins alone; with kernel libraries (host code linked against this glibc),
    ``manylinux_<glibc>_<machine>``: they load on this glibc or a newer one."""
    if not has_host_code:
        return "any"
    libc, version = platform.libc_ver()
    if libc != "glibc" or not version:
        raise BuildError(f"kernel libraries built against {libc or 'an unknown C library'}: only glibc "
                         "(manylinux) wheels are written")
    major, minor = version.split(".")[:2]
    return f"manylinux_{major}_{minor}_{platform.machine()}"


def packaged_bytes(path: Path) -> bytes:
    """What a package stores for the binary at ``path``: a fatbin as it is; a kernel library without
    its static symbol table (``strip --strip-unneeded``: the dynamic symbols that ctypes binds, the
    embedded fatbin and its registration stay). The host side of an sm90a library is about a third
    of its file and mostly symbols (-35% of an xz-compressed sm90s library). Where binutils' strip is
    missing, the library as it is."""
    tool = shutil.which("strip") if path.suffix == ".so" else None
    if tool is None:
        return path.read_bytes()
    with tempfile.TemporaryDirectory(prefix="mixed-gemm-strip-") as tmp:
        out = Path(tmp) / path.name
        proc = subprocess.run([tool, "--strip-unneeded", "-o", str(out), str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"strip failed on {path}: {proc.stderr.strip()}")
        return out.read_bytes()


def write_package(out_dir, arch: str, kernels: Iterable[PackagedKernel], toolchain: dict,
                  version: str = __version__) -> Path:
    """Build the wheel of ``kernels`` for ``arch`` into ``out_dir``; returns its path. Each binary
    is stored as ``kernels/<name>-<key16><suffix>`` (:func:`packaged_bytes`) and listed in the
    manifest with its cache key, size and sha256 of the stored file (what the reader verifies)."""
    kernels = list(kernels)
    if not kernels:
        raise ValueError("kernels: a kernel package needs at least one kernel")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    module = module_name(arch)
    with tempfile.TemporaryDirectory(prefix="mixed-gemm-package-") as tmp:
        project = Path(tmp)
        pkg_dir = project / module
        (pkg_dir / "kernels").mkdir(parents=True)
        entries = {}
        for k in sorted(kernels, key=lambda k: k.name):
            data = packaged_bytes(k.path)
            file = f"kernels/{k.name}-{k.key[:16]}{k.path.suffix}"
            (pkg_dir / file).write_bytes(data)
            entries[k.name] = {"key": k.key, "file": file, "size": len(data),
                               "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {"format": FORMAT, "distribution": distribution_name(arch), "version": version, "arch": arch,
                    "toolchain": toolchain, "mixed_gemm": __version__, "kernels": entries}
        (pkg_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        values = dict(distribution=distribution_name(arch), version=version, arch=arch, module=module,
                      count=len(entries), nvcc=toolchain.get("nvcc", "?"), cutlass=toolchain.get("cutlass", "?"),
                      platform=platform_tag(any(k.path.suffix == ".so" for k in kernels)), group=ENTRY_POINT_GROUP)
        (pkg_dir / "__init__.py").write_text(render_template("package/init.py.j2", **values))
        (project / "pyproject.toml").write_text(render_template("package/pyproject.toml.j2", **values))
        (project / "setup.cfg").write_text(render_template("package/setup.cfg.j2", **values))
        build = project / "dist"
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--no-cache-dir", "-q", "-w", str(build), str(project)],
                              capture_output=True, text=True)
        wheels = list(build.glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise BuildError(f"pip wheel failed for the {arch} kernel package (exit {proc.returncode}; it needs "
                             f"pip and setuptools>=70.1):\n{proc.stdout}\n{proc.stderr}")
        target = out_dir / wheels[0].name
        shutil.copyfile(wheels[0], target)
    return target
