"""Kernel shared libraries: built (or read from the kernel cache) and loaded with ctypes once per
process. For families whose host code builds the kernel's parameters (CUTLASS 3.x: TMA
descriptors are encoded on the host) the library holds the kernel, that host code and the launch."""
from __future__ import annotations

import ctypes
import threading
from typing import Callable, Dict, Sequence, Tuple

from ..compile import build_fatbin

_LIBRARIES: Dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def get_library(spec: Tuple[str, Callable[[], str], Sequence[str], Sequence[str]],
                bind: Callable[[ctypes.CDLL], ctypes.CDLL]) -> ctypes.CDLL:
    """The loaded library of ``spec = (name, source thunk, arch flags, template dirs)``, with
    ``bind`` applied once (it sets the functions' ctypes signatures). Names derive from configs,
    so the name identifies the library; a library serves every device (its functions act on the
    thread's current CUDA context)."""
    lib = _LIBRARIES.get(spec[0])
    if lib is None:
        with _LOCK:
            lib = _LIBRARIES.get(spec[0])
            if lib is None:
                name, source, arch_flags, template_dirs = spec
                path = build_fatbin(name, source(), arch_flags=arch_flags, template_dirs=template_dirs,
                                    output="shared")
                # RTLD_LOCAL (ctypes' default): every kernel library exports the same mg_* names.
                lib = _LIBRARIES[name] = bind(ctypes.CDLL(str(path)))
    return lib
