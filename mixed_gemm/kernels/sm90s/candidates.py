"""The sm90s schedules ``mixed-gemm profile`` tries for one problem: for 9 <= M <= 512, the
catalog token tiles that M fills (the smallest TN >= M, capped at 256, and the one below it),
every catalog kernel of those tiles (CTAs per SM, cluster, phase offset, half issue; a 1xS cluster
only where its slices fit one wave), each with the split factor chosen per shape (``auto``),
stream-K (``sk``, kernels without a K cluster or phase offset) where the tiles exceed one wave and are
not whole waves or, from COMPUTE_M on, fill less than one, and, where the tiles alone give at least
two waves, one CTA per tile (``dp``). Past 512 (prefill), the tiles that hide the conversion under
the tensor work (the wgmma probe, docs/notes/serving-mainloop.md: 256 tokens a tile, or three or
four consumer warpgroups of 128), ``auto`` (one CTA per tile once the tiles fill the SMs)."""
from __future__ import annotations

from typing import List

from .catalog import catalog_shapes
from .config import Sm90sConfig

FROM_M, TO_M = 9, 512
COMPUTE_M = 256         # from here a Llama-3 shape's time is its FLOPs at the tensor rate (the limit's max)
# Past TO_M: measured on an H200 at M = 4096 (2026-11-28, serving-mainloop.md) against the profile's
# dequantize + cuBLAS, 3-9% faster on the four shapes it held; the 4x1 cluster lost 7-20% (not offered).
# int8's catalog has the 256-token tile at TK = 64.
PREFILL_SHAPES = (((128, 256, 128), (1, 1), False), ((128, 256, 128), (2, 1), False), ((128, 256, 128), (2, 1), True),
                  ((256, 128, 64), (1, 1), False), ((128, 256, 64), (1, 1), False), ((128, 256, 64), (2, 1), False),
                  ((192, 128, 64), (1, 1), False), ((192, 128, 128), (1, 1), False))


def candidate_schedules(m: int, n: int, k: int, sms: int, bits: int = 4) -> List[str]:
    if m > TO_M:
        catalog = {shape[:4] for shape in catalog_shapes(bits) if not shape[4] and not shape[5]}
        return [Sm90sConfig(bits=bits, tile=tile, cluster=cluster, phased=phased).schedule
                for tile, cluster, phased in PREFILL_SHAPES if (tile, 1, cluster, phased) in catalog]
    if m < FROM_M:
        return []
    shapes = catalog_shapes(bits)
    tns = sorted({shape[0][1] for shape in shapes})
    fit = next((tn for tn in tns if tn >= m), tns[-1])
    keep = {fit} | {tn for tn in tns if tn < fit and tns.index(tn) == tns.index(fit) - 1}
    out: List[str] = []
    for tile, ctas, cluster, phased, half_issue, in_flight in shapes:
        if tile[1] not in keep:
            continue
        base = Sm90sConfig(bits=bits, tile=tile, ctas_per_sm=ctas, cluster=cluster, phased=phased,
                           half_issue=half_issue, in_flight=in_flight)
        tiles, slots = base.tiles(m, n), sms * ctas
        if not base.slices_fit_one_wave(m, n, sms):  # every such 1xS cluster lost (serving-mainloop.md)
            continue
        out.append(base.schedule)  # auto
        # Stream-K past one wave; within one it read 5-30% slower than auto on every shape tried at
        # M <= 128, where the weight's bytes bound the time (docs/notes/serving-mainloop.md,
        # "Stream-K"). From COMPUTE_M on the tiles' tensor work bounds it, and fewer tiles than slots
        # leave SMs idle that stream-K's k ranges would fill: timed there within one wave too (it lost
        # on every shape at M 256-512 as well, 8-25%: two segments a CTA cost more than auto's split).
        past_one_wave = tiles > slots and tiles % slots
        # A Cx1 cluster streams as one: its C row tiles share each x stage (multicast), which the
        # CTAs of cluster (1, 1) each read from L2 alone.
        if cluster[1] == 1 and not phased and (past_one_wave or (m >= COMPUTE_M and tiles < slots)):
            out.append(base.replace(decomposition="sk").schedule)
        if tiles >= 2 * slots and cluster[1] == 1:
            out.append(base.replace(decomposition="dp").schedule)
    return out
