"""Render configs into CUDA sources from the Jinja templates in templates/."""
from __future__ import annotations

import functools
from typing import Union

import jinja2

from .. import __version__
from .._paths import templates_dir
from .abi import DEQUANT_ARGS_BYTES, GEMM_ARGS_BYTES, REDUCE_ARGS_BYTES
from .config import DTYPES, ZERO_MODES, DequantConfig, KernelConfig


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=None)
def render(config: Union[KernelConfig, DequantConfig]) -> str:
    """The complete .cu source of ``config``'s kernel; deterministic (config and templates only)."""
    common = dict(
        version=__version__,
        name=config.kernel_name,
        element=DTYPES[config.dtype][0],
        bits=config.bits,
        zero_mode_id=ZERO_MODES[config.zero_mode],
        threads=config.threads,
        smem_bytes=config.smem_bytes,
    )
    if isinstance(config, DequantConfig):
        return _env().get_template("dequant.cu.j2").render(config=repr(config), args_bytes=DEQUANT_ARGS_BYTES,
                                                           **common)
    kernel = config.kernel
    bm, bn, bk = kernel.tile
    wm, wn, wk = kernel.warps
    return _env().get_template("kernel.cu.j2").render(
        config=repr(kernel),
        bm=bm, bn=bn, bk=bk,
        warps_m=wm, warps_n=wn, warps_k=wk,
        stages=kernel.stages,
        inst_m=kernel.instruction[0], inst_n=kernel.instruction[1], inst_k=kernel.instruction[2],
        args_bytes=GEMM_ARGS_BYTES,
        reduce_args_bytes=REDUCE_ARGS_BYTES,
        **common,
    )
