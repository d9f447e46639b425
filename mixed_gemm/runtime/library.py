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
                lib = _LIBRARIES[spec.name] = bind(ctypes.CDLL(str(build_spec(spec))))
    return lib
