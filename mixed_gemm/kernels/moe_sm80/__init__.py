"""The ``moe_sm80`` family: the many-token side of a mixture-of-experts layer on Ampere and Ada:
the sm80 family's multistage mma.sync tile, reading the stacked sm90a-layout experts
(``ops.experts.PackedExperts``, the one copy ``prepack_experts`` makes on every GPU a grouped family
runs on), one launch per projection over every expert's rows (templates/moe_sm80/).

A call sorts the (token, slot) pairs by expert on the device (the fatbin's two route kernels, a
counting sort: ``kernels.moe_route``) and gathers their rows, or, fused configs, reads them by index
in the tile's cp.async loads; a CTA takes one BM x BN tile of one expert, found by a search over
the per-expert tile counts' prefix sums (written by the sort), so no count is read on the host and
the call runs under CUDA-graph capture. Gate|up is followed by SiLU(gate) * up in its epilogue, down
by the top-k weighted sum (a one-pass kernel of the same fatbin, or, fused, fp32 atomics in the
down epilogue). Compiled for sm_80 and sm_90 like the sm80 family, so the H100 runs it
too (its tests do); there ``moe_sm90a``, asked first, takes the same problems.
"""
from __future__ import annotations

from typing import List

from ...codegen import render_template
from ..base import OK, SM80_UP_FLAGS, GroupedFamily, MoeProblem, Verdict
from ..common import DTYPES, ZERO_MODES, grouped_constant_checks
from ..sm90a import layout
from ..moe_route import GATHER_UNROLL, MAX_PAIRS, SORT_ARGS_BYTES, SORT_MAX_EXPERTS, SORT_THREADS, sort_limits
from .abi import BAND, COMBINE_ARGS_BYTES, GATHER_ARGS_BYTES, GROUPED_ARGS_BYTES, ROUTE_THREADS, ROUTE_VEC
from .candidates import candidate_schedules
from .catalog import default_catalog
from .config import MoeSm80Config
from .heuristics import heuristic_config
from .launch import MoeSm80Launcher



class MoeSm80Family(GroupedFamily):
    name = "moe_sm80"
    config_class = MoeSm80Config
    layout = layout.NAME
    sets_layout = False  # it reads the sm90a copy prepack_experts makes
    arch_flags = SM80_UP_FLAGS
    min_capability = (8, 0)

    def grouped_rules(self, config: MoeSm80Config, problem: MoeProblem) -> Verdict:
        if problem.n % 8 or problem.k % 8:
            return False, (f"N and K must be multiples of 8 (rows of x and of the output are copied and stored in "
                           f"16-byte units), got N={problem.n}, K={problem.k}")
        g = problem.group_size
        if g not in (-1, problem.k) and (g < 32 or g & (g - 1)):
            return False, f"group size {g} must be a power of two >= 32, or per-channel (the tile's group rows)"
        if problem.stage == "w13" and problem.n % 2:
            return False, f"gate|up: N = 2I must be even, got N={problem.n}"
        ok, why = sort_limits(problem.pairs, problem.experts)
        if not ok:
            return False, why
        tiles = (-(-problem.pairs // config.tile[0]) + problem.experts) * -(-problem.n // config.tile[1])
        if tiles > MAX_PAIRS:  # tile indices are 32-bit in the kernel too
            return False, f"at most {MAX_PAIRS} CTAs in the grouped grid ((ceil(pairs / BM) + E) x N tiles), got {tiles}"
        return OK

    def catalog(self) -> List[MoeSm80Config]:
        return default_catalog()

    def candidates(self, problem, sms: int) -> List[str]:
        return candidate_schedules(problem) if isinstance(problem, MoeProblem) else []

    def heuristic(self, problem, sms: int):
        return heuristic_config(problem) if isinstance(problem, MoeProblem) else None

    def render(self, config: MoeSm80Config) -> str:
        kernel = config.kernel
        (bm, bn, bk), (wm, wn, wk) = kernel.tile, kernel.warps
        return render_template(
            "moe_sm80/kernel.cu.j2",
            family=self.name, config=repr(kernel), name=kernel.kernel_name,
            element=DTYPES[kernel.dtype][0], bits=kernel.bits, zero_mode_id=ZERO_MODES["int"],
            bm=bm, bn=bn, bk=bk, warps_m=wm, warps_n=wn, warps_k=wk, stages=kernel.stages,
            threads=kernel.threads, smem_bytes=kernel.smem_bytes, grouped_args_bytes=GROUPED_ARGS_BYTES,
            combine_args_bytes=COMBINE_ARGS_BYTES, gather_args_bytes=GATHER_ARGS_BYTES, sort_args_bytes=SORT_ARGS_BYTES,
            sort_threads=SORT_THREADS, sort_max_experts=SORT_MAX_EXPERTS, gather_unroll=GATHER_UNROLL, band=BAND, fused=kernel.fused,
            route_threads=ROUTE_THREADS, route_vec=ROUTE_VEC, constants=grouped_constant_checks(),
        )

    def launcher(self, config: MoeSm80Config, device_index: int) -> MoeSm80Launcher:
        return MoeSm80Launcher(config, self.build_spec(config), device_index)


FAMILY = MoeSm80Family()

__all__ = ["FAMILY", "MoeSm80Config", "MoeSm80Family"]
