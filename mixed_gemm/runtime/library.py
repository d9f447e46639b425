"""Kernel shared libraries: built (or read from the kernel cache) and loaded with ctypes once per
process. For families whose host code builds the kernel's parameters (CUTLASS 3.x: TMA
descriptors are encoded on the host) the library holds the kernel, that host code and the launch."""
from __future__ import annotations

import ctypes
import threading
from typing import Callable, Dict

from ..compile import BuildSpec, build_spec

_LIBRARIES: Dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def get_library(spec: BuildSpec, bind: Callable[[ctypes.CDLL], ctypes.CDLL]) -> ctypes.CDLL:
    """The loaded library of ``spec`` (``output="shared"``), with ``bind`` applied once (it sets the functions' ctypes signatures). Names derive from configs,
    so the name identifies the library; a library serves every device (its functions act on the
    thread's current CUDA context)."""
    lib = _LIBRARIES.get(spec.name)
    if lib is None:
        with _LOCK:
            lib = _LIBRARIES.get(spec.name)
            if lib is None:
                # RTLD_LOCAL (ctypes' default): every kernel library exports the same mg_* names.
                lib = _LIBRARIES[spec.name] = bind(_open(spec.name, str(build_spec(spec))))
    return lib


class LibraryLoadError(OSError):
    """A kernel library the dynamic linker could not open (most often: no CUDA runtime of its major
    version in the process)."""


def _open(name: str, path: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        # Libraries link the shared cudart (compile/nvcc.py OUTPUTS): torch's CUDA build has loaded
        # it by the time a kernel runs, unless torch was built for another CUDA major version.
        hint = (" Kernel libraries bind the shared CUDA runtime of the nvcc that built them; use a "
                "torch built for that CUDA major version, or put that libcudart on LD_LIBRARY_PATH."
                if "libcudart" in str(e) else "")
        raise LibraryLoadError(f"kernel library {name} could not be loaded: {e}.{hint}") from e


def signature_binder(signatures: Dict[str, tuple]) -> Callable[[ctypes.CDLL], ctypes.CDLL]:
    """A ``bind`` for :func:`get_library`: sets ``restype, argtypes = signatures[name]`` on each named
    function of a loaded kernel library (each family's ABI module lists its C functions)."""
    def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
        for name, (res, args) in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        return lib

    return bind


class LibraryMismatch(RuntimeError):
    """A kernel library that is not what its config says (ABI, shape): a stale cache entry or a bug."""


def open_library(spec: BuildSpec, bind: Callable[[ctypes.CDLL], ctypes.CDLL], info: Callable[[ctypes.CDLL], dict],
                 abi_version: int, expected: dict, device_index: int, describe: Callable[[int], str]):
    """``(library, its mg_info fields)`` for a kernel library family's launcher: loaded (:func:`get_library`),
    checked against ``abi_version`` and the ``expected`` mg_info fields (a field expected as 0 is not
    checked), and prepared on ``device_index`` (``mg_prepare``: module load, shared-memory opt-in;
    the CUDA runtime may synchronize the context to load a module, and neither belongs in a
    capture, so launchers are made before any capture). ``LibraryMismatch``
    names the library and the field that disagrees."""
    from .driver import primary_context

    lib = get_library(spec, bind)
    fields = info(lib)
    if fields["abi"] != abi_version:
        raise LibraryMismatch(f"{spec.name}: library ABI {fields['abi']}, expected {abi_version}; clear the kernel "
                              "cache entry")
    wrong = {k: (fields[k], v) for k, v in expected.items() if v and fields[k] != v}
    if wrong:
        raise LibraryMismatch(f"{spec.name}: the library was built otherwise than its config says "
                              f"(field: built, expected): {wrong}")
    with primary_context(device_index):
        rc = lib.mg_prepare()
    if rc:
        raise LibraryMismatch(f"{spec.name}: mg_prepare: {describe(rc)}")
    return lib, fields
