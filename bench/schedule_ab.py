"""A/B of schedules on the same weights: each case's schedules timed alternately with cuBLAS in the
same dtype (cold L2, CUDA graphs, median of ``--rounds``), each checked against the float32 reference.

    python bench/schedule_ab.py --cases CASES [--rounds 3] [--dtype f16] [--between] [--residual] [--out FILE]
    python bench/schedule_ab.py --cases CASES --pack kcache/ab.txz     # no GPU needed
    python bench/schedule_ab.py --pack-all kcache                       # no GPU needed
    python bench/schedule_ab.py --pack-selected kcache/selected.txz     # no GPU needed

A case is one line of the file CASES (or a ``--case`` argument, repeatable):
``N K M BITS GROUP schedule [schedule ...]``, ``#`` starts a comment, for example

    57344 8192 1 2 64 gemv:m8_s4_w2x2_u8_p3_split2 gemv:m8_s2_w4x2_u8_p3_split2
    4096 4096 16 4 128 sm80:t16x64x128_w1x1x4_s4_sm90a_kparallel4 gemv:m16_s4_w2x2_u4_p3_split4

Prints one row per (case, schedule): µs, speedup over cuBLAS, the weight's share of the 3.0 TB/s
floor and the relative error. Each schedule runs on the same codes packed in the layout it reads;
note that ``matmul`` on a weight packed ``"auto"`` (sm90a on Hopper) never runs an sm80-layout
schedule: a profile entry naming one is passed over there, so an A/B against it says nothing about
what selection runs (``mixed-gemm bench`` with and without the entry does). ``--pack`` instead builds the cases' kernels (where missing) and writes
their kernel-cache entries to one xz tar, which bench/device/env.sh unpacks on the GPU machine: a
call then carries the few kernels it times instead of the whole cache. ``--pack-all DIR`` packs every
catalog kernel as built for the current sources (``mixed-gemm build --all``, which builds the missing
ones first, two nvcc at a time: about an hour from empty here; entries of stale sources stay out)
into DIR: libs.txz, tiles.txz and the gemv fatbins in thirds, gemv-1.txz .. gemv-3.txz, so that
libs + tiles + one third fit one device call beside the checkout and the wheels (64 MB; halves of
~19.5 MB stopped fitting once the checkout passed 12 MB) and the other thirds go with the next
calls: the suite's shards (a third not carried compiles where a test needs it).
``--pack-selected OUT.txz`` packs only what ``matmul`` and ``moe`` can select on the H100 (the
kernel package's set: shipped profiles, heuristics, fallbacks; ~17 MB): enough for the benchmarks
and the end-to-end runs in one call, not for the test suite, which loops over whole catalogs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

import mixed_gemm as mg
from mixed_gemm.kernels import parse_schedule

FLOOR_BW = 3.0e12

Case = Tuple[int, int, int, int, int, List[str]]


def read_cases(path: str, extra: List[str]) -> List[Case]:
    lines = list(open(path)) if path else []
    cases = []
    for raw in lines + extra:
        fields = raw.split("#")[0].split()
        if not fields:
            continue
        if len(fields) < 6:
            raise ValueError(f"case {raw.strip()!r}: needs N K M BITS GROUP and at least one schedule")
        n, k, m, bits, group = map(int, fields[:5])
        cases.append((n, k, m, bits, group, fields[5:]))
    if not cases:
        raise ValueError("no cases: give --cases FILE or --case 'N K M BITS GROUP schedule ...'")
    return cases


def pack(cases: List[Case], dtype: str, out: str) -> None:
    from mixed_gemm.compile.cache import build_spec, locate
    from mixed_gemm.kernels import family_of

    specs = {}
    for _, _, _, bits, _, schedules in cases:
        for schedule in schedules:
            config = parse_schedule(schedule, dtype=dtype, bits=bits, zero_mode="int")
            spec = family_of(config).build_spec(config.kernel)
            specs[spec.name] = spec
    entries = []
    for spec in specs.values():
        build_spec(spec)
        entries.append(locate(spec.name, spec.source(), spec.arch_flags, (), spec.output)[1].name)
    target = os.path.abspath(out)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tar_xz(entries, ["-T2", "-6"], Path(target))
    print(f"{len(entries)} kernels -> {out}")


def tar_xz(entries: List[str], xz_args: List[str], target: Path) -> None:
    """The cache entries ``entries`` (directory names) as one xz-compressed tar at ``target``, lock
    files left out."""
    from mixed_gemm._paths import cache_dir

    with tempfile.NamedTemporaryFile("w", suffix=".entries") as names, open(target, "wb") as f:
        names.write("".join(f"{e}\n" for e in sorted(entries)))
        names.flush()
        tar = subprocess.Popen(["tar", "cf", "-", "--exclude=*.lock", "-T", names.name], cwd=cache_dir(),
                               stdout=subprocess.PIPE)
        xz = subprocess.run(["xz", *xz_args], stdin=tar.stdout, stdout=f)
        if tar.wait() != 0 or xz.returncode != 0:
            raise RuntimeError(f"tar | xz of {len(entries)} cache entries into {target} failed")


# Archives of --pack-all, by what their entries are, and how many parts each is cut into (gemv's
# ~41 MB in three), so libs + tiles + one part fit a call of 64 MB beside the checkout and the wheels.
PACK_GROUPS = (("libs", 1, lambda e: e.startswith(("mg_sm90a_", "mg_sm90s_", "mg_moe_sm90a_", "mg_moe_sm90s_"))),  # kernel libraries
               ("gemv", 3, lambda e: e.startswith("mg_gemv")),
               ("tiles", 1, lambda e: True))  # sm80, dequant_mm, moe_gemv, moe_sm80 fatbins


def pack_all(out_dir: str) -> None:
    """Every catalog kernel's cache entry for the current sources into ``out_dir`` as one xz tar per
    group of :data:`PACK_GROUPS` (``libs.txz``: the kernel libraries, mostly the same static cudart,
    which xz over one tar dedupes; ``gemv-1.txz`` .. ``gemv-3.txz``: a group in parts takes every
    third entry in name order, so each part holds every width and tile; ``tiles.txz``), for
    bench/device/env.sh to unpack."""
    built = subprocess.run([sys.executable, "-m", "mixed_gemm.cli", "build", "--all", "--filter", "mg_", "--jobs", "2"],
                           stdout=subprocess.PIPE, text=True, check=True).stdout
    # "name  path" per kernel; the path's directory is its cache entry
    entries = sorted({Path(line.split()[1]).parent.name for line in built.splitlines() if len(line.split()) == 2})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.txz"), *out.glob("kcache90.txz.part-*"), *out.glob("kcache.tgz.part-*")]:
        old.unlink()
    left = entries
    for name, parts, member in PACK_GROUPS:
        group = [e for e in left if member(e)]
        left = [e for e in left if not member(e)]
        for part in range(parts):
            tar_xz(group[part::parts], ["-9", "-T0"], out / (f"{name}-{part + 1}.txz" if parts > 1 else f"{name}.txz"))
    print(f"{len(entries)} entries -> {out_dir}")
    for f in sorted(out.iterdir()):
        print(f"{f.stat().st_size:>12} {f.name}")


def pack_selected(target: str) -> None:
    """Every kernel ``matmul`` and ``moe`` can select on sm90a (``mixed-gemm build --package``'s
    set), built where missing, as one xz tar of their cache entries at ``target``."""
    from mixed_gemm.compile import blocking, build_many
    from mixed_gemm.compile.cache import locate
    from mixed_gemm.select.coverage import selectable

    specs = [fam.build_spec(c) for fam, c in selectable("sm90a", grouped=True)]
    sources = [spec.source() for spec in specs]
    with blocking():
        build_many([(spec.name, src, dict(arch_flags=spec.arch_flags, output=spec.output))
                    for spec, src in zip(specs, sources)], jobs=2)
    entries = {locate(spec.name, src, spec.arch_flags, output=spec.output)[1].name for spec, src in zip(specs, sources)}
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    tar_xz(sorted(entries), ["-9", "-T0"], Path(target))
    print(f"{len(entries)} entries -> {target} ({Path(target).stat().st_size} bytes)")


def time_cases(cases: List[Case], dtype: str, rounds: int, between: bool,
               medians: Optional[Dict[Tuple[int, int, int, int, int, str], float]] = None,
               residual: bool = False) -> List[str]:
    """The rows of every case (printed as they come); ``medians``, when given, also gets each
    schedule's median seconds under (N, K, M, BITS, GROUP, schedule). ``residual``: every call adds
    an (M, N) skip connection in its epilogue (cuBLAS: ``addmm``), as o_proj and down_proj do."""
    from mixed_gemm.kernels import family_of
    from mixed_gemm.ops.matmul import problem
    from mixed_gemm.profiler.timing import copies_for, time_graph
    from mixed_gemm.profiler.workload import packed_bytes, random_weights

    td = torch.float16 if dtype == "f16" else torch.bfloat16
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    lines = []
    for n, k, m, bits, group, schedules in cases:
        qbytes = packed_bytes(n, k, bits, group, True)
        copies = copies_for(qbytes, l2)
        # The same random codes packed once per weight layout the case's schedules read (an sm80
        # schedule from an older profile beside a gemv one): each schedule times its own layout.
        parsed = {s: parse_schedule(s, dtype=dtype, bits=bits, zero_mode="int") for s in schedules}
        layouts = {s: family_of(c).layout_of(c) for s, c in parsed.items()}
        by_layout = {}
        for lay in dict.fromkeys(layouts.values()):
            torch.manual_seed(n * 31 + k)
            by_layout[lay] = random_weights(n, k, bits=bits, group_size=group, dtype=dtype, copies=copies, layout=lay)
        ws = next(iter(by_layout.values()))
        dense = [(torch.randn(n, k, device="cuda") * 0.02).to(td) for _ in range(copies_for(2 * n * k, l2))]
        x = torch.randn(m, k, device="cuda").to(td)
        y = torch.empty(m, n, device="cuda", dtype=td)
        skip = torch.randn(m, n, device="cuda").to(td) if residual else None
        want = mg.dequantize(ws[0]).float() @ x.float().t()
        if skip is not None:
            want += skip.float().t()
        cfgs = {}
        for s in schedules:
            w = by_layout[layouts[s]]
            # As selection reads a profile entry: a family of several layouts (dequant_mm's schedule
            # "dequant_mm") takes the one the weight holds.
            cfg = family_of(parsed[s]).for_layout(parsed[s], problem(w[0], m))
            y.fill_(float("nan"))
            mg.matmul(x, w[0], config=cfg, out=y, residual=skip)
            err = ((y.float().t() - want).abs().max() / want.abs().max()).item()
            cfgs[s] = (cfg, err, w)
        times = {s: [] for s in ["dense", *schedules]}

        def pre():  # with --between, an elementwise kernel first, as a norm precedes a GEMM in a model
            if between:
                x.mul_(1.0)

        def dense_mm(i):
            pre()
            if skip is None:
                torch.mm(x, dense[i % len(dense)].t(), out=y)
            else:
                torch.addmm(skip, x, dense[i % len(dense)].t(), out=y)

        def ours(i, c, w):
            pre()
            mg.matmul(x, w[i % len(w)], config=c, out=y, residual=skip)

        for _ in range(rounds):  # alternate, so drift between rounds hits every schedule alike
            times["dense"].append(time_graph(dense_mm, 2 * len(dense)))
            for s, (cfg, _, w) in cfgs.items():
                times[s].append(time_graph(lambda i, c=cfg, w=w: ours(i, c, w), 2 * len(w)))
        base = statistics.median(times["dense"])
        for s in schedules:
            t = statistics.median(times[s])
            if medians is not None:
                medians[(n, k, m, bits, group, s)] = t
            line = (f"{n}x{k} m={m} u{bits} g{group} {s:34s} {t * 1e6:8.1f} us  {base / t:5.2f}x  "
                    f"floor {qbytes / FLOOR_BW / t:4.0%}  err {cfgs[s][1]:.1e}")
            print(line, flush=True)
            lines.append(line)
        del ws, by_layout, cfgs, dense
        torch.cuda.empty_cache()
    return lines


def main() -> None:
    summary, details = __doc__.split("\n\n", 1)
    ap = argparse.ArgumentParser(description=summary, epilog=details, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="", help="a file of case lines")
    ap.add_argument("--case", action="append", default=[], help="one case line (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["f16", "bf16"], default="f16")
    ap.add_argument("--out", default=None, help="also write the rows here")
    ap.add_argument("--between", action="store_true",
                    help="an elementwise torch kernel (x *= 1) before every call, as a norm precedes a GEMM "
                         "in a model: times are then per pair")
    ap.add_argument("--residual", action="store_true",
                    help="add an (M, N) skip connection in the epilogue of every call (cuBLAS: addmm)")
    ap.add_argument("--pack", metavar="OUT.txz", default="",
                    help="build the cases' kernels and pack their cache entries instead of timing")
    ap.add_argument("--pack-all", metavar="OUT_DIR", default="",
                    help="build every catalog kernel (where missing) and pack the whole cache for the GPU machine "
                         "into OUT_DIR (libs.txz, tiles.txz, gemv-1.txz .. gemv-3.txz); no cases")
    ap.add_argument("--pack-selected", metavar="OUT.txz", default="",
                    help="build and pack only the kernels matmul and moe can select on the H100 (benchmarks, e2e); "
                         "no cases")
    a = ap.parse_args()
    if a.pack_all:
        pack_all(a.pack_all)
        return
    if a.pack_selected:
        pack_selected(a.pack_selected)
        return
    cases = read_cases(a.cases, a.case)
    if a.pack:
        pack(cases, a.dtype, a.pack)
        return
    lines = time_cases(cases, a.dtype, a.rounds, a.between, residual=a.residual)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
