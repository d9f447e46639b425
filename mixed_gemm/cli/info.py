"""``mixed-gemm info``: versions and paths of everything a kernel build and launch depends on."""
from __future__ import annotations

import argparse
import platform
import sys
from typing import Callable

from .._versions import cutlass as _cutlass
from .._versions import driver as _driver_version
from .._versions import nvcc as _nvcc
from .._versions import torch_cuda as _torch_cuda
from .._versions import torch_version as _torch_version
from ..version import __version__


def _probe(fn: Callable[[], str]) -> str:
    # `info` is what people run when something is broken, so one failing probe must not hide the
    # others (or turn the exit code non-zero).
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return f"unavailable ({type(exc).__name__}: {exc})"


def _gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return ["no CUDA GPU visible"]
    lines = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        lines.append(
            f"{i}: {props.name}, compute capability {props.major}.{props.minor} "
            f"(sm_{props.major}{props.minor}), {props.total_memory / 2**30:.1f} GiB"
        )
    return lines


def _families() -> list[str]:
    """Each kernel family (dense, then grouped) and whether it runs on each visible GPU (with the
    reason when not)."""
    import torch

    from ..kernels import ALL_FAMILIES as FAMILIES

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines = []
    for fam in FAMILIES:
        if not count:
            lines.append(f"{fam.name}: layout {fam.layout}; no CUDA GPU visible")
            continue
        for i in range(count):
            ok, why = fam.supports(i)
            lines.append(f"{fam.name}: layout {fam.layout}; cuda:{i} " + ("available" if ok else f"unavailable ({why})"))
    return lines


def _path_of(name: str) -> Callable[[], str]:
    def probe() -> str:
        from .. import _paths

        return str(getattr(_paths, name)())

    return probe


def _kernel_packages() -> list[str]:
    from ..compile import packages

    return packages.summary() or ["none installed (mixed-gemm build --package DIR --arch ARCH makes one)"]


def _compiling() -> str:
    """Whether a kernel missing from the packages and the cache could be compiled here, and when."""
    from ..compile import JIT_ENV, jit_mode, toolchain

    tools, missing = toolchain()
    mode = jit_mode()
    can = (f"possible (nvcc {tools['nvcc']}, CUTLASS {tools['cutlass']})" if tools
           else f"not possible here ({missing.splitlines()[0]})")
    when = {"async": "in the background while a packaged or cached kernel runs",
            "block": "on the calling thread", "off": "never: a missing kernel is an error"}[mode]
    return f"{can}; {JIT_ENV}={mode}: {when}"


def run_info(args: argparse.Namespace) -> int:
    """Print versions and paths of everything a kernel build and launch depends on."""
    from pathlib import Path

    rows: list[tuple[str, str | list[str]]] = [
        ("mixed_gemm", f"{__version__} ({Path(__file__).resolve().parents[1]})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("torch", _probe(_torch_version)),
        ("CUDA runtime (torch)", _probe(_torch_cuda)),
        ("CUDA driver", _probe(_driver_version)),
        ("nvcc", _probe(_nvcc)),
        ("CUTLASS headers", _probe(_cutlass)),
    ]
    try:
        gpus: str | list[str] = _gpus()
    except Exception as exc:  # noqa: BLE001
        gpus = f"unavailable ({type(exc).__name__}: {exc})"
    try:
        families: str | list[str] = _families()
    except Exception as exc:  # noqa: BLE001
        families = f"unavailable ({type(exc).__name__}: {exc})"
    rows += [
        ("GPU", gpus),
        ("kernel families", families),
        ("templates", _probe(_path_of("templates_dir"))),
        ("profiles", _probe(_path_of("profiles_dir"))),
        ("kernel cache", _probe(_path_of("cache_dir"))),
    ]
    try:
        pkgs: str | list[str] = _kernel_packages()
    except Exception as exc:  # noqa: BLE001
        pkgs = f"unavailable ({type(exc).__name__}: {exc})"
    rows += [("kernel packages", pkgs), ("compiling", _probe(_compiling))]
    width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        values = value if isinstance(value, list) else [value]
        for j, line in enumerate(values):
            print(f"{label if j == 0 else '':<{width}}{line}")
    return 0


def add_info_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "info", help="show versions of the toolchain, the GPU, the kernel families it runs and the cache directory"
    )
    parser.set_defaults(func=run_info)
    return parser
