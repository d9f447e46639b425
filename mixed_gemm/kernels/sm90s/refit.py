"""A profile entry borrowed from a larger shape, fitted to a smaller one (selection's ``refit``).

An sm90s entry won on its shape with a tile count that filled the SMs; on a shape with fewer weight
rows the same tile leaves fewer, longer-latency CTAs, and the kernel turns latency-bound on its few
k-tiles (docs/notes/serving-mainloop.md: on 8B o one CTA per SM beats two; held-out 2048 x 2048 at
M = 256 ran the borrowed 128 x 128 tile 1.55x slower than the sweep's best and the 128 x 64 tile
within 1.22x). So where the tiles fall below ``SHRINK`` of the measured shape's, one step toward a
smaller kernel, each a catalog kernel (a package must hold it): two CTAs per SM -> one; 256 weight
rows -> 128; else half the token tile. The split factor is re-chosen for the new tile (``auto``).

Two decompositions won only in the wave regime they were measured in, so a borrowed entry keeps
them only there (docs/notes/serving-mainloop.md, 2026-11-28): stream-K (``sk``) on the side of one
wave of tiles its measured shape was on (measured past one wave at M <= 128, where within one it read
5-30% slower than ``auto``), and a 1xS cluster where its S slices of every tile still fit one wave
of whole clusters (else the same tile without the cluster, ``auto``).
"""
from __future__ import annotations

from typing import AbstractSet, Iterator

from ..base import Problem
from .config import TILE_M, Sm90sConfig, double_buffered

SHRINK = 0.75


def _smaller(config: Sm90sConfig) -> Iterator[Sm90sConfig]:
    tm, tn, tk = config.tile
    if config.ctas_per_sm == 2:
        step = dict(ctas_per_sm=1)
    elif tm > TILE_M:
        step = dict(tile=(TILE_M, tn, tk))
    elif tn >= 32:
        step = dict(tile=(tm, tn // 2, tk))
    else:
        return
    tile, ctas = step.get("tile", config.tile), step.get("ctas_per_sm", config.ctas_per_sm)
    # Half issue stays only where the smaller kernel still has one fragment set, in flight only where
    # it has two.
    db = double_buffered(tile, ctas)
    yield config.replace(half_issue=config.half_issue and not db, in_flight=config.in_flight and db, **step)


def _wave_fit(config: Sm90sConfig, problem: Problem, measured: Problem, sms: int,
              kernels: AbstractSet[Sm90sConfig]) -> Sm90sConfig:
    """``config`` with stream-K or its 1xS cluster dropped where ``problem``'s tiles leave the wave
    regime they won in: stream-K on the side of one wave that ``measured``'s tiles were on, a 1xS
    cluster where its slices of every tile fit one wave (the plain kernel must be a catalog identity)."""
    tiles, slots = config.tiles(problem.m, problem.n), config.wave_ctas(sms)
    if config.decomposition == "sk" and (tiles > slots) != (config.tiles(measured.m, measured.n) > slots):
        return config.replace(decomposition="auto")
    if not config.slices_fit_one_wave(problem.m, problem.n, sms):
        plain = config.replace(cluster=(1, 1))
        if plain.kernel in kernels:
            return plain
    return config


def refit_config(config: Sm90sConfig, problem: Problem, measured: Problem,
                 kernels: AbstractSet[Sm90sConfig], sms: int = 132) -> Sm90sConfig:
    """``config`` (best on ``measured``, at the same M) for ``problem``: stream-K and a 1xS cluster
    only in the wave regime they won in (:func:`_wave_fit`); then unchanged unless its tiles on
    ``problem`` fall below SHRINK of those on ``measured``, then the first smaller kernel of the
    catalog's compiled identities ``kernels`` (:func:`_smaller`), launched with the split factor
    chosen per shape."""
    config = _wave_fit(config, problem, measured, sms, kernels)
    if config.tiles(problem.m, problem.n) >= SHRINK * config.tiles(measured.m, measured.n):
        return config
    for smaller in _smaller(config):
        try:
            fitted = smaller.replace(decomposition="auto", splits=1)
        except ValueError:  # a combination the config rules refuse (e.g. a cluster's TN/C)
            continue
        if fitted.kernel in kernels:
            return fitted
    return config
