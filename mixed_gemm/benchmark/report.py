"""Tables and the plot of ``mixed-gemm bench``."""
from __future__ import annotations

import math
import textwrap
from typing import Dict, List, Optional, Sequence


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


PEERS = ("tinygemm", "gemlite", "humming")  # the order of peers.PEERS: the columns of --compare


def table(rows: List[Dict], compare: bool) -> List[str]:
    """Per shape and M: mg's time and schedule, fp16's, the speedup, the shape's limit and the share
    of it reached, the weight's floor share (see :mod:`.limits`); with ``compare``, each peer's time
    and speedup (``-`` where it did not run: the footer's notes say why)."""
    head = ("| shape | N | K | M | mg µs | fp16 µs | speedup | limit | of limit | floor share (weights at 3.0 TB/s) "
            "| TFLOP/s | schedule |")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|"
    if compare:
        head += "".join(f" {who} µs | {who} speedup |" for who in PEERS)
        sep += "---|---|" * len(PEERS)
    lines = [head, sep]
    for r in rows:
        line = (f"| {r['label']} | {r['n']} | {r['k']} | {r['m']} | {r['us']:.1f} | {r['fp16_us']:.1f} | "
                f"{r['speedup']:.2f}x | {r['limit']:.2f}x | {100 * r['of_limit']:.0f}% | {100 * r['floor_share']:.0f}% | "
                f"{r['tflops']:.1f} | {r['schedule']} |")
        if compare:
            for who in PEERS:
                line += (f" {r[who + '_us']:.1f} | {r[who + '_speedup']:.2f}x |" if who + "_us" in r else " - | - |")
        lines.append(line)
    return lines


def summary(rows: List[Dict], ms: Sequence[int], compare: bool) -> List[str]:
    """Per M over the shapes: geomean speedup, geomean limit, the share of it reached, the least
    floor share; with ``compare``, each peer's geomean speedup where it ran."""
    head = "| M | mg geomean speedup over fp16 | geomean limit | of limit | min floor share |"
    sep = "|---|---|---|---|---|"
    if compare:
        head += "".join(f" {who} geomean speedup |" for who in PEERS)
        sep += "---|" * len(PEERS)
    lines = [head, sep]
    for m in ms:
        rs = [r for r in rows if r["m"] == m]
        if not rs:
            continue
        speedup, limit = geomean([r["speedup"] for r in rs]), geomean([r["limit"] for r in rs])
        line = (f"| {m} | {speedup:.2f}x | {limit:.2f}x | {100 * speedup / limit:.0f}% | "
                f"{100 * min(r['floor_share'] for r in rs):.0f}% |")
        if compare:
            for who in PEERS:
                got = [r[who + "_speedup"] for r in rs if who + "_speedup" in r]
                line += f" {geomean(got):.2f}x |" if got else " - |"
        lines.append(line)
    return lines


def notes(rows: List[Dict]) -> List[str]:
    """The footer: why a peer has no numbers (not installed, no kernel for this weight, failed) or
    disagreed with mg; one line, or none."""
    found = sorted({r[key] for r in rows for key in r if key.endswith("_error")})
    return ["unavailable or failed: " + "; ".join(found)] if found else []


def by_width(by_bits: Dict[int, List[Dict]], ms: Sequence[int], compare: bool) -> List[str]:
    """Geomean speedup over fp16 per weight width and M (with gemlite's where it ran)."""
    head = "| bits | " + " | ".join(f"M={m}" for m in ms) + " |"
    lines = [head, "|---|" + "---|" * len(ms)]
    for bits, rows in by_bits.items():
        cells = []
        for m in ms:
            rs = [r for r in rows if r["m"] == m]
            cell = f"{geomean([r['speedup'] for r in rs]):.2f}x"
            gl = [r["gemlite_speedup"] for r in rs if "gemlite_speedup" in r]
            if compare and gl:
                cell += f" (gemlite {geomean(gl):.2f}x)"
            cells.append(cell)
        lines.append(f"| {'7 (1:2 sparse)' if bits == 7 else bits} | " + " | ".join(cells) + " |")
    return lines


def plot(rows: List[Dict], ms: Sequence[int], path: str, title: str, compare: bool) -> Optional[str]:
    """Speedup over fp16 against M, one line per shape; returns why not, if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'mixed-gemm[bench]')"
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        ax.plot([r["m"] for r in rs], [r["speedup"] for r in rs], marker="o", label=f"{label} ({rs[0]['n']}x{rs[0]['k']})")
    for who, style in zip(PEERS if compare else (), ("--", ":", "-.")):
        got = [(m, geomean([r[who + "_speedup"] for r in rows if r["m"] == m and who + "_speedup" in r])) for m in ms]
        got = [(m, v) for m, v in got if not math.isnan(v)]
        if got:
            ax.plot(*zip(*got), color="black", linestyle=style, marker="x", label=f"{who} (geomean)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over torch fp16")
    ax.set_title(textwrap.fill(title, 100), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
