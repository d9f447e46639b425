"""Which kernels ``matmul`` can select on a kind of GPU without a user profile: what a prebuilt
kernel package for that arch must hold (``mixed-gemm build --package DIR --arch sm90a``).

Selection is run, not imitated: :func:`~.selection.choose` for a GPU of the arch's compute
capability, with each shipped profile of such GPUs (the H100's and the H200's for sm90a), over
every weight kind the kernels serve (fp16/bf16; int4/int8 symmetric, integer zeros, float zeros,
offsets; the low-bit widths; groups 32/64/128 and per-channel), a grid of shapes (the profiled Llama-3 shapes and others around them:
a borrowed profile entry or a heuristic picks by shape) and every M bucket. Added to that: the
stand-ins an asynchronous cold call may run while the chosen kernel compiles (every family's
heuristic pick, and dequantize + cuBLAS for each weight kind and layout), and what each family
ships besides (``Family.packaged``: the sm90s catalog, whose heuristic is off by default).
"""
from __future__ import annotations

import json
from typing import Dict, Iterator, List, Optional, Tuple

from .._paths import profiles_dir
from ..kernels import ALL_FAMILIES, FAMILIES, GROUPED_FAMILIES, LAYOUTS, Family, Problem, family, layout_on, split_schedule
from ..kernels.common import DTYPES, ZERO_MODES
from ..kernels.router import FAMILY as ROUTER
from .heuristics import heuristic_choice
from .profiles import Profile
from .selection import choose

# Kernel package arch -> the compute capability its kernels serve, and the SMs its heuristics assume.
ARCHES: Dict[str, Tuple[Tuple[int, int], int]] = {"sm90a": ((9, 0), 132), "sm80": ((8, 0), 108)}
GROUPS = (32, 64, 128, -1)
TILE_BITS = (4, 8)
LOW_BITS = LAYOUTS["lowbit"].BITS
# (N, K): the eight Llama-3 8B/70B linear shapes, and others around them.
SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
          (57344, 8192), (8192, 28672), (1024, 1024), (2048, 2048), (2048, 8192), (14336, 2048),
          (128256, 4096), (5120, 5120))
M_BUCKETS = tuple(1 << i for i in range(15))  # 1 .. 16384: past the last heuristic row


def arch_capability(arch: str) -> Tuple[Tuple[int, int], int]:
    """``((major, minor), sms)`` of a kernel package arch; ``ValueError`` naming the known ones."""
    try:
        return ARCHES[arch]
    except KeyError:
        raise ValueError(f"arch: must be one of {tuple(ARCHES)}, got {arch!r}") from None


def shipped_profiles(capability: Tuple[int, int]) -> List[Profile]:
    """The shipped profiles of GPUs of ``capability`` (``profiles/*.json``, by name): the H100's and
    the H200's for 9.0. A kernel package for the arch serves each of those GPUs, and their
    selections differ where a profile's own entries replace its base's."""
    found = []
    for path in sorted(profiles_dir().glob("*.json")):
        try:
            gpu = json.loads(path.read_text()).get("gpu", {})
        except (OSError, ValueError):
            continue
        if str(gpu.get("compute_capability", "")) == f"{capability[0]}.{capability[1]}":
            found.append(Profile.load(path))
    return found


def shipped_profile(capability: Tuple[int, int]) -> Optional[Profile]:
    """The first (by name) of :func:`shipped_profiles`, or None."""
    found = shipped_profiles(capability)
    return found[0] if found else None


def weight_kinds() -> Iterator[Tuple[str, int, str]]:
    """``(dtype, bits, zero mode)`` of every weight kind prepack makes."""
    for dtype in DTYPES:
        for bits in TILE_BITS + LOW_BITS:
            for zero_mode in ZERO_MODES:
                yield dtype, bits, zero_mode


def problems(capability: Tuple[int, int], shapes=SHAPES, m_buckets=M_BUCKETS) -> Iterator[Problem]:
    for dtype, bits, zero_mode in weight_kinds():
        layout = layout_on(capability, bits)
        for group in GROUPS:
            for n, k in shapes:
                for m in m_buckets:
                    yield Problem(m=m, n=n, k=k, dtype=dtype, bits=bits, zero_mode=zero_mode,
                                  group_size=k if group == -1 else group, layout=layout)


