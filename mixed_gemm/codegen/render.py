"""Render a KernelConfig into a CUDA source file from templates/kernel.cu.j2."""
from __future__ import annotations

import functools

import jinja2

from .. import __version__
from .._paths import templates_dir
from .abi import GEMM_ARGS_BYTES
from .config import ZERO_MODES, KernelConfig


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=None)
def render(config: KernelConfig) -> str:
    """The complete .cu source of ``config``; deterministic (a pure function of config and templates)."""
    bm, bn, bk = config.tile
    wm, wn, wk = config.warps
    return _env().get_template("kernel.cu.j2").render(
        version=__version__,
        name=config.name,
        config=repr(config),
        bits=config.bits,
        zero_mode_id=ZERO_MODES[config.zero_mode],
        bm=bm, bn=bn, bk=bk,
        warps_m=wm, warps_n=wn, warps_k=wk,
        stages=config.stages,
        threads=config.threads,
        smem_bytes=config.smem_bytes,
        args_bytes=GEMM_ARGS_BYTES,
    )
