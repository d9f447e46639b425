"""The sweep behind ``mixed-gemm profile``: time every candidate schedule of every (shape, M),
verify the winners, and write the GPU's profile (JSON) and every measurement (CSV).

Each measurement is appended to ``<profile>.partial.jsonl`` as it is taken, so an interrupted
sweep resumes where it stopped; the partial file is removed once the profile is written. When a
shape's weights are made, its candidates still to time (every M) are compiled first, several nvcc
at once (:func:`shape_specs`, :mod:`.prebuild`).
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import _versions
from ..kernels import PRIMARY_LAYOUT, Problem, layout_for, parse_schedule, split_schedule
from ..select.profiles import Profile, default_profile_path, entry_key
from ..version import __version__
from .candidates import candidate_schedules
from .prebuild import build_candidates
from .timing import calls_for, copies_for, time_graph
from .workload import TORCH_DTYPES, packed_bytes, random_weights

TOLERANCE = {"f16": 1e-2, "bf16": 2e-2}  # vs torch.mm on the dequantized weight (both fp32-accumulated)
CSV_FIELDS = ["Problem", "Provider", "OperationKind", "Operation", "Disposition", "Status", "m", "n", "k", "A", "B",
              "C", "group_size", "zero_mode", "schedule", "split_k_mode", "split_k_slices", "swizzle", "Bytes",
              "Flops", "Runtime", "GB/s", "GFLOPs"]


@dataclass
class SweepSpec:
    problems: Sequence[Tuple[str, int, int]]       # (label, N, K)
    ms: Sequence[int]
    dtype: str = "f16"
    bits: int = 4
    group_size: int = 128
    zero_mode: str = "int"                         # "int" | "sym" | "float" | "offset"
    schedules: Optional[List[str]] = None          # fixed candidate list (default: each family's candidates)
    families: Optional[List[str]] = None           # only these families' candidates
    against_profile: bool = False                  # also time the merged-into profile's entry for each (shape, M)
    layout: str = "auto"                           # the weight layouts the sweep packs (prepack's "auto")
    out: Optional[Path] = None                     # default: the user profile of this GPU
    merge: bool = True                             # keep the existing profile's other entries
    keep_faster: bool = False                      # merging: an existing entry measured faster stays
    fresh: bool = False                            # ignore a partial sweep instead of resuming
    replays: int = 7
    jobs: Optional[int] = None                     # nvcc processes compiling a shape's candidates (CPU count)
    progress: bool = True
    log: Callable[[str], None] = field(default=print)


def _key(spec: SweepSpec, n: int, k: int) -> dict:
    return dict(dtype=spec.dtype, bits=spec.bits, zero_mode=spec.zero_mode,
                group_size=k if spec.group_size == -1 else spec.group_size, n=n, k=k)


def _row_id(row: dict) -> tuple:
    return tuple(row[f] for f in ("dtype", "bits", "zero_mode", "group_size", "n", "k", "m", "schedule"))


def _load_partial(path: Path) -> Dict[tuple, dict]:
    rows = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by the interruption
            continue
        rows[_row_id(row)] = row
    return rows


def _current_schedules(current: Profile, spec: SweepSpec) -> List[str]:
    """The schedules of ``current``'s entries for the sweep's shapes and M buckets."""
    found = (current.entry(entry_key(_key(spec, n, k)), m) for _, n, k in spec.problems for m in spec.ms)
    return sorted({e["schedule"] for e in found if e is not None})


def _with_current(plan, current: Profile, spec: SweepSpec):
    """Add each (shape, M)'s existing winner to its candidates, so that a sweep of a few families
    replaces an entry only when it beats that winner timed in the same run (same clocks, same L2)."""
    out = []
    for label, n, k, m, schedules in plan:
        old = current.entry(entry_key(_key(spec, n, k)), m)
        if old is not None and old["schedule"] not in schedules:
            schedules = schedules + [old["schedule"]]
        out.append((label, n, k, m, schedules))
    return out


def shape_specs(plan, n: int, k: int, key: dict, done: Dict[tuple, dict], spec: SweepSpec, zero_mode: str) -> list:
    """Build specs of the schedules still to time for shape ``(n, k)`` at every M of ``plan``, as
    the sweep will parse them (``zero_mode``: the packed weight's)."""
    specs = []
    for _, n2, k2, m, schedules in plan:
        if (n2, k2) != (n, k):
            continue
        for schedule in schedules:
            if _row_id(dict(key, m=m, schedule=schedule)) in done:
                continue
            try:
                cfg = parse_schedule(schedule, dtype=spec.dtype, bits=spec.bits, zero_mode=zero_mode)
            except ValueError:  # the sweep records why when it gets there
                continue
            specs.append(split_schedule(schedule)[0].build_spec(cfg))
    return specs


def _rel_err(y, ref) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def run_sweep(spec: SweepSpec) -> Tuple[Profile, Path]:
    """Measure, verify, write; returns the profile and its path."""
    import torch
    from tqdm import tqdm

    from ..ops import dequantize, matmul

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    out = Path(spec.out) if spec.out else default_profile_path(props.name)
    partial = out.with_name(out.stem + ".partial.jsonl")
    done: Dict[tuple, dict] = {}
    if partial.exists():
        if spec.fresh:
            partial.unlink()
        else:
            done = _load_partial(partial)
            spec.log(f"resuming: {len(done)} measurements from {partial}")
    partial.parent.mkdir(parents=True, exist_ok=True)
    sms, l2 = props.multi_processor_count, props.L2_cache_size
    gs = spec.group_size
    # What selection runs now: the profile with its base underneath (winners merge into its own entries).
    current = Profile.load(out) if spec.against_profile and out.exists() else None
    if spec.layout == "auto":
        spec.layout = layout_for(torch.cuda.current_device(), spec.bits)
        # A --schedules sweep, and the entries an --against-profile sweep re-times, pack every
        # layout their tile families read.
        named = list(spec.schedules or []) + (_current_schedules(current, spec) if current else [])
        if named:
            kind = dict(dtype=spec.dtype, bits=spec.bits, zero_mode=spec.zero_mode)
            held = set(spec.layout.split("+")) | {fam.layout_of(fam.from_schedule(s, **kind))
                                                  for fam, s in map(split_schedule, named) if fam.sets_layout}
            spec.layout = "+".join(sorted(held, key=lambda name: name != PRIMARY_LAYOUT))
    plan = [(label, n, k, m, candidate_schedules(
                Problem(m=m, n=n, k=k, dtype=spec.dtype, bits=spec.bits, zero_mode=spec.zero_mode,
                        group_size=k if gs == -1 else gs, layout=spec.layout),
                sms, torch.cuda.current_device(), only=spec.schedules, families=spec.families))
            for label, n, k in spec.problems for m in spec.ms]
    if current is not None:
        plan = _with_current(plan, current, spec)
    total = sum(len(c) for *_, c in plan)
    winners: List[dict] = []
    bar = tqdm(total=total, desc="profile", unit="cfg", disable=not spec.progress)
    with partial.open("a") as log_file:
        def record(row: dict) -> None:
            done[_row_id(row)] = row
            log_file.write(json.dumps(row) + "\n")
            log_file.flush()

        weights = None
        for label, n, k, m, schedules in plan:
            key = _key(spec, n, k)
            bar.set_postfix_str(f"{label} M={m}")
            rows = [done.get(_row_id(dict(key, m=m, schedule=s))) for s in schedules]
            need = [s for s, r in zip(schedules, rows) if r is None]
            if need or not any(r and r.get("disposition") == "passed" for r in rows):
                if weights is None or weights[0].n != n or weights[0].k != k:
                    weights = None
                    torch.cuda.empty_cache()
                    nbytes = packed_bytes(n, k, spec.bits, spec.group_size, spec.zero_mode != "sym")
                    weights = random_weights(n, k, bits=spec.bits, group_size=spec.group_size, layout=spec.layout,
                                             zero_mode=spec.zero_mode, dtype=spec.dtype,
                                             copies=copies_for(nbytes, l2))
                    build_candidates(shape_specs(plan, n, k, key, done, spec, weights[0].zero_mode), spec.jobs,
                                     lambda line, label=label: spec.log(f"{label}: {line}"))
                x = torch.randn(m, k, device="cuda").to(TORCH_DTYPES[spec.dtype])
                y = torch.empty(m, n, device="cuda", dtype=TORCH_DTYPES[spec.dtype])
            for schedule in need:
                cfg = parse_schedule(schedule, dtype=spec.dtype, bits=spec.bits, zero_mode=weights[0].zero_mode)
                ws = weights

                def call(i, cfg=cfg, ws=ws):
                    matmul(x, ws[i % len(ws)], config=cfg, out=y)

                row = dict(key, m=m, schedule=schedule, label=label, us=None, status="success",
                           disposition="not_verified")
                try:
                    row["us"] = time_graph(call, calls_for(call, len(ws)), spec.replays) * 1e6
                except (ValueError, RuntimeError) as exc:  # e.g. a schedule the problem rules out
                    row["status"] = f"error: {type(exc).__name__}: {exc}".replace("\n", " ")[:300]
                record(row)
                bar.update()
            bar.update(len(schedules) - len(need))
            # Winner: the fastest schedule whose result matches torch.mm on the dequantized weight.
            ranked = sorted((done[_row_id(dict(key, m=m, schedule=s))] for s in schedules),
                            key=lambda r: math.inf if r["us"] is None else r["us"])
            for row in ranked:
                if row["us"] is None:
                    break
                if row["disposition"] == "not_verified":
                    cfg = parse_schedule(row["schedule"], dtype=spec.dtype, bits=spec.bits,
                                         zero_mode=weights[0].zero_mode)
                    y.fill_(float("nan"))
                    matmul(x, weights[0], config=cfg, out=y)
                    ref = torch.mm(x, dequantize(weights[0]).t())
                    ok = _rel_err(y, ref) <= TOLERANCE[spec.dtype]
                    row = dict(row, disposition="passed" if ok else "incorrect")
                    record(row)
                if row["disposition"] == "passed":
                    winners.append(dict(key, m=m, schedule=row["schedule"], us=round(row["us"], 3)))
                    break
            else:
                spec.log(f"warning: no schedule passed for {label} M={m}")
    bar.close()

    profile = Profile.load(out, with_base=False) if spec.merge and out.exists() else Profile()
    profile.gpu = {"name": props.name, "compute_capability": f"{props.major}.{props.minor}", "sms": sms}
    profile.versions = {"driver": _versions.driver(), "nvcc": _versions.nvcc(), "cutlass": _versions.cutlass(),
                        "torch": _versions.torch_version(), "mixed_gemm": __version__}
    kept = merge_winners(profile, winners, done, spec.keep_faster)
    if kept:
        spec.log(f"kept {kept} existing entries measured faster than this sweep's winners")
    profile.save(out)
    _write_csv(out.with_suffix(".csv"), done.values(), spec.layout)
    partial.unlink()
    return profile, out


def merge_winners(profile: Profile, winners: List[dict], done: Dict[tuple, dict], keep_faster: bool) -> int:
    """Add ``winners`` to ``profile``; returns how many existing entries stayed. ``keep_faster``: an
    entry whose recorded time beats the new winner's stays, as a targeted sweep (``--schedules``)
    must not replace a faster winner it did not time; but where this sweep timed that entry's
    schedule itself (``--against-profile``), the winner already beat it on the same clocks, and the
    recorded time (another run, maybe another build of the kernel) does not count."""
    kept = 0
    for w in winners:
        old = profile.entry(entry_key(w), w["m"]) if keep_faster else None
        if old is not None and old.get("us") is not None and old["us"] <= w["us"]:
            row = done.get(_row_id(dict(w, schedule=old["schedule"])))
            if row is None or row.get("us") is None:
                kept += 1
                continue
        profile.add(w)
    return kept


def _write_csv(path: Path, rows, layout: str) -> None:
    """Every measurement, one line each, in the manner of the CUTLASS profiler's CSV."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in sorted(rows, key=lambda r: (r["n"], r["k"], r["m"], r["us"] if r["us"] is not None else math.inf)):
            cfg = parse_schedule(r["schedule"], dtype=r["dtype"], bits=r["bits"], zero_mode=r["zero_mode"])
            m, n, k = r["m"], r["n"], r["k"]
            nbytes = packed_bytes(n, k, r["bits"], r["group_size"], r["zero_mode"] != "sym") + 2 * m * (k + n)
            flops = 2 * m * n * k
            sec = None if r["us"] is None else r["us"] * 1e-6
            w.writerow({
                "Problem": r.get("label", ""), "Provider": f"mixed_gemm:{cfg.family}",
                "OperationKind": "gemm", "Operation": cfg.name, "Disposition": r["disposition"],
                "Status": r["status"], "m": m, "n": n, "k": k, "A": f"{r['dtype']}:row",
                "B": f"u{r['bits']}:{layout}", "C": f"{r['dtype']}:row", "group_size": r["group_size"],
                "zero_mode": r["zero_mode"], "schedule": r["schedule"], "split_k_mode": getattr(cfg, "split_k_mode", "none"),
                "split_k_slices": getattr(cfg, "split_k", 1), "swizzle": getattr(cfg, "swizzle", 1), "Bytes": nbytes, "Flops": flops,
                "Runtime": "" if sec is None else f"{r['us'] / 1e3:.6f}",
                "GB/s": "" if sec is None else f"{nbytes / sec / 1e9:.1f}",
                "GFLOPs": "" if sec is None else f"{flops / sec / 1e9:.1f}",
            })