def selectable(arch: str, shapes=SHAPES, m_buckets=M_BUCKETS, grouped: bool = False) -> List[Tuple[Family, object]]:
    """``(family, compiled config)`` of every kernel selection can pick on ``arch`` without a user
    profile (with each shipped profile of the arch's GPUs, and of the cold-call stand-ins), one per
    kernel name, in registry then name order; ``grouped``: also every catalog kernel of the grouped
    (MoE) families that run there (what a kernel package holds: their choice depends on the
    routing's statistics and the experts' shapes, which no grid here enumerates, and their
    catalogs are small)."""
    capability, sms = arch_capability(arch)
    return selectable_for(capability, sms, shipped_profiles(capability) or None, shapes, m_buckets, grouped)


def selectable_on(device_index: int = 0) -> List[Tuple[Family, object]]:
    """:func:`selectable` for a visible GPU: its compute capability, SM count and profile (a
    user's own included): what ``mixed-gemm build`` compiles there."""
    from ..kernels import base
    from .profiles import device_profile

    capability = base.compute_capability(device_index)
    if capability is None:
        raise ValueError(f"device_index: no CUDA GPU {device_index} is visible")
    return selectable_for(capability, base.sm_count(device_index), device_profile(device_index))


def selectable_for(capability: Tuple[int, int], sms: int, profile, shapes=SHAPES,
                   m_buckets=M_BUCKETS, grouped: bool = False) -> List[Tuple[Family, object]]:
    """The kernels selection can pick on a GPU of ``capability`` with ``sms`` SMs and ``profile``
    (a Profile, None, or a list of profiles: what any of them picks), what each dense family ships
    besides (``Family.packaged``), and with ``grouped`` the grouped families' catalogs (see
    :func:`selectable`)."""
    found: Dict[str, Tuple[Family, object]] = {}

    def add(fam: Family, config) -> None:
        found.setdefault(config.kernel.kernel_name, (fam, config.kernel))

    dequant = family("dequant_mm")
    for p in problems(capability, shapes, m_buckets):
        chosen = []
        for prof in profile if isinstance(profile, (list, tuple)) else (profile,):
            try:
                chosen.append(choose(p, 0, capability=capability, sms=sms, profile=prof, override=False))
            except ValueError:
                pass  # nothing serves this kind (the error names why where it happens)
        if not chosen:
            continue
        for c in chosen:
            add(c.family, c.config)
        picked, _ = heuristic_choice(p, 0, capability=capability, sms=sms)
        if picked is not None:
            add(*picked)
        add(dequant, dequant.heuristic(p, sms))
    for fam in FAMILIES:
        for config in fam.packaged(capability):
            add(fam, config)
    for fam in GROUPED_FAMILIES if grouped else ():
        for config in fam.packaged(capability):
            add(fam, config)
    if grouped and ROUTER.runs_on(capability)[0]:  # the MoE routers' kernels ship beside them
        for config in ROUTER.catalog():
            add(ROUTER, config)
    for prof in (profile if isinstance(profile, (list, tuple)) else (profile,)) if grouped else ():
        for entry in prof.grouped if prof is not None else ():  # kernels a profile names, shipped or not
            fam, schedule = split_schedule(entry["schedule"])
            if fam in GROUPED_FAMILIES and fam.runs_on(capability)[0]:
                add(fam, fam.from_schedule(schedule, dtype=entry["dtype"], bits=entry["bits"],
                                           zero_mode=entry["zero_mode"]))
    order = {f.name: i for i, f in enumerate(ALL_FAMILIES + (ROUTER,))}
    return sorted(found.values(), key=lambda fc: (order[fc[0].name], fc[1].kernel_name))


def passed_over(profile: Profile, capability: Tuple[int, int], sms: int) -> List[Tuple[dict, str, str]]:
    """The profile's own entries selection does not run for a weight packed the default way on a GPU of
    ``capability`` (``layout_on``: sm90a on Hopper): ``(entry, what runs instead, from where)`` each.
    An entry naming a schedule of another layout serves only weights packed in that layout on
    purpose; the default path borrows the nearest shape's entry or takes the heuristics.
    ``bench/profile_audit.py`` prints them."""
    own = Profile.load(profile.path, with_base=False)  # (a shipped profile: loaded from its file)
    out = []
    for entry in own.entries:
        bucket, bits = int(entry["m"]), entry["bits"]
        problem = Problem(m=bucket, n=entry["n"], k=entry["k"], dtype=entry["dtype"], bits=bits,
                          zero_mode=entry["zero_mode"], group_size=entry["group_size"], layout=layout_on(capability, bits))
        choice = choose(problem, 0, capability=capability, sms=sms, profile=profile, override=False)
        # This shape's own entry at this bucket ran (a family of several layouts may rename the
        # schedule to the weight's: dequant_mm's "dequant_mm" runs as "dequant_mm_sm90a").
        if choice.source != f"profile {profile.path.name} M={bucket}":
            out.append((entry, choice.schedule, choice.source))
    return out
