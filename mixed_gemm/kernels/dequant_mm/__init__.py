"""The ``dequant_mm`` family: the dequantize kernel writes the dense weight (at ~96% of copy
bandwidth on the H100), then cuBLAS multiplies (torch.mm). For large M, where cuBLAS's Hopper
kernels outrun any mma.sync kernel and the dequantization is amortized over many rows, and for
what the tile families cannot take (group 32 on the H100). It reads every weight layout, with a
dequantize kernel each (``sm80``: dequant_kernel.cuh; ``sm90a`` and ``lowbit`` (1-3 bits, 1:2-sparse
7 bits, the one layout of those widths): dequant_sm90a.cuh), so every M runs for every width."""
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
from ..gemv import lowbit_layout
from ..sm90a import layout as sm90a_layout
from .abi import DEQUANT_ARGS_BYTES, DEQUANT_SM90A_ARGS_BYTES, DequantArgs, DequantSm90aArgs
from .config import LOWBIT_BITS, SCHEDULES, DequantMMConfig

FROM_M = 128  # the profiler times it from here up (below, the weight's bytes dominate)
# Low-bit weights have no tile family: gemv's 16-32-token kernels are the only other choice, and at
# 32 tokens they ran 0.34-1.2x of cuBLAS fp16 (docs/notes/dequant-mm.md), so dequantize + cuBLAS competes sooner.
FROM_M_LOWBIT = 16


class DequantMMFamily(Family):
    name = "dequant_mm"
    config_class = DequantMMConfig
    layout = sm80_layout.NAME
    sets_layout = False  # it reads whichever layout the tile families of the GPU chose
    arch_flags = sm80.Sm80Family.arch_flags  # the same GPUs as the sm80 kernels it stands in for
    min_capability = (8, 0)

    def layout_of(self, config: DequantMMConfig) -> str:
        return config.layout

    def catalog(self) -> List[DequantMMConfig]:
        return [DequantMMConfig(dtype=d, bits=b, zero_mode=z) for d, b, z in WEIGHT_KINDS] + \
            [DequantMMConfig(dtype=d, bits=b, layout=sm90a_layout.NAME) for d in DTYPES for b in (4, 8)] + \
            [DequantMMConfig(dtype=d, bits=b, layout=lowbit_layout.NAME) for d in DTYPES for b in LOWBIT_BITS]

    @staticmethod
    def _layout(problem: Problem) -> str:
        return problem.layout.split("+")[0]

    def candidates(self, problem: Problem, sms: int) -> List[str]:
        start = FROM_M_LOWBIT if self._layout(problem) == lowbit_layout.NAME else FROM_M
        return [SCHEDULES.get(self._layout(problem), SCHEDULES["sm80"])] if problem.m >= start else []

    def heuristic(self, problem: Problem, sms: int) -> DequantMMConfig:
        # Last in the registry's order: it takes whatever the families before it pass on.
        layout = self._layout(problem)
        return DequantMMConfig(**problem.kind, layout=layout if layout in SCHEDULES else "sm80")

    def for_layout(self, config: DequantMMConfig, problem: Problem) -> DequantMMConfig:
        layout = self._layout(problem)
        if config.layout in problem.layout.split("+") or layout not in SCHEDULES:
            return config
        return DequantMMConfig(dtype=config.dtype, bits=config.bits, zero_mode=config.zero_mode, layout=layout)

    def render(self, config: DequantMMConfig) -> str:
        if config.layout != "sm80":
            kernel = config.kernel
            return render_template(
                "dequant_mm/dequant_sm90a.cu.j2",
                family=self.name, config=repr(kernel), name=kernel.kernel_name, element=DTYPES[kernel.dtype][0],
                bits=kernel.bits, threads=kernel.threads, args_bytes=DEQUANT_SM90A_ARGS_BYTES,
                constants=constant_checks(), lowbit_constants=lowbit_layout.constant_checks(kernel.bits),
            )
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
        atoms = config.layout != "sm80"  # the sm90a and lowbit layouts: one kernel (dequant_sm90a.cuh)
        self.fn = module.function(config.kernel_name, DequantSm90aArgs if atoms else DequantArgs, config.threads)

    def __call__(self, w, y: torch.Tensor, stream: int) -> None:
        if self.config.layout != "sm80":
            return self._atoms(w, y, stream)
        fn = self.fn
        with fn.lock:
            a = fn.args
            a.b, a.scales = w.b.data_ptr(), w.scales.data_ptr()
            a.zeros = 0 if w.zeros is None else w.zeros.data_ptr()
            a.out = y.data_ptr()
            a.n, a.k, a.n_pad, a.k16, a.ldo = w.n, w.k, w.n_pad, w.k16, w.k
            a.group_shift, a.num_groups = w.group_shift, w.num_groups
            fn.launch(self.config.grid(w.n_pad, w.k16), stream)


    def _atoms(self, w, y: torch.Tensor, stream: int) -> None:
        b, scales, zeros, n_pad, _ = w.parts[self.config.layout]
        fn = self.fn
        with fn.lock:
            a = fn.args
            a.b, a.scales, a.zeros, a.out = b.data_ptr(), scales.data_ptr(), zeros.data_ptr(), y.data_ptr()
            a.n, a.k, a.strips, a.katoms, a.ldo = w.n, w.k, n_pad // 16, w.k16, w.k
            a.group_shift, a.num_groups = w.group_shift, w.num_groups
            fn.launch(self.config.grid(n_pad, w.k16), stream)


class DequantMMLauncher:
    def __init__(self, dequantizer: Dequantizer):
        self.dequantize = dequantizer

    def __call__(self, x, w, bias, y, m: int, stream: int, residual=None) -> None:
        # The dense weight lives in per-stream scratch: no allocation per call, and none in a
        # CUDA-graph pool (torch.mm below runs on the same stream, so reuse is ordered).
        dense = scratch(y.device.index, stream, (w.n, w.k), w.dtype)
        self.dequantize(w, dense, stream)
        x2, y2 = x.reshape(m, w.k), y.view(m, w.n)
        if residual is not None:  # cuBLAS adds it (beta = 1); the bias, if any, after
            torch.addmm(residual.view(m, w.n), x2, dense.t(), out=y2)
            if bias is not None:
                y2.add_(bias)
        elif bias is None:
            torch.mm(x2, dense.t(), out=y2)
        else:
            torch.addmm(bias, x2, dense.t(), out=y2)


FAMILY = DequantMMFamily()

__all__ = ["FAMILY", "DequantMMConfig", "DequantMMFamily"]
