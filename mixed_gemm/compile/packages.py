"""Installed kernel packages: prebuilt, verified kernel binaries found before the cache and nvcc.

A kernel package is a wheel (``mixed-gemm build --package DIR --arch sm90a`` writes one, e.g.
``mixed-gemm-kernels-sm90a``) holding one Python package with ``manifest.json`` and the binaries.
It announces itself through the entry point group ``mixed_gemm.kernels`` (name: the arch, value:
its module), so installing the wheel is all a user does. The manifest::

    {"format": 1, "distribution": "mixed-gemm-kernels-sm90a", "version": "0.1.0", "arch": "sm90a",
     "toolchain": {"nvcc": "13.0.88", "cutlass": "4.2.0"}, "mixed_gemm": "0.1.0",
     "kernels": {"<kernel name>": {"key": "<cache key>", "file": "kernels/<file>",
                                    "sha256": "...", "size": 123}}}

A binary is used only for the exact cache key the running code computes (source, flags and the
included templates: :func:`~.cache.cache_key`), and only after its size and sha256 match the
manifest. Anything wrong -- an unreadable manifest, a missing, truncated or tampered binary, a
fatbin lacking the arch its flags name, a package built by a CUDA newer than the driver, two
packages holding different bytes for one kernel -- warns once (:class:`KernelPackageWarning`,
naming the package and the rule) and that source is skipped: the cache or nvcc comes next.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .fatbin import fatbin_targets

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mixed_gemm.kernels"
MANIFEST = "manifest.json"
FORMAT = 1


class KernelPackageWarning(UserWarning):
    """An installed kernel package (or one of its kernels) was skipped; the message says why."""


@dataclass
class KernelPackage:
    """One installed kernel package, read from its manifest."""

    distribution: str
    version: str
    arch: str
    root: Path
    toolchain: dict
    kernels: Dict[str, dict] = field(repr=False)
    problem: str = ""  # why the whole package is skipped ("" when usable)

    @property
    def nbytes(self) -> int:
        return sum(int(e.get("size", 0)) for e in self.kernels.values())

    def describe(self) -> str:
        tools = ", ".join(f"{k} {v}" for k, v in sorted(self.toolchain.items())) or "unknown toolchain"
        text = (f"{self.distribution} {self.version}: arch {self.arch}, {len(self.kernels)} kernels, "
                f"{self.nbytes / 2**20:.1f} MiB, built with {tools} ({self.root})")
        return text + (f"; SKIPPED: {self.problem}" if self.problem else "")


def _warn(message: str) -> None:
    warnings.warn(message, KernelPackageWarning, stacklevel=4)


def _driver_cuda() -> Optional[Tuple[int, int]]:
    """The CUDA version the installed driver supports, or None without one (a CPU machine)."""
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
    except Exception:  # noqa: BLE001 - no libcuda.so raises from the import or the call
        return None
    return version // 1000, version % 1000 // 10


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text))[:2])


def _read(dist: str, module: str) -> Optional[KernelPackage]:
    spec = util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        _warn(f"kernel package {dist}: its entry point names module {module!r}, which is not installed")
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    try:
        data = json.loads((root / MANIFEST).read_text())
        if data.get("format") != FORMAT or not isinstance(data.get("kernels"), dict):
            raise ValueError(f"expected format {FORMAT} with a 'kernels' object")
        pkg = KernelPackage(distribution=str(data.get("distribution", dist)), version=str(data.get("version", "?")),
                            arch=str(data["arch"]), root=root, toolchain=dict(data.get("toolchain") or {}),
                            kernels=data["kernels"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _warn(f"kernel package {dist} ({root}): unreadable {MANIFEST}, skipped: {exc}")
        return None
    built = _version_tuple(pkg.toolchain.get("nvcc", ""))
    driver = _driver_cuda()
    if built and driver is not None and built > driver:
        # A cubin or library built by a newer CUDA than the driver supports fails to load.
        pkg.problem = (f"built with nvcc {pkg.toolchain['nvcc']}, newer than this driver's CUDA "
                       f"{driver[0]}.{driver[1]}; update the driver or install a package built with "
                       f"CUDA <= {driver[0]}.{driver[1]}")
        _warn(f"kernel package {pkg.distribution}: {pkg.problem}")
    return pkg


@functools.lru_cache(maxsize=None)
def installed() -> Tuple[KernelPackage, ...]:
    """The installed kernel packages (usable or not), in distribution-name order; read once per
    process (:func:`refresh` re-reads)."""
    found = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.value, e.name)):
        dist = ep.dist.name if getattr(ep, "dist", None) is not None else ep.value
        pkg = _read(dist, ep.value)
        if pkg is not None and all(p.root != pkg.root for p in found):
            found.append(pkg)
    return tuple(found)


_VERIFIED: Dict[Path, Optional[str]] = {}  # binary -> None when verified, else why not
_REPORTED = set()
_LOCK = threading.Lock()


def _verify(pkg: KernelPackage, name: str, entry: dict, arch_codes: Tuple[str, ...]) -> Tuple[Optional[Path], str]:
    try:
        path = (pkg.root / entry["file"]).resolve()
        if pkg.root.resolve() not in path.parents:
            return None, f"its file {entry['file']!r} lies outside the package"
        size, digest = int(entry["size"]), str(entry["sha256"])
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"its manifest entry is malformed ({exc})"
    with _LOCK:
        if path in _VERIFIED:
            why = _VERIFIED[path]
            return (path, "") if why is None else (None, why)
    try:
        data = path.read_bytes()
    except OSError as exc:
        why = f"its binary cannot be read ({exc})"
    else:
        if len(data) != size:
            why = f"its binary {path.name} has {len(data)} bytes, the manifest says {size} (truncated or replaced)"
        elif hashlib.sha256(data).hexdigest() != digest:
            why = f"its binary {path.name} does not match the manifest's sha256 (damaged or tampered)"
        elif path.suffix == ".fatbin":
            try:
                have = fatbin_targets(data)
                missing = [c for c in arch_codes if c not in have]
                why = f"its fatbin holds {have}, not the {missing} its flags build" if missing else ""
            except ValueError as exc:
                why = f"its fatbin is malformed ({exc})"
        else:
            why = ""
    with _LOCK:
        _VERIFIED[path] = why or None
    return (path, "") if not why else (None, why)


def _report(key: Tuple, message: str) -> None:
    with _LOCK:
        if key in _REPORTED:
            return
        _REPORTED.add(key)
    _warn(message)


def arch_codes(arch_flags) -> Tuple[str, ...]:
    """The machine-code targets (``sm_90a``) and PTX (``compute_90``) ``-gencode`` flags build."""
    codes = []
    for flag in arch_flags:
        m = re.search(r"[,\s]code=(\[[^\]]*\]|\w+)", flag)  # not the "code=" of "-gencode="
        if m:
            codes += [c for c in re.split(r"[,\[\]]", m.group(1)) if c]
    return tuple(codes)


def find(name: str, key: str, arch_flags=()) -> Optional[Path]:
    """The verified packaged binary of kernel ``name`` built for cache key ``key``, or None.
    Packages with a problem, or whose entry fails verification, are skipped with a warning; when
    two packages hold different verified bytes for the same kernel, neither is used."""
    hits: List[Tuple[KernelPackage, Path]] = []
    codes = arch_codes(arch_flags)
    for pkg in installed():
        entry = pkg.kernels.get(name)
        if pkg.problem or not isinstance(entry, dict) or entry.get("key") != key:
            continue
        path, why = _verify(pkg, name, entry, codes)
        if path is None:
            _report((pkg.root, name), f"kernel package {pkg.distribution}: {name} skipped: {why}; "
                                      "using the kernel cache or nvcc instead")
            continue
        hits.append((pkg, path))
    if len({pkg.kernels[name]["sha256"] for pkg, _ in hits}) > 1:
        names = ", ".join(f"{pkg.distribution} {pkg.version}" for pkg, _ in hits)
        _report(("conflict", name), f"kernel packages {names} hold different binaries for {name}: none is "
                                    "used (uninstall one); using the kernel cache or nvcc instead")
        return None
    return hits[0][1] if hits else None


def refresh() -> None:
    """Forget what was read and verified (after installing or removing a package in-process)."""
    installed.cache_clear()
    with _LOCK:
        _VERIFIED.clear()
        _REPORTED.clear()


def summary() -> List[str]:
    """One line per installed kernel package, for ``mixed-gemm info`` and error messages."""
    return [pkg.describe() for pkg in installed()]
