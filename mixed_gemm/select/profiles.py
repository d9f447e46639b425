"""Tuning profiles: the best schedule per problem, measured by ``mixed-gemm profile`` on one GPU.

A profile is a JSON file named for the GPU (``profiles/h100.json``)::

    {"format": 2,
     "gpu": {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "sms": 132},
     "versions": {"driver": ..., "nvcc": ..., "cutlass": ..., "mixed_gemm": ..., "torch": ...},
     "entries": [{"dtype": "f16", "bits": 4, "zero_mode": "int", "group_size": 128,
                  "n": 4096, "k": 4096, "m": 16, "schedule": "sm80:t16x64x128_w1x1x4_s4_kfused4",
                  "us": 7.9}, ...]}

An optional ``"grouped"`` list holds the grouped (MoE) families' entries: ``dtype``, ``bits``,
``zero_mode``, ``group_size``, ``experts``, ``top_k``, ``n``, ``k``, ``stage`` (``w13``/``w2``),
``tokens`` (a bucket), ``schedule`` (``moe_gemv:...``), ``us`` (``mixed-gemm profile-moe``). A layer's
call takes the entry nearest in tokens and weight kind (``Profile.lookup_grouped``): a kind not
measured near its token count borrows another's.

The key of an entry is the weight kind (dtype, bits, zero mode, group size) and the shape (N, K);
``m`` is an M bucket; ``schedule`` is ``family:schedule``. Format 1 (bare schedules, all of the
sm80 family or ``dequant_mm``) still loads. Lookups take the nearest measured bucket in log2(M)
(ties: the larger).

A profile may name a ``"base"`` (a file beside it, e.g. ``"h100.json"`` under ``h200.json``): the
base's entries load first and the profile's own replace those of the same key and bucket, so a GPU
of the same SM design measured on a few shapes (the H200: H100's SMs, more bandwidth) keeps the
base's choices for the rest. ``mixed-gemm profile`` merges into the own entries only.

Which file: ``$MIXED_GEMM_PROFILE`` if set, else ``<cache dir>/profiles/<gpu>.json`` (where
``mixed-gemm profile`` writes by default), else the one shipped in the package.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from .._paths import cache_dir, profiles_dir
from ..kernels import split_schedule

PROFILE_ENV = "MIXED_GEMM_PROFILE"
FORMAT = 2
READS = (1, 2)  # format 1: bare schedules
ENTRY_FIELDS = ("dtype", "bits", "zero_mode", "group_size", "n", "k", "m", "schedule")
Key = Tuple[str, int, str, int, int, int]  # dtype, bits, zero_mode, group_size, n, k
# Grouped (MoE) entries, under "grouped": one projection of stacked experts at a token bucket.
GROUPED_FIELDS = ("dtype", "bits", "zero_mode", "group_size", "experts", "top_k", "n", "k", "stage", "tokens",
                  "schedule")
GroupedKey = Tuple[str, int, str, int, int, int, int, int, str]


def gpu_slug(name: str) -> str:
    """File stem for a GPU name: its model token ("NVIDIA H100 80GB HBM3" -> "h100")."""
    words = re.sub(r"[^a-z0-9]+", " ", name.lower().replace("nvidia", "")).split()
    for w in words:
        if re.fullmatch(r"[a-z]+\d+[a-z]*", w):
            return w
    return "_".join(words) or "unknown"


def grouped_key(e) -> GroupedKey:
    """The key of a grouped entry (a dict) or of a :class:`~mixed_gemm.kernels.MoeProblem`."""
    get = e.__getitem__ if isinstance(e, dict) else lambda f: getattr(e, f)
    return (get("dtype"), int(get("bits")), get("zero_mode"), int(get("group_size")), int(get("experts")),
            int(get("top_k")), int(get("n")), int(get("k")), get("stage"))


def kind_penalty(a: Tuple[str, str, int], b: Tuple[str, str, int]) -> int:
    """How far apart two weight kinds (dtype, zero mode, group size) are for borrowing a measured
    entry: dtype 4, zero mode 2, group size 1 (what a kernel's speed depends on most, first)."""
    return 4 * (a[0] != b[0]) + 2 * (a[1] != b[1]) + (a[2] != b[2])


def entry_key(e: dict) -> Key:
    return (e["dtype"], int(e["bits"]), e["zero_mode"], int(e["group_size"]), int(e["n"]), int(e["k"]))


class Profile:
    """Entries of one GPU's profile, indexed for lookup."""

    def __init__(self, gpu: Optional[dict] = None, versions: Optional[dict] = None,
                 entries: Iterable[dict] = (), path: Optional[Path] = None, base: Optional[str] = None):
        self.gpu = dict(gpu or {})
        self.versions = dict(versions or {})
        self.path = path
        self.base = base
        self._entries: Dict[Tuple[Key, int], dict] = {}
        self._index: Dict[Key, List[Tuple[int, str]]] = {}
        self._grouped: Dict[Tuple[GroupedKey, int], dict] = {}
        for e in entries:
            self.add(e)

    def add_grouped(self, entry: dict) -> None:
        """Insert or replace a grouped (MoE) entry of (key, tokens bucket)."""
        key, tokens = grouped_key(entry), int(entry["tokens"])
        fam, schedule = split_schedule(entry["schedule"])
        self._grouped[(key, tokens)] = dict(entry, schedule=f"{fam.name}:{schedule}")

    @property
    def grouped(self) -> List[dict]:
        return [self._grouped[k] for k in sorted(self._grouped)]

    def lookup_grouped(self, problem) -> Optional[Tuple[int, str]]:
        """``(tokens bucket, "family:schedule")`` measured for ``problem``'s layer (a MoeProblem: same
        experts, top-k, shape and stage) and bit width, or None: the entry nearest in log2(tokens),
        where a weight kind other than the problem's counts as :func:`kind_penalty` / 8 doublings
        (another activation dtype: half of one; ties go to the nearer kind, then the larger bucket). So a
        layer's own kind serves it wherever it was measured near the call's token count, and a kind
        measured at a few token counts only (a bf16 sweep at one token) does not decide the others,
        which the nearest measured kind serves: the grouped kernels exist in both activation dtypes
        with the same tiles and fold every zero mode into one additive zero (callers still check
        that the schedule can run the problem, e.g. its group size). Never another width."""
        dtype, bits, zero_mode, group, *layer = grouped_key(problem)
        lt = math.log2(max(problem.tokens, 1))
        best, hit = None, None
        for (k, t), e in self._grouped.items():
            if k[1] != bits or list(k[4:]) != layer:
                continue
            penalty = kind_penalty((dtype, zero_mode, group), (k[0], k[2], k[3]))
            rank = (abs(math.log2(t) - lt) + penalty / 8, penalty, -t, k)
            if best is None or rank < best:
                best, hit = rank, (t, e["schedule"])
        return hit

    def add(self, entry: dict) -> None:
        """Insert or replace the entry of (key, m); the schedule is stored as ``family:schedule``."""
        key, m = entry_key(entry), int(entry["m"])
        fam, schedule = split_schedule(entry["schedule"])
        entry = dict(entry, schedule=f"{fam.name}:{schedule}")
        self._entries[(key, m)] = entry
        rows = [r for r in self._index.get(key, []) if r[0] != m]
        self._index[key] = sorted(rows + [(m, entry["schedule"])])

    def merge(self, other: "Profile") -> None:
        """Take ``other``'s entries, replacing those of the same key and M bucket."""
        for e in other.entries:
            self.add(e)
        for e in other.grouped:
            self.add_grouped(e)

    @property
    def entries(self) -> List[dict]:
        return [self._entries[k] for k in sorted(self._entries)]

    def entry(self, key: Key, m: int) -> Optional[dict]:
        """The stored entry of (key, M bucket), or None."""
        return self._entries.get((key, m))

    def has(self, key: Key, m: int) -> bool:
        return (key, m) in self._entries

    def lookup(self, key: Key, m: int) -> Optional[Tuple[int, str]]:
        """``(bucket, "family:schedule")`` of the nearest measured M bucket for ``key``, or None."""
        rows = self._index.get(key)
        if not rows:
            return None
        lm = math.log2(max(m, 1))
        return min(rows, key=lambda r: (abs(math.log2(r[0]) - lm), -r[0]))

    def nearest_shape(self, key: Key, bucket: Optional[int] = None) -> Optional[Key]:
        """The first of :meth:`nearest_shapes`, or None."""
        return next(iter(self.nearest_shapes(key, bucket)), None)

    def nearest_shapes(self, key: Key, bucket: Optional[int] = None) -> List[Key]:
        """The measured key nearest to ``key``, or None: same bit width (the bytes a kernel streams),
        nearest (N, K) in log space (K counts double: it sets the split-K and pipeline depth), and a
        penalty per other weight-kind field (dtype 4, zero mode 2, group size 1, in octaves), so an
        entry of the same kind wins unless its shape is far. For shapes (and kinds) nobody
        profiled; exact keys win in :meth:`lookup`'s callers. ``bucket``: only keys measured at that M.
        All of them, nearest first (ties: the smaller key), so a caller can pass over entries that
        cannot serve its weight (an sm80-tile entry measured on the sm80 copy, for a one-copy weight)."""
        dtype, bits, zero_mode, group, n, k = key
        ranked = []
        for other, rows in self._index.items():
            if other[1] != bits or (bucket is not None and all(r[0] != bucket for r in rows)):
                continue
            d = (abs(math.log2(other[4] / n)) + 2 * abs(math.log2(other[5] / k))
                 + kind_penalty((dtype, zero_mode, group), (other[0], other[2], other[3])))
            ranked.append((d, other))
        return [other for _, other in sorted(ranked)]

    # ---- files ----
    def to_json(self) -> dict:
        data = {"format": FORMAT, "gpu": self.gpu, "versions": self.versions}
        if self.base:
            data["base"] = self.base
        data["entries"] = self.entries
        if self._grouped:
            data["grouped"] = self.grouped
        return data

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)
        self.path = path

    @classmethod
    def load(cls, path: Path, with_base: bool = True, _seen: Tuple[Path, ...] = ()) -> "Profile":
        """The profile at ``path``; ``with_base``: its base's entries underneath (False: to merge
        new measurements into the file and save it, own entries only)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"profile {path}: cannot read it as JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("format") not in READS or not isinstance(data.get("entries"), list):
            raise ValueError(f"profile {path}: expected a JSON object of format {' or '.join(map(str, READS))} "
                             "with an 'entries' list")
        for i, e in enumerate(data["entries"]):
            missing = [f for f in ENTRY_FIELDS if not isinstance(e, dict) or f not in e]
            if missing:
                raise ValueError(f"profile {path}: entry {i} lacks {', '.join(missing)} "
                                 f"(every entry needs {', '.join(ENTRY_FIELDS)})")
        grouped = data.get("grouped", [])
        for i, e in enumerate(grouped if isinstance(grouped, list) else [None]):
            missing = [f for f in GROUPED_FIELDS if not isinstance(e, dict) or f not in e]
            if missing:
                raise ValueError(f"profile {path}: grouped entry {i} lacks {', '.join(missing)} "
                                 f"(every grouped entry needs {', '.join(GROUPED_FIELDS)})")
        base = data.get("base")
        if base is not None and (not isinstance(base, str) or Path(base).name != base):
            raise ValueError(f"profile {path}: 'base' must name a profile file beside it, got {base!r}")
        profile = cls(data.get("gpu"), data.get("versions"), path=path, base=base)
        if base and with_base:
            below = path.parent / base
            if below.resolve() in _seen or below.resolve() == path.resolve():
                raise ValueError(f"profile {path}: base {base!r} leads back to itself")
            profile.merge(cls.load(below, True, _seen + (path.resolve(),)))
        for i, e in enumerate(data["entries"]):
            try:
                profile.add(e)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"profile {path}: entry {i}: {exc}") from None
        for i, e in enumerate(grouped):
            try:
                profile.add_grouped(e)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"profile {path}: grouped entry {i}: {exc}") from None
        return profile


def default_profile_path(gpu_name: str) -> Path:
    """Where ``mixed-gemm profile`` writes by default and selection looks first."""
    return cache_dir() / "profiles" / f"{gpu_slug(gpu_name)}.json"


def find_profile(gpu_name: str) -> Optional[Path]:
    env = os.environ.get(PROFILE_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"{PROFILE_ENV}={env}: no such profile file")
        return path
    for path in (default_profile_path(gpu_name), profiles_dir() / f"{gpu_slug(gpu_name)}.json"):
        if path.is_file():
            return path
    return None


_LOADED: Dict[int, Optional[Profile]] = {}


def device_profile(device_index: int) -> Optional[Profile]:
    """The profile for the GPU ``device_index`` (loaded once per process), or None."""
    if device_index not in _LOADED:
        import torch

        path = find_profile(torch.cuda.get_device_name(device_index))
        _LOADED[device_index] = Profile.load(path) if path is not None else None
    return _LOADED[device_index]


def clear_cache() -> None:
    """Forget loaded profiles (after writing a new one in the same process)."""
    _LOADED.clear()
