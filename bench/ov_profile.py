"""A copy of a profile whose dense sm90s entries name their in-flight twin (``_ov``: the next
k-tile's wgmmas issued before the previous batch is waited for) wherever the catalog has one, for
``bench/device/run.sh ov-profile profile-confirm`` on the GPU the profile is for: the confirm step
keeps only the twins that win there (the H200 took 23 of 77, 2026-11-28; docs/notes/serving-mainloop.md).

    python bench/ov_profile.py --out /tmp/h100.json [--profile profiles/h100.json] [--dtypes f16,bf16]

Prints how many entries it changed. No GPU needed.
"""
from __future__ import annotations

import argparse
import json

from mixed_gemm.kernels.sm90s.catalog import catalog_kernels
from mixed_gemm.kernels.sm90s.config import Sm90sConfig


def twin(schedule: str, dtype: str, bits: int):
    """``schedule`` (``family:schedule``) with ``_ov``, or None where it is not an sm90s schedule,
    is in flight already, or the catalog has no such kernel."""
    family, _, name = schedule.partition(":")
    if family != "sm90s":
        return None
    config = Sm90sConfig.from_schedule(name, dtype=dtype, bits=bits)
    if config.in_flight:
        return None
    try:
        ov = config.replace(in_flight=True)
    except ValueError:  # no double buffer, a phase offset or half issue: no twin
        return None
    return f"sm90s:{ov.schedule}" if ov.kernel in catalog_kernels() else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="profiles/h100.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="f16,bf16")
    a = ap.parse_args()
    dtypes = set(a.dtypes.split(","))
    data = json.load(open(a.profile))
    changed = 0
    for entry in data.get("entries", []):
        new = twin(entry["schedule"], entry["dtype"], entry["bits"]) if entry["dtype"] in dtypes else None
        if new:
            entry["schedule"] = new
            changed += 1
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"{changed} entries of {a.profile} on their in-flight twins -> {a.out}")


if __name__ == "__main__":
    main()
