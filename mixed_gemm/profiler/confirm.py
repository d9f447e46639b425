"""Confirming a sweep before it ships. A sweep times each candidate once per shape and M, so a
winner by 1-3% may be the host's noise, and a sweep run on another GPU of the same SM design (an
H200 for the H100's profile) favours what that GPU's bandwidth favours. :func:`changes` lists the
entries whose schedule a sweep changed; ``bench/profile_confirm.py`` times each change against the
shipped schedule, alternated over several rounds on the GPU the profile is for, and
:func:`confirmed` is the shipped profile with only the changes that won by more than a margin.
Entries the shipped profile lacks are left out: there is nothing to confirm them against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..select.profiles import Key, Profile, entry_key

MARGIN = 0.01  # a change ships where its median is more than 1% under the shipped schedule's


@dataclass(frozen=True)
class Change:
    """One entry a sweep changed: weight kind and shape (``key``), M bucket, both schedules."""
    key: Key
    m: int
    old: str
    new: str

    @property
    def label(self) -> str:
        return _label(self.key, self.m)


def _label(key: Key, m: int) -> str:
    dtype, bits, zero_mode, group, n, k = key
    return f"{dtype} u{bits} {zero_mode} g{group} {n}x{k} M={m}"


def changes(shipped: Profile, swept: Profile) -> Tuple[List[Change], List[str]]:
    """The entries of ``swept`` whose schedule differs from ``shipped``'s of the same key and M,
    and the labels of the entries ``shipped`` lacks (left out)."""
    out, added = [], []
    for e in swept.entries:
        key, m = entry_key(e), int(e["m"])
        old = shipped.entry(key, m)
        if old is None:
            added.append(_label(key, m))
        elif old["schedule"] != e["schedule"]:
            out.append(Change(key, m, old["schedule"], e["schedule"]))
    return out, added


def confirmed(shipped: Profile, timed: Dict[Change, Tuple[float, float]],
              margin: float = MARGIN) -> Tuple[Profile, List[str]]:
    """A copy of ``shipped`` taking each change whose new schedule's time (``timed[change]`` =
    (old seconds, new seconds), medians of an alternated A/B) is under (1 - margin) of the old one's,
    with that time as its ``us``; and one line per change saying what was decided."""
    out = Profile(shipped.gpu, shipped.versions, base=shipped.base)
    out.merge(shipped)
    lines = []
    for change, (t_old, t_new) in timed.items():
        take = t_new < (1.0 - margin) * t_old
        if take:
            entry = dict(shipped.entry(change.key, change.m), schedule=change.new, us=round(t_new * 1e6, 3))
            out.add(entry)
        lines.append(f"{change.label}: {change.old} {t_old * 1e6:.1f} µs, {change.new} {t_new * 1e6:.1f} µs: "
                     f"{'taken' if take else 'kept'}")
    return out, lines
