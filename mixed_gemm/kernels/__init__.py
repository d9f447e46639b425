"""Kernel families and their registry.

``FAMILIES`` lists the dense families in priority order: when no override or profile decides,
selection asks each in turn for its heuristic choice and takes the first it can implement.
``GROUPED_FAMILIES`` lists the grouped (mixture-of-experts) families, whose problems are
:class:`~.base.MoeProblem`: ``ops.moe_grouped`` chooses among them, and dense selection, profiles,
the profiler and kernel-package coverage never walk them. Name lookup (``family``,
``parse_schedule``), the catalog walkers (``mixed-gemm build --all``, ``generate``) and ``info``
walk both (``ALL_FAMILIES``). Adding a family: a sub-package here with a :class:`~.base.Family`
(see docs/DESIGN.md), its ``templates/<name>/``, and one entry below.
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from . import base, dequant_mm, gemv, moe_gemv, moe_sm80, moe_sm90a, moe_sm90s, sm80, sm90a, sm90s
from .base import OK, Family, MoeProblem, Problem, Verdict, compute_capability

# sm90s is asked first, but its heuristic passes unless switched on (kernels/sm90s/heuristics.py)
# until the H100 profile says where it wins; profiles naming it are used either way.
FAMILIES: Tuple[Family, ...] = (sm90s.FAMILY, sm90a.FAMILY, gemv.FAMILY, sm80.FAMILY, dequant_mm.FAMILY)
# MoE projections, never in dense selection; asked in this order: the tile families pass at few rows
# per expert (moe_sm90a on the H100, moe_sm80 where it does not run), moe_gemv takes the rest;
# moe_sm90s (the dense sm90s mainloop over the experts' rows) runs only where a profile names it.
GROUPED_FAMILIES: Tuple[Family, ...] = (moe_sm90a.FAMILY, moe_sm90s.FAMILY, moe_sm80.FAMILY, moe_gemv.FAMILY)
ALL_FAMILIES: Tuple[Family, ...] = FAMILIES + GROUPED_FAMILIES
# The weight layouts families read, by name (one layout module per name). A PackedWeight holds one
# of them (layout_for: the one the tile family of its GPU reads), or, when asked for, sm80 plus
# a second copy. PRIMARY_LAYOUT is the CPU's (and any GPU's without a layout-setting family).
LAYOUTS: Dict[str, ModuleType] = {sm80.layout.NAME: sm80.layout, sm90a.layout.NAME: sm90a.layout,
                                   gemv.lowbit_layout.NAME: gemv.lowbit_layout}  # 1-3 bits, 1:2-sparse 7
PRIMARY_LAYOUT = sm80.layout.NAME
LEGACY_FAMILY = "sm80"  # a schedule without "family:" (profile format 1, old overrides)

_BY_NAME = {f.name: f for f in ALL_FAMILIES}


def family(name: str) -> Family:
    """The family called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"family: {name!r} is not one of {tuple(_BY_NAME)}") from None


def family_of(config) -> Family:
    """The family a config belongs to (its ``family`` attribute)."""
    name = getattr(config, "family", None)
    if name not in _BY_NAME:
        raise TypeError(f"config: expected a kernel family's config, got {type(config).__name__}")
    return _BY_NAME[name]


def split_schedule(text: str) -> Tuple[Family, str]:
    """``"family:schedule"`` -> (family, schedule). A bare schedule is the sm80 family's, except a
    family's own name (``dequant_mm``, whose one schedule is its name)."""
    name, sep, schedule = text.partition(":")
    if sep:
        return family(name), schedule
    if text in _BY_NAME:
        return _BY_NAME[text], text
    return _BY_NAME[LEGACY_FAMILY], text


def parse_schedule(text: str, *, dtype: str, bits: int, zero_mode: str):
    """The config of ``"family:schedule"`` (or a bare sm80 schedule) for one weight kind."""
    fam, schedule = split_schedule(text)
    return fam.from_schedule(schedule, dtype=dtype, bits=bits, zero_mode=zero_mode)


def qualified(config) -> str:
    """``"family:schedule"`` of a config: what profiles store and overrides take."""
    return f"{config.family}:{config.schedule}"


def available(device_index: int) -> List[Tuple[Family, Verdict]]:
    """Each dense family with ``supports(device_index)``, in priority order."""
    return [(f, f.supports(device_index)) for f in FAMILIES]


def layout_names(layout: str) -> Tuple[str, ...]:
    """The layouts a (possibly combined, ``"sm80+sm90a"``) layout string names, checked: one known
    layout, or ``"sm80"`` followed by one other (a second copy)."""
    return _layout_names(layout if isinstance(layout, str) else repr(layout))


@functools.lru_cache(maxsize=None)  # every PackedWeight (one per custom-op call when compiled) asks
def _layout_names(layout: str) -> Tuple[str, ...]:
    names = tuple(layout.split("+"))
    ok = all(n in LAYOUTS for n in names) and (
        len(names) == 1 or (len(names) == 2 and names[0] == PRIMARY_LAYOUT and names[1] != PRIMARY_LAYOUT))
    if not ok:
        raise ValueError(f"layout: must be one of {tuple(LAYOUTS)}, or {PRIMARY_LAYOUT!r} followed by '+' and "
                         f"another (e.g. 'sm80+sm90a', two copies), got {layout!r}")
    return names


def layout_on(capability: Optional[Tuple[int, int]], bits: int = 4) -> str:
    """:func:`layout_for` of a GPU of compute ``capability`` (None: the CPU)."""
    if bits in LAYOUTS["lowbit"].BITS:
        return "lowbit"
    for f in FAMILIES:
        if f.sets_layout and f.runs_on(capability)[0]:
            return f.layout
    return PRIMARY_LAYOUT


def layout_for(device_index: Optional[int], bits: int = 4) -> str:
    """The layout prepack uses on a device: one copy, the layout of the first family (in priority
    order) that runs there and sets the layout (the tile families; the decode and dequantize
    families read the layouts they find): ``"sm90a"`` on the H100, whose every family (gemv at
    M <= 32, sm90a above, dequant_mm for what the tiles cannot take) reads it; ``"sm80"`` on
    Ampere/Ada and the CPU (``None``). ``prepack(..., layout="sm80+sm90a")`` still holds both on
    request (the sm80 tiles then compete at every M). 1-3-bit and 1:2-sparse 7-bit weights hold
    ``"lowbit"`` on every device (only the gemv and dequantize kernels read those widths)."""
    return layout_on(None if device_index is None else base.compute_capability(device_index), bits)


__all__ = ["ALL_FAMILIES", "FAMILIES", "GROUPED_FAMILIES", "LAYOUTS", "OK", "PRIMARY_LAYOUT", "layout_names", "Family",
           "MoeProblem", "Problem", "Verdict", "available", "compute_capability",
           "family", "family_of", "layout_for", "layout_on", "parse_schedule", "qualified", "split_schedule"]
