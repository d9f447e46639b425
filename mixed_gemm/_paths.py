"""Where the package finds its data: templates, profiles and the kernel cache.

In a source checkout ``templates/`` and ``profiles/`` sit at the repository root; an installed wheel
carries them as ``mixed_gemm/templates`` and ``mixed_gemm/profiles`` (see pyproject.toml).
"""
from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"mixed_gemm data directory {name!r} not found next to {_PKG}")


def templates_dir() -> Path:
    return _data_dir("templates")


def profiles_dir() -> Path:
    return _data_dir("profiles")


def cache_dir() -> Path:
    """Kernel cache: ``$MIXED_GEMM_CACHE_DIR`` or ``~/.cache/mixed_gemm``."""
    env = os.environ.get("MIXED_GEMM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "mixed_gemm"
