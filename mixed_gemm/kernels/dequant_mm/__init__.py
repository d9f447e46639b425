"""The ``dequant_mm`` family: the dequantize kernel writes the dense weight (at ~96% of copy
bandwidth on the H100), then cuBLAS multiplies (torch.mm). For large M, where cuBLAS's Hopper
kernels outrun any mma.sync kernel and the dequantization is amortized over many rows. It reads the
``sm80`` weight layout (the dequantize kernel walks the same atoms)."""
from __future__ import annotations

from typing import List

import torch

from ...codegen import render_template
from ...runtime import get_module, scratch
from ..base import Family, Problem
from ..common import DTYPES, ZERO_MODES, constant_checks
from .. import sm80
from ..sm80 import layout as sm80_layout
from ..sm80.catalog import WEIGHT_KINDS
from .abi import DEQUANT_ARGS_BYTES, DequantArgs
from .config import SCHEDULE, DequantMMConfig

FROM_M = 128  # the profiler times it from here up (below, the weight's bytes dominate)


class DequantMMFamily(Family):
    name = "dequant_mm"
    config_class = DequantMMConfig
    layout = sm80_layout.NAME
    arch_flags = sm80.Sm80Family.arch_flags  # the same GPUs as the sm80 kernels it stands in for
    template_dirs = ("common", "dequant_mm")
    min_capability = (8, 0)

    def catalog(self) -> List[DequantMMConfig]:
        return [DequantMMConfig(dtype=d, bits=b, zero_mode=z) for d, b, z in WEIGHT_KINDS]

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        return [SCHEDULE] if problem.m >= FROM_M else []

    def heuristic(self, problem: Problem, sms: int) -> DequantMMConfig:
        # Last in the registry's order: it takes whatever the families before it pass on.
        return DequantMMConfig(**problem.kind)

    def render(self, config: DequantMMConfig) -> str:
        return render_template(
            "dequant_mm/dequant.cu.j2",
            family=self.name, config=repr(config), name=config.kernel_name,
            element=DTYPES[config.dtype][0], bits=config.bits, zero_mode_id=ZERO_MODES[config.zero_mode],
            threads=config.threads, smem_bytes=config.smem_bytes, args_bytes=DEQUANT_ARGS_BYTES,
            constants=constant_checks(),
        )

    def dequantizer(self, config: DequantMMConfig, device_index: int) -> "Dequantizer":
        return Dequantizer(config, get_module(self.build_spec(config), device_index))

    def launcher(self, config: DequantMMConfig, device_index: int) -> "DequantMMLauncher":
        return DequantMMLauncher(self.dequantizer(config, device_index))


class Dequantizer:
    """Writes a weight's dense ``(N, K)`` values, in its stored K order, into a contiguous tensor."""

    def __init__(self, config: DequantMMConfig, module):
        self.config = config
        self.fn = module.function(config.kernel_name, DequantArgs, config.threads)

    def __call__(self, w, y: torch.Tensor, stream: int) -> None:
        fn = self.fn
        with fn.lock:
            a = fn.args
            a.b, a.scales = w.b.data_ptr(), w.scales.data_ptr()
            a.zeros = 0 if w.zeros is None else w.zeros.data_ptr()
            a.out = y.data_ptr()
            a.n, a.k, a.n_pad, a.k16, a.ldo = w.n, w.k, w.n_pad, w.k16, w.k
            a.group_shift, a.num_groups = w.group_shift, w.num_groups
            fn.launch(self.config.grid(w.n_pad, w.k16), stream)


class DequantMMLauncher:
    def __init__(self, dequantizer: Dequantizer):
        self.dequantize = dequantizer

    def __call__(self, x, w, bias, y, m: int, stream: int) -> None:
        # The dense weight lives in per-stream scratch: no allocation per call, and none in a
        # CUDA-graph pool (torch.mm below runs on the same stream, so reuse is ordered).
        dense = scratch(y.device.index, stream, (w.n, w.k), w.dtype)
        self.dequantize(w, dense, stream)
        x2, y2 = x.reshape(m, w.k), y.view(m, w.n)
        if bias is None:
            torch.mm(x2, dense.t(), out=y2)
        else:
            torch.addmm(bias, x2, dense.t(), out=y2)


FAMILY = DequantMMFamily()

__all__ = ["FAMILY", "DequantMMConfig", "DequantMMFamily"]
